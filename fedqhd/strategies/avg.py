"""FedQHDAvg: weighted readout averaging for clients that share one encoder."""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from . import contract as C
from .base import FunctionSpaceStrategy

AGGREGATES = ("sampled", "latest")


class FedQHDAvg(FunctionSpaceStrategy):
    """Average client readouts ``W_global = sum_i pi_i W_i`` for a shared encoder.

    With one common feature map ``phi``, ``Q(s, .) = phi(s) W`` is linear in
    ``W``, so averaging readouts equals averaging the client Q-functions at
    every state: parameter and function-space averaging coincide.

    The server step is the same for both client updates of fedqhd's ClientApp:
    plain local fits (online runs) or one consensus-ADMM step
    (offline runs: clients reply ``w_i + v_i``, their local readout
    plus scaled dual, and the weighted mean of the replies is ADMM's consensus
    update, whose fixed point is ridge FQI on the pooled data).

    Parameters
    ----------
    weighting : {"transitions", "uniform"}
        ``pi_i`` proportional to the client's ``num-transitions`` (default) or equal.
    aggregate : {"sampled", "latest"}
        Average this round's accepted replies (default, FedAvg), or every client's
        latest accepted reply, a stale one for clients not sampled this round (a
        client is its node id, see :mod:`~fedqhd.strategies.identity`).
        Consensus ADMM needs ``"latest"`` under node sampling: its consensus is
        the mean over all clients, and averaging only the sampled ones' dual-
        shifted readouts biases it (measured in BENCHMARKS.md). Equal to
        ``"sampled"`` when every node replies every round.
    readout_shape : tuple of int or None
        Shape every reply's readout must have; ``None`` (default): the shape of the
        global readout that :meth:`configure_train` sends.
    array_key : str
        The key of the averaged array, both ways (default ``"readout"``; FedAvg-DQN
        averages its flattened MLP under ``"network"``: plain FedAvg of parameters).
    fraction_train, fraction_evaluate : float
        Fractions of connected nodes sampled for training / federated evaluation
        (``fraction_evaluate`` 0 by default, as in every fedqhd strategy: no evaluation).
    min_train_nodes, min_evaluate_nodes, min_available_nodes : int
        As in Flower's ``FedAvg``.
    **safeguards
        ``aggregation``, ``trim_fraction``, ``clip_factor``, ``norm_bound_factor``,
        ``weight_cap_factor``, ``stale_rounds``, ``node_wait_timeout``: see
        :class:`~fedqhd.strategies.base.FunctionSpaceStrategy`. With
        ``aggregate="latest"`` a client's stored reply (the clipped one, if it was
        clipped) ages out after ``stale_rounds`` rounds without an accepted reply or
        when its node leaves. ``clients-averaged`` says how many clients the aggregate
        holds.

    Notes
    -----
    Message contract: the global ``ArrayRecord`` ``"arrays"`` holds ``"readout"``
    (D, |A|). A train reply must hold ``"arrays"`` with ``"readout"`` of the same
    shape and a ``MetricRecord`` ``"metrics"`` with ``"num-transitions"`` > 0.
    Replies with an error, another shape or non-finite values are left out and
    counted (``replies-failed``, ``replies-rejected``) in the round's metrics.
    """

    def __init__(self, weighting: str = "transitions", fraction_train: float = 1.0,
                 fraction_evaluate: float = 0.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2,
                 aggregate: str = "sampled",
                 readout_shape: tuple[int, ...] | None = None, array_key: str = C.READOUT,
                 **safeguards: Any) -> None:
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)
        self.aggregate = aggregate
        self.array_key = array_key
        self.readout_shape = None if readout_shape is None else tuple(readout_shape)
        #: node id -> (readout, weight) of its latest accepted reply (aggregate="latest")
        self._latest: dict[int, tuple[np.ndarray, float]] = {}
        #: after a resume: clients whose stored reply is sent with every train message until
        #: they reply (the memory an ADMM client lost with its process)
        self._owed: set[int] = set()

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Aggregate: %s replies", self.aggregate)

    def checkpoint_state(self) -> dict[str, Any]:
        return {**super().checkpoint_state(), "readout-shape": self.readout_shape,
                "latest": dict(self._latest)}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        shape = state["readout-shape"]
        self.readout_shape = None if shape is None else tuple(shape)
        self._latest = {int(node): (np.asarray(a), float(w))
                        for node, (a, w) in state["latest"].items()}
        self._owed = set(self._latest)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.array_key not in arrays:
            raise ValueError(f"FedQHDAvg needs the global '{self.array_key}' array in its "
                             f"ArrayRecord; got keys {list(arrays.keys())}")
        self.readout_shape = tuple(arrays[self.array_key].shape)
        messages = list(super().configure_train(server_round, arrays, config, grid))
        if self._owed:
            messages = [self._with_last_reply(msg, arrays) for msg in messages]
        return messages

    def _with_last_reply(self, msg: Message, arrays: ArrayRecord) -> Message:
        """``msg`` plus the stored reply of the client bound to its node, if it is owed one:
        after a resume ADMM clients get their memory back (their dual is their last reply
        minus the global readout)."""
        node = msg.metadata.dst_node_id
        if node not in self._owed or node not in self._latest:
            return msg
        record = C.to_array_record({self.array_key: arrays[self.array_key].numpy(),
                                    C.LAST_REPLY: self._latest[node][0]})
        content = RecordDict({C.ARRAYS: record, C.CONFIG: msg.content[C.CONFIG]})
        return Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        screened = self._screen("train", server_round, replies, self.array_key,
                                self.readout_shape)
        self._record_clients(screened, server_round)
        if self.aggregate == "latest":
            for node, array, weight in zip(screened.nodes, screened.arrays, screened.weights,
                                           strict=True):
                self._latest[node] = (array, weight)
                self._owed.discard(node)  # it replied: it holds its memory again
            for node in [n for n in self._latest if n not in self.identities.last_seen]:
                del self._latest[node]  # silent for stale_rounds rounds, or left: aged out
        metrics = screened.round_metrics()
        self.last_client_metrics = screened.per_node_metrics()
        if not screened.arrays:
            metrics[C.CLIENTS_AVERAGED] = 0
            self.last_train_metrics = metrics
            return None, metrics
        if self.aggregate == "sampled":
            arrays, weights = screened.arrays, screened.weights
        else:
            arrays, weights = (list(t) for t in zip(*self._latest.values(), strict=True))
        metrics[C.CLIENTS_AVERAGED] = len(arrays)
        if self.aggregate == "latest":
            log(INFO, "FedQHDAvg train round %d: %d clients averaged (%d replied this round, "
                "%d latest replies of earlier rounds)", server_round, len(arrays),
                len(screened.arrays), len(arrays) - len(screened.arrays))
        self.last_train_metrics = metrics
        return (C.to_array_record({self.array_key: self.safeguards.combine(arrays, weights)}),
                metrics)
