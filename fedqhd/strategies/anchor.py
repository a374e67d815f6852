"""FedQHDAnchor: anchor-set teacher compilation for clients with their own encoders."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.common.logger import log

from . import contract as C
from .base import FunctionSpaceStrategy
from .screening import describe


class FedQHDAnchor(FunctionSpaceStrategy):
    """Aggregate in function space on a fixed anchor set when encoders differ.

    Each client replies with its Q-values on the ``m`` anchor states
    (``Q_i(anchors) = X_i W_i``, shape (m, |A|)); the server forms the teacher
    ``T = sum_i pi_i Q_i(anchors)`` and sends it back with the anchors; each
    client compiles it into its own features with one ridge projection
    ``W_i = argmin ||X_i W - T||^2 + lam ||W||^2`` and learns on from there.

    Parameters
    ----------
    anchors : ndarray of shape (m, obs_dim)
        The anchor states, fixed for the whole run.
    n_values : int
        Values a client sends per anchor, the teacher's columns: ``|A|`` for Q-functions
        (one per action); a learner with other values says so (POOL: its H stage values).
    n_actions : int
        Keyword alias of ``n_values`` for Q-functions.
    weighting : {"transitions", "uniform"}
    **safeguards
        ``aggregation``, ``trim_fraction``, ``clip_factor``, ``norm_bound_factor``,
        ``weight_cap_factor``, ``stale_rounds``, ``node_wait_timeout``: see
        :class:`~fedqhd.strategies.base.FunctionSpaceStrategy`.
    fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes
        As in Flower's ``FedAvg``, but ``fraction_evaluate`` is 0 by default (no federated
        evaluation), as in every fedqhd strategy.

    Notes
    -----
    Message contract: the global ``ArrayRecord`` ``"arrays"`` holds ``"anchors"``
    (m, obs_dim) and, after the first round, ``"teacher"`` (m, |A|). A train reply
    holds ``"arrays"`` with ``"q-anchors"`` (m, |A|) and ``"metrics"`` with
    ``"num-transitions"`` > 0 and optionally ``"projection-residual"``.
    """

    def __init__(self, anchors: np.ndarray, n_values: int | None = None,
                 weighting: str = "transitions", fraction_train: float = 1.0,
                 fraction_evaluate: float = 0.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2, *,
                 n_actions: int | None = None, **safeguards: Any) -> None:
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)
        anchors = np.asarray(anchors, dtype=np.float64)
        if anchors.ndim != 2 or len(anchors) == 0 or not np.all(np.isfinite(anchors)):
            raise ValueError("anchors must be a non-empty finite 2-D array (m, obs_dim), "
                             f"got shape {anchors.shape}")
        if (n_values is None) == (n_actions is None):
            raise ValueError("give exactly one of n_values and n_actions (its alias)")
        n_values = int(n_values if n_values is not None else n_actions)  # type: ignore[arg-type]
        if n_values < 1:
            raise ValueError(f"n_values must be >= 1, got {n_values}")
        self.anchors = anchors
        self.n_values = n_values

    def initial_arrays(self) -> ArrayRecord:
        """The global record of round 1: anchors, no teacher yet."""
        return C.to_array_record({C.ANCHORS: self.anchors})

    def checkpoint_state(self) -> dict[str, Any]:
        return {**super().checkpoint_state(), "anchors": self.anchors}

    def restore_state(self, state: dict[str, Any]) -> None:
        """As the base, after checking that the run rebuilt the same anchors (an anchor
        file may have changed since)."""
        anchors = np.asarray(state["anchors"])
        if anchors.shape != self.anchors.shape or not np.array_equal(anchors, self.anchors):
            raise ValueError(f"the run's anchors {self.anchors.shape} differ from the "
                             f"checkpoint's {anchors.shape}: was the anchor file changed?")
        super().restore_state(state)

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Anchors: %d states of dimension %d", *self.anchors.shape)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        screened = self._screen("train", server_round, replies, C.Q_ANCHORS,
                                (len(self.anchors), self.n_values))
        self._record_clients(screened, server_round)
        for node, metrics in zip(screened.nodes, screened.metrics, strict=True):
            residual = metrics.get(C.PROJECTION_RESIDUAL)
            if residual is not None:
                log(INFO, "FedQHDAnchor round %d: %s projection residual %.4g",
                    server_round, describe(node, metrics), residual)
        self.last_train_metrics = screened.round_metrics()
        self.last_train_metrics[C.CLIENTS_AVERAGED] = len(screened.arrays)
        self.last_client_metrics = screened.per_node_metrics()
        if not screened.arrays:
            return None, self.last_train_metrics
        teacher = screened.combine()
        record = C.to_array_record({C.ANCHORS: self.anchors, C.TEACHER: teacher})
        return record, self.last_train_metrics
