"""Which node speaks for which client: a client key bound to a node at first contact.

A client is its ``partition-id`` reply metric where it sends one, else its node id.
The first node to claim a partition id owns it; a second node claiming it while the
owner is still connected, or a node that changes the key it replies under, is
refused. A binding is released when its owner has sent no accepted reply for
``stale_rounds`` rounds, or when the owner is no longer among the connected nodes
(a SuperNode restarted under a new node id then takes its partition back).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

ClientKey = tuple[str, int]


def client_key(node: int, metrics: dict[str, float], partition_key: str) -> ClientKey:
    """``("partition", pid)`` if the reply names its partition, else ``("node", node)``."""
    if partition_key in metrics:
        return ("partition", int(metrics[partition_key]))
    return ("node", int(node))


class IdentityRegistry:
    """Client keys bound to node ids.

    Parameters
    ----------
    stale_rounds : int
        Release a binding after this many rounds without an accepted reply from it
        (0: never).
    """

    def __init__(self, stale_rounds: int = 10) -> None:
        self.stale_rounds = int(stale_rounds)
        self.owner: dict[ClientKey, int] = {}
        self.key_of: dict[int, ClientKey] = {}
        self.last_seen: dict[ClientKey, int] = {}
        self.connected: set[int] | None = None

    def checkpoint_state(self) -> dict[str, Any]:
        """The bindings, for a run's checkpoint."""
        return {"owner": dict(self.owner), "key-of": dict(self.key_of),
                "last-seen": dict(self.last_seen),
                "connected": None if self.connected is None else sorted(self.connected)}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take the bindings of :meth:`checkpoint_state` (a resumed run)."""
        self.owner = dict(state["owner"])
        self.key_of = dict(state["key-of"])
        self.last_seen = dict(state["last-seen"])
        self.connected = None if state["connected"] is None else set(state["connected"])

    def set_connected(self, nodes: Iterable[int]) -> None:
        """The nodes connected now (from the Grid, when the round is configured)."""
        self.connected = set(nodes)

    def release(self, key: ClientKey) -> None:
        node = self.owner.pop(key, None)
        self.last_seen.pop(key, None)
        if node is not None and self.key_of.get(node) == key:
            del self.key_of[node]

    def claim(self, node: int, key: ClientKey, server_round: int) -> str | None:
        """Bind or confirm ``key`` for ``node``; the reason for a refusal, else ``None``."""
        previous = self.key_of.get(node)
        if previous is not None and previous != key:
            return (f"node {node} switched client identity from {previous[0]} {previous[1]} "
                    f"to {key[0]} {key[1]}")
        owner = self.owner.get(key)
        if owner is not None and owner != node:
            if self.connected is not None and owner not in self.connected:
                self.release(key)  # its owner left the federation: the key is free again
            else:
                return f"{key[0]} {key[1]} is bound to node {owner}, claimed by node {node}"
        self.owner[key] = node
        self.key_of[node] = key
        self.last_seen[key] = server_round
        return None

    def expire(self, server_round: int) -> list[ClientKey]:
        """Release and return the keys silent for more than ``stale_rounds`` rounds."""
        if self.stale_rounds <= 0:
            return []
        stale = [k for k, seen in self.last_seen.items()
                 if server_round - seen >= self.stale_rounds]
        for key in stale:
            self.release(key)
        return stale
