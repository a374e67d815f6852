"""FedQHDPooled: the centralised (pooled-data) oracle of the online protocol, from
sufficient statistics only.

The FedQHD paper's oracle fits ridge FQI on the union of every client's data. With one
shared encoder that fit needs, per action ``a``, only ``G_a = sum_i Phi_{i,a}^T
Phi_{i,a}`` (once per round: the buffers change only when clients collect) and, per
sweep, ``b_a = sum_i Phi_{i,a}^T y_{i,a}(W)`` for the targets of the sweep's readout
``W``. Targets are a nonlinear function of ``W`` (a max over actions, a clip), so each
sweep needs one exchange; raw transitions never leave a client. One protocol round is
one Flower round:

1. ``train`` (Flower's round): the client acts with the global ``readout``, collects its
   episodes and replies ``gram`` (the packed per-action Gram of its whole buffer),
   ``action-counts`` and ``reward-range`` (its rewards' [min, max]), with
   ``num-transitions``, ``partition-id`` and ``train-return-last100``; it fits nothing.
2. ``aggregate_train``: the server sums the Grams in client-key order and factors each
   action's system once (:func:`fedqhd.gram.pooled_systems`), then runs ``sweeps``
   exchanges of message type ``train.pooled_sweep`` with the clients it pooled: each
   carries the sweep's ``readout`` and the pooled ``reward-range``; each reply carries
   ``phi-y`` (D, |A|). The summed ``phi-y`` gives the next readout
   (:func:`fedqhd.gram.pooled_solve`, proximal pull toward the round's first readout).
   The last one is the round's global readout, every client's policy next round.

The paper suite's ``oracle`` runs this strategy. A client whose sweep reply fails or is
refused is left out of the round (``pooled-dropped``) and the round's sweeps restart
from the first readout with the others' statistics: the readout is then pooled FQI on
the clients that answered. No client is screened by norm or weight (the statistics are
summed exactly, as in :class:`~fedqhd.strategies.FedQHDExact`): a client can move the
oracle arbitrarily.

Bytes per client and round: the Gram, ``|A| D (D + 1) / 2`` float64 (CartPole at D = 500:
2.0 MB; D = 1000 with 4 actions: 16 MB), then ``2 D |A|`` float64 per sweep.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedqhd.gram import pooled_solve, pooled_systems

from . import contract as C
from .base import FunctionSpaceStrategy, global_readout
from .screening import (
    ScreenedReplies,
    _check,
    decode_action_counts,
    decode_reward_range,
    describe,
)


@dataclass
class _Party:
    """One pooled client's statistics of the round (its Gram packed, unpacked per action
    when the systems are built: the server never holds every client's full Grams)."""

    node: int
    packed: np.ndarray  # (|A|, D(D+1)/2)
    counts: np.ndarray  # (|A|,)
    extremes: np.ndarray  # (2,)
    dim: int

    def __getitem__(self, action: int) -> np.ndarray:
        return C.unpack_upper(self.packed[action:action + 1], self.dim)[0]


