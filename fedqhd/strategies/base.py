"""What the fedqhd strategies share: sampling and messaging from Flower's FedAvg,
reply screening, weighting, and metric-only evaluation."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO

from flwr.app import Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp.strategy import FedAvg

from . import contract as C
from .screening import screen_replies

WEIGHTINGS = ("transitions", "uniform")


class FunctionSpaceStrategy(FedAvg):
    """Base of :class:`FedQHDAvg` and :class:`FedQHDAnchor` (not used directly)."""

    def __init__(
        self,
        weighting: str = "transitions",
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 2,
        min_evaluate_nodes: int = 2,
        min_available_nodes: int = 2,
    ) -> None:
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            weighted_by_key=C.NUM_TRANSITIONS,
            arrayrecord_key=C.ARRAYS,
            configrecord_key=C.CONFIG,
        )
        self.weighting = weighting
        #: the latest aggregated train / evaluate metrics, for per-round reporting
        self.last_train_metrics: MetricRecord | None = None
        self.last_evaluate_metrics: MetricRecord | None = None
        #: the latest accepted train replies' own metrics, by node id (per-client reports)
        self.last_client_metrics: dict[int, dict[str, float]] = {}

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Weighting of client replies: %s", self.weighting)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """Weighted mean of the clients' evaluation metrics, with screening counts."""
        screened = screen_replies(replies, None, None, self.weighting == "uniform",
                                  f"{type(self).__name__} evaluate round {server_round}")
        metrics = screened.round_metrics() if screened.metrics or screened.failed else None
        self.last_evaluate_metrics = metrics
        return metrics
