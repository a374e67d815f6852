"""A privacy screen around any fedqhd strategy, the way Flower adds DP by wrapping.

:class:`PrivacyScreen` refuses every reply that does not declare a private
release (metric ``private`` = 1), unless the run is marked non-private, and
keeps each client's latest privacy-ledger numbers by partition id for the run's
report. It spends no privacy itself: the clients' mechanisms do, and each
client's ledger is written only by them.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from . import contract as C
from .base import FunctionSpaceStrategy
from .screening import _metrics_or_none, describe


def declares_private(msg: Message) -> bool:
    """Whether a reply's metrics say its values come from a noisy release."""
    try:
        metrics = msg.content.get(C.METRICS) if not msg.has_error() else None
        return isinstance(metrics, MetricRecord) and metrics.get(C.PRIVATE) == 1
    except Exception:  # noqa: BLE001 - an unreadable reply declares nothing
        return False


class PrivacyScreen(Strategy):
    """Wrap a :class:`~fedqhd.strategies.base.FunctionSpaceStrategy` so that only private
    replies reach it.

    Parameters
    ----------
    strategy : FunctionSpaceStrategy
        The wrapped strategy (e.g. :class:`~fedqhd.strategies.FedQHDAnchor`).
    allow_non_private : bool
        Accept replies that do not declare ``private = 1`` (a run marked non-private).

    Attributes
    ----------
    ledgers : dict[int, dict]
        Latest ledger numbers (:data:`~fedqhd.strategies.contract.LEDGER_KEYS`) of every
        client that ever replied, by partition id, with the node id and round.
    """

    def __init__(self, strategy: FunctionSpaceStrategy, allow_non_private: bool = False) -> None:
        super().__init__()
        self.strategy = strategy
        self.allow_non_private = bool(allow_non_private)
        self.ledgers: dict[int, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"PrivacyScreen({self.strategy!r}, allow_non_private={self.allow_non_private})"

    @property
    def last_train_metrics(self) -> MetricRecord | None:
        return self.strategy.last_train_metrics

    @property
    def last_evaluate_metrics(self) -> MetricRecord | None:
        return self.strategy.last_evaluate_metrics

    @property
    def last_client_metrics(self) -> dict[int, dict[str, float]]:
        """The wrapped strategy's last train replies' metrics by node (private ones only)."""
        return self.strategy.last_client_metrics

    def checkpoint_state(self) -> dict[str, Any]:
        return {"strategy": self.strategy.checkpoint_state(), "ledgers": dict(self.ledgers)}

    def restore_state(self, state: dict[str, Any]) -> None:
        self.strategy.restore_state(state["strategy"])
        self.ledgers = {int(k): dict(v) for k, v in state["ledgers"].items()}

    def summary(self) -> None:
        log(INFO, "\t├──> Privacy screen: non-private replies %s",
            "accepted (run marked non-private)" if self.allow_non_private else "refused")
        self.strategy.summary()

    def _screen(self, replies: Iterable[Message], label: str) -> tuple[list[Message], int]:
        """Replies that may be used, and how many were refused as non-private."""
        kept, refused = [], 0
        for msg in replies:
            if msg.has_error() or self.allow_non_private or declares_private(msg):
                kept.append(msg)
                continue
            refused += 1
            log(WARNING, "PrivacyScreen %s: reply of %s refused: it does not declare a "
                "private release and the run is not marked non-private", label,
                describe(msg.metadata.src_node_id, _metrics_or_none(msg),
                         self.strategy.identities.labels))
        return kept, refused

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    @staticmethod
    def _count_refused(metrics: MetricRecord, refused: int, prefix: str = "") -> None:
        """Refused replies were received: count them there, not as timed out."""
        metrics[f"{prefix}{C.REPLIES_REFUSED_NON_PRIVATE}"] = refused
        received, timed_out = f"{prefix}{C.REPLIES_RECEIVED}", f"{prefix}{C.REPLIES_TIMED_OUT}"
        got, lost = metrics.get(received), metrics.get(timed_out)
        if isinstance(got, int) and isinstance(lost, int):
            metrics[received] = got + refused
            metrics[timed_out] = max(lost - refused, 0)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        kept, refused = self._screen(replies, f"train round {server_round}")
        record, metrics = self.strategy.aggregate_train(server_round, kept)
        metrics = metrics if metrics is not None else MetricRecord({})
        self._count_refused(metrics, refused)
        self.strategy.last_train_metrics = metrics
        for node, m in self.strategy.last_client_metrics.items():
            pid = int(m.get(C.PARTITION_ID, -1))
            entry: dict[str, Any] = {k: m[k] for k in C.LEDGER_KEYS if k in m}
            entry[C.PRIVATE] = bool(entry.get(C.PRIVATE, 0))
            if not entry[C.PRIVATE]:  # exact counts: no finite epsilon exists
                entry.update({C.EPSILON_CKS: None, C.EPSILON_EXACT: None, C.EPSILON: None})
            self.ledgers[pid] = {"node-id": node, "round": server_round, **entry}
        return record, metrics

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Metrics of private replies only (counts prefixed ``evaluate-`` by the strategy,
        as for every fedqhd strategy)."""
        kept, refused = self._screen(replies, f"evaluate round {server_round}")
        metrics = self.strategy.aggregate_evaluate(server_round, kept)
        if metrics is None:
            return None
        out = MetricRecord({k: v for k, v in metrics.items() if k != C.PRIVATE})
        self._count_refused(out, refused, C.EVALUATE_PREFIX)
        self.strategy.last_evaluate_metrics = out
        return out
