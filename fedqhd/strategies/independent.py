"""FedQHDIndependent: the paper's independent-learners baseline, a federation that never
aggregates."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, Message, MetricRecord

from . import contract as C
from .base import FunctionSpaceStrategy


class FedQHDIndependent(FunctionSpaceStrategy):
    """Every client learns alone; the server only samples, screens and reports.

    Why a strategy at all: the baseline must run in the same app, under the same
    protocol, seeds and reply accounting as the federated methods, so that the table
    compares learning, not plumbing. Train messages carry the global record unchanged
    (empty: :meth:`initial_arrays`); a reply needs only its metrics (``num-transitions``,
    plus whatever the learner reports, e.g. ``train-return-last100``), aggregated by the
    strategy's rule as in every fedqhd strategy; arrays in a reply are ignored.
    ``aggregate_train`` returns no arrays, so the global record never changes.

    Parameters are those of :class:`~fedqhd.strategies.base.FunctionSpaceStrategy`
    (weighting, sampling, safeguards; ``fraction_evaluate`` 0 by default: set it > 0
    to have every client evaluate its own policy).
    """

    def __init__(self, weighting: str = "transitions", fraction_train: float = 1.0,
                 fraction_evaluate: float = 0.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2,
                 **safeguards: Any) -> None:
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)

    @staticmethod
    def initial_arrays() -> ArrayRecord:
        """The global record: empty, and it stays so."""
        return ArrayRecord()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        screened = self._screen("train", server_round, replies, None, None)
        self._record_clients(screened, server_round)
        self.last_train_metrics = screened.round_metrics()
        self.last_train_metrics[C.CLIENTS_AVERAGED] = 0
        self.last_client_metrics = screened.per_node_metrics()
        return None, self.last_train_metrics
