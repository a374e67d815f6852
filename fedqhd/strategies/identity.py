"""Which client a reply speaks for: the node the SuperLink authenticated, never what the
reply says about itself.

A reply's ``partition-id`` metric is the node's own claim; any node can claim any id, so
binding a partition to the first node that claims it let an attacker who replied first
take an honest node's place (and the honest node was refused every round). Here a client
IS its node id, which the SuperLink assigns (with SuperNode authentication: to a
registered public key, the same id after a restart). Everything the server keeps per
client (FedQHDAvg's latest replies, FedQHDExact's Grams) is keyed by it, so no node can
take another's place and no node loses its own to a race. A claimed partition id is
only a label for log lines; two nodes claiming one id are named in a warning, and both
stay what they are, two clients.

A client is forgotten when its node is no longer connected (a SuperNode restarted
without authentication comes back as a new node, a new client) or has sent no accepted
reply for ``stale_rounds`` rounds.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import WARNING
from typing import Any

from flwr.common.logger import log

#: a client is its node id
ClientKey = int


class IdentityRegistry:
    """The clients the server has heard from, keyed by node id.

    Parameters
    ----------
    stale_rounds : int
        Forget a client after this many rounds without an accepted reply (0: never).
    """

    def __init__(self, stale_rounds: int = 10) -> None:
        self.stale_rounds = int(stale_rounds)
        #: node id -> round of its latest accepted reply
        self.last_seen: dict[int, int] = {}
        #: node id -> the partition id it claims (a label for log lines)
        self.labels: dict[int, int] = {}
        self.connected: set[int] | None = None

    def order(self, node: int) -> tuple[int, int]:
        """A sort key putting nodes in the order of the partition ids they claim (a label,
        used only for the order in which replies are summed), then of node id."""
        return (self.labels.get(node, node), node)

    def checkpoint_state(self) -> dict[str, Any]:
        """The clients heard from, for a run's checkpoint."""
        return {"last-seen": dict(self.last_seen), "labels": dict(self.labels),
                "connected": None if self.connected is None else sorted(self.connected)}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take the clients of :meth:`checkpoint_state` (a resumed run)."""
        self.last_seen = {int(k): int(v) for k, v in state["last-seen"].items()}
        self.labels = {int(k): int(v) for k, v in state["labels"].items()}
        self.connected = None if state["connected"] is None else set(state["connected"])

    def set_connected(self, nodes: Iterable[int]) -> None:
        """The nodes connected now (from the Grid, when the round is configured)."""
        self.connected = set(nodes)

    def seen(self, node: int, claimed_partition: Any, server_round: int, label: str) -> None:
        """Record an accepted reply of ``node`` (claiming ``claimed_partition``, or None);
        a partition id another connected node claims too is named in a warning."""
        self.last_seen[node] = server_round
        if claimed_partition is None:
            return
        try:
            pid = int(claimed_partition)
        except (TypeError, ValueError, OverflowError):
            return
        others = [n for n, p in self.labels.items() if p == pid and n != node
                  and (self.connected is None or n in self.connected)]
        if others and self.labels.get(node) != pid:
            log(WARNING, "%s: node %d claims partition-id %d, which node(s) %s claimed "
                "before; a partition id is only a label: both are separate clients",
                label, node, pid, ", ".join(map(str, others)))
        self.labels[node] = pid

    def forget(self, node: int) -> None:
        self.last_seen.pop(node, None)
        self.labels.pop(node, None)

    def expire(self, server_round: int) -> list[int]:
        """Forget and return the nodes silent for ``stale_rounds`` rounds or no longer
        connected."""
        gone = [n for n in self.last_seen if self.connected is not None
                and n not in self.connected]
        if self.stale_rounds > 0:
            gone += [n for n, seen in self.last_seen.items()
                     if server_round - seen >= self.stale_rounds and n not in gone]
        for node in gone:
            self.forget(node)
        return gone