class FedQHDPooled(FunctionSpaceStrategy):
    """Ridge FQI on the pooled buffers of all clients (shared encoder), by messages.

    Parameters
    ----------
    dim, n_actions : int
        The readout's shape (D, |A|).
    ridge, proximal : float
        The pooled fit's penalty toward zero, and its pull toward the round's first
        readout per pooled transition of the action (as each online client's own fit).
    sweeps : int
        FQI sweeps per round (message exchanges after the round's train messages).
    sweep_timeout : float
        Seconds each sweep exchange waits for its replies.
    weighting, fraction_train, min_train_nodes, min_available_nodes, **safeguards
        As in :class:`~fedqhd.strategies.base.FunctionSpaceStrategy`; ``weighting``
        only weights the round's reply metrics. The oracle pools every client:
        ``fraction_train`` 1 (the default) and ``aggregation`` ``"mean"``.
    """

    def __init__(self, dim: int, n_actions: int, ridge: float, proximal: float, sweeps: int,
                 sweep_timeout: float = 600.0, weighting: str = "transitions",
                 fraction_train: float = 1.0, fraction_evaluate: float = 0.0,
                 min_train_nodes: int = 2, min_evaluate_nodes: int = 2,
                 min_available_nodes: int = 2, **safeguards: Any) -> None:
        if safeguards.get("aggregation", "mean") != "mean":
            raise ValueError("FedQHDPooled sums sufficient statistics exactly: aggregation "
                             f"must be 'mean', got {safeguards['aggregation']!r}")
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        if int(sweeps) < 1:
            raise ValueError(f"sweeps must be >= 1, got {sweeps}")
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)
        self.dim, self.n_actions = int(dim), int(n_actions)
        self.ridge, self.proximal, self.sweeps = float(ridge), float(proximal), int(sweeps)
        self.sweep_timeout = float(sweep_timeout)
        self._grid: Grid | None = None
        self._readout: np.ndarray | None = None

    def initial_arrays(self) -> ArrayRecord:
        """The global record of round 1: a zero readout (the bench's first policy)."""
        return C.to_array_record({C.READOUT: np.zeros((self.dim, self.n_actions))})

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Pooled-data oracle: %d sweeps per round, ridge %s, proximal %s",
            self.sweeps, self.ridge, self.proximal)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        readout = global_readout(arrays, (self.dim, self.n_actions), "FedQHDPooled")
        self._grid, self._readout = grid, readout  # the sweeps of aggregate_train need both
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        screened, parties = self._screen_statistics(server_round, replies)
        self._record_clients(screened, server_round)
        metrics = screened.round_metrics()
        self.last_client_metrics = screened.per_node_metrics()
        # summed in partition order, as the bench sums its clients
        accepted = set(screened.nodes)
        pool = sorted((p for p in parties if p.node in accepted),
                      key=lambda p: self.identities.order(p.node))
        readout, exchanges, dropped = (self._pooled_sweeps(server_round, pool)
                                       if pool and self._readout is not None else (None, 0, 0))
        metrics[C.CLIENTS_AVERAGED] = len(pool) - dropped if readout is not None else 0
        metrics[C.POOLED_SWEEPS] = exchanges
        metrics[C.POOLED_DROPPED] = dropped
        self.last_train_metrics = metrics
        if readout is None:
            return None, metrics
        return C.to_array_record({C.READOUT: readout}), metrics

    # ------------------------------------------------------------------ train replies
    def _screen_statistics(self, server_round: int, replies: Iterable[Message]
                           ) -> tuple[ScreenedReplies, list[_Party]]:
        label = f"FedQHDPooled train round {server_round}"
        sampled, self._sampled["train"] = self._sampled["train"], None
        screened = ScreenedReplies(label=label, sampled=sampled)
        parties: list[_Party] = []
        packed_shape = (self.n_actions, self.dim * (self.dim + 1) // 2)
        for msg in replies:
            if screened.receive(msg, self.identities.labels):
                continue
            node = msg.metadata.src_node_id
            reason, gram, metrics = _check(msg, C.GRAM, packed_shape)
            extremes: np.ndarray | None = None
            counts: np.ndarray | None = None
            if reason is None:
                record = msg.content[C.ARRAYS]
                assert isinstance(record, ArrayRecord)  # _check read the Gram from it
                reason, extremes = decode_reward_range(record)
                if reason is None:
                    reason, counts = decode_action_counts(record, self.n_actions)
            if reason is not None or gram is None or extremes is None or counts is None:
                screened.rejected += 1
                log(WARNING, "%s: reply of %s left out: %s", label,
                    describe(node, metrics, self.identities.labels), reason)
                continue
            parties.append(_Party(node, gram, counts, extremes, self.dim))
            screened.nodes.append(node)
            screened.metrics.append(metrics)
            size = metrics.get(C.NUM_TRANSITIONS, metrics.get(C.NUM_EXAMPLES, 1.0))
            screened.weights.append(1.0 if self.weighting == "uniform" else float(size))
        return screened, parties

    # ------------------------------------------------------------------ sweeps
    def _pooled_sweeps(self, server_round: int, pool: list[_Party]
                       ) -> tuple[np.ndarray | None, int, int]:
        """(readout or None, sweep exchanges run, clients dropped): ``sweeps`` pooled
        sweeps from the round's first readout; a client whose sweep reply fails is left
        out and the sweeps restart without it (None: no client left)."""
        assert self._readout is not None and self._grid is not None
        prior, exchanges, dropped = self._readout, 0, 0
        while pool:
            reward_range = np.array([min(p.extremes[0] for p in pool),
                                     max(p.extremes[1] for p in pool)])
            systems = pooled_systems(pool, np.sum([p.counts for p in pool], axis=0), self.ridge,
                                     self.proximal)
            readout, failed = prior, set[int]()
            for sweep in range(self.sweeps):
                exchanges += 1
                rhs, failed = self._sweep(server_round, sweep, pool, readout, reward_range)
                if failed:
                    break
                readout = pooled_solve(systems, rhs, prior)
            if not failed:
                return readout, exchanges, dropped
            log(WARNING, "FedQHDPooled round %d: %d client(s) left out of the pooled fit "
                "(sweep reply missing, failed or refused); its sweeps restart with %d",
                server_round, len(failed), len(pool) - len(failed))
            pool = [p for p in pool if p.node not in failed]
            dropped += len(failed)
        return None, exchanges, dropped

    def _sweep(self, server_round: int, sweep: int, pool: list[_Party], readout: np.ndarray,
               reward_range: np.ndarray) -> tuple[np.ndarray, set[int]]:
        """One exchange: ``(summed phi-y, nodes without a usable reply)``."""
        assert self._grid is not None
        content = RecordDict({
            C.ARRAYS: C.to_array_record({C.READOUT: readout, C.REWARD_RANGE: reward_range}),
            C.CONFIG: ConfigRecord({C.SERVER_ROUND: server_round, "sweep": sweep})})
        messages = [Message(content=content, message_type=C.POOLED_SWEEP, dst_node_id=p.node)
                    for p in pool]
        label = f"FedQHDPooled round {server_round} sweep {sweep + 1}"
        rhs_by_node: dict[int, np.ndarray] = {}
        for msg in self._grid.send_and_receive(messages, timeout=self.sweep_timeout):
            node = msg.metadata.src_node_id
            if msg.has_error():
                log(WARNING, "%s: node %d replied with an error: %s", label, node,
                    msg.error.reason)
                continue
            reason, rhs, _ = _check(msg, C.PHI_Y, (self.dim, self.n_actions))
            if reason is not None or rhs is None:
                log(WARNING, "%s: reply of node %d left out: %s", label, node, reason)
                continue
            rhs_by_node[node] = rhs
        failed = {p.node for p in pool if p.node not in rhs_by_node}
        total = np.zeros((self.dim, self.n_actions))
        if not failed:
            for p in pool:  # in client order, as the bench sums
                total += rhs_by_node[p.node]
        return total, failed
