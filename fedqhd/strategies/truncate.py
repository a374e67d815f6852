"""FedQHDTruncate: the paper's truncate-and-average baseline for readouts of different
shapes (heterogeneous encoders)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from . import contract as C
from .base import FunctionSpaceStrategy


def truncated_mean(readouts: Sequence[np.ndarray], weights: Sequence[float] | np.ndarray
                   ) -> np.ndarray:
    """The weighted mean of the first ``d = min_i D_i`` rows of readouts of different
    ``D_i`` (weights as given, already normalised): the head every client of the paper's
    truncate-and-average continues from (:func:`with_head`)."""
    if len(readouts) != len(weights) or not readouts:
        raise ValueError("need one weight per readout and at least one readout")
    if len({r.shape[1] for r in readouts}) != 1:
        raise ValueError("readouts must have the same number of actions")
    d = min(r.shape[0] for r in readouts)
    return np.asarray(sum(w * r[:d] for w, r in zip(weights, readouts, strict=True)),
                      dtype=np.float64)


def with_head(readout: np.ndarray, head: np.ndarray) -> np.ndarray:
    """``readout`` with its first ``k = min(len(head), len(readout))`` rows replaced by
    those of ``head`` (a copy): the rows beyond have no counterpart in other clients'
    features, and zeroing them would discard what the client learned there. A head
    longer than the readout (a round whose sampled clients all had more rows than this
    one) is truncated in turn."""
    if head.ndim != 2 or head.shape[1] != readout.shape[1]:
        raise ValueError(f"a head of shape {head.shape} does not fit a readout of shape "
                         f"{readout.shape}")
    merged = np.array(readout, dtype=np.float64)
    k = min(len(head), len(merged))
    merged[:k] = head[:k]
    return merged


class FedQHDTruncate(FunctionSpaceStrategy):
    """Average the first ``d = min_i D_i`` rows of readouts ``(D_i, |A|)``.

    The naive way to federate clients whose encoders differ: row ``j`` of two
    heterogeneous encoders is an unrelated random feature, so the average mixes
    unrelated coordinates. That is the point of the baseline (the FedQHD paper's
    "truncate FedAvg"); FedQHDAnchor is the method that works. With one shared
    encoder it is plain readout averaging.

    Each client replies its readout ``(D_i, |A|)`` (any ``D_i``, ``|A|`` fixed); the
    server sends back ``"readout-head"``, the weighted mean of the first ``d`` rows of
    the accepted replies (:func:`truncated_mean`, the in-process
    bench's own arithmetic: the accepted replies are summed in client-key order, so
    the result does not depend on the order replies arrive in); each client puts it
    in its first ``d`` rows and keeps its own readout in the rest
    (:func:`with_head`).

    Parameters
    ----------
    n_actions : int
        Columns every reply's readout must have.
    weighting, fraction_train, fraction_evaluate, min_train_nodes, min_evaluate_nodes,
    min_available_nodes, **safeguards
        As in :class:`~fedqhd.strategies.base.FunctionSpaceStrategy`. Replies are
        screened like every fedqhd strategy's (finite, a real float dtype, ``(D_i,
        |A|)``, norm bound, weight cap); ``aggregation`` other than ``mean`` combines the
        truncated rows by that rule.

    Notes
    -----
    Message contract: the global ``ArrayRecord`` ``"arrays"`` is empty in round 1 and
    then holds ``"readout-head"`` (d, |A|). A train reply holds ``"arrays"`` with
    ``"readout"`` (D_i, |A|) and ``"metrics"`` with ``"num-transitions"`` > 0.
    """

    def __init__(self, n_actions: int, weighting: str = "transitions",
                 fraction_train: float = 1.0, fraction_evaluate: float = 0.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, **safeguards: Any) -> None:
        if int(n_actions) < 1:
            raise ValueError(f"n_actions must be >= 1, got {n_actions}")
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)
        self.n_actions = int(n_actions)

    @staticmethod
    def initial_arrays() -> ArrayRecord:
        """The global record of round 1: no head yet (clients start from their own)."""
        return ArrayRecord()

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        screened = self._screen("train", server_round, replies, C.READOUT,
                                (None, self.n_actions))
        self._record_clients(screened, server_round)
        self.last_train_metrics = screened.round_metrics()
        self.last_train_metrics[C.CLIENTS_AVERAGED] = len(screened.arrays)
        self.last_client_metrics = screened.per_node_metrics()
        if not screened.arrays:
            return None, self.last_train_metrics
        # summed in partition order, as the bench sums its clients
        order = sorted(range(len(screened.nodes)),
                       key=lambda i: self.identities.order(screened.nodes[i]))
        arrays = [screened.arrays[i] for i in order]
        weights = np.array([screened.weights[i] for i in order], dtype=float)
        weights /= weights.sum()
        if self.aggregation == "mean":  # the in-process bench's arithmetic, bit for bit
            head = truncated_mean(arrays, weights)
        else:
            d = min(a.shape[0] for a in arrays)
            head = self.safeguards.combine([a[:d] for a in arrays], list(weights))
        return C.to_array_record({C.READOUT_HEAD: head}), self.last_train_metrics
