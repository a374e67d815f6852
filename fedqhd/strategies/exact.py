"""FedQHDExact: pooled-data ridge FQI from the clients' sufficient statistics.

With one shared encoder, a ridge FQI sweep on the pooled data needs only, per action,
``G_a = sum_i Phi_{i,a}^T Phi_{i,a}`` and ``b_a = sum_i Phi_{i,a}^T y_{i,a}``: the
server sums what the clients send and solves ``(G_a + ridge I) w_a = b_a`` itself, so
after k sweeps the global readout IS k sweeps of centralised ridge FQI on the pooled
shards (no averaging bias, no consensus iterations).

Protocol (array keys in :mod:`fedqhd.strategies.contract`), one sweep per round:

* server -> client: the global ``readout``; ``stats-request = [have, want]`` where
  ``have`` is how many of this client's transitions the server's Gram already holds and
  ``want`` says whether ``phi-y`` is wanted; ``q-range`` (the pooled value range) once
  known.
* client -> server: ``gram`` (packed upper triangles, only when the client has
  transitions the server's Gram lacks: all of them in round 1, later only the Gram of
  the new ones), ``phi-y`` = ``Phi_a^T y_a`` for the targets of the global readout kept
  in ``q-range``, ``action-counts``, ``reward-range`` = its rewards' [min, max], and
  metrics ``num-transitions`` and ``gram-through``.

The value range is agreed through the server: every reply carries the client's reward
[min, max]; the server sends back :func:`~fedqhd.gram.pooled_value_range` of all of
them, the range pooled FQI uses (``value_range="data"`` on the pooled rewards). In round
1 the range is not known yet; it is not needed there when the first readout is zero (the
targets are then the rewards, inside every range that contains them), so that round
already sweeps. A non-zero first readout makes round 1 a statistics-only round (the
readout comes back unchanged) and sweeps start in round 2.

Exactness needs every client's ``phi-y`` every round. A client that fails a round keeps
its Gram in the system and its previous ``phi-y`` is used (counted in ``exact-stale``):
the sweep is then no longer exactly pooled FQI. Clients are keyed by node id.
"""

from __future__ import annotations

from collections.abc import Iterable
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from fedqhd.gram import GramSystems, pooled_value_range

from . import contract as C
from .base import FunctionSpaceStrategy, global_readout
from .screening import (
    ScreenedReplies,
    _check,
    decode_array,
    decode_reward_range,
    describe,
    reply_size,
)


class FedQHDExact(FunctionSpaceStrategy):
    """Exact pooled ridge FQI from client sufficient statistics (shared encoder).

    Parameters
    ----------
    dim, n_actions : int
        The readout's shape (D, |A|).
    gamma : float
        Discount (for the pooled value range).
    ridge : float
        The pooled fit's penalty toward zero (as in ``RidgeFQI`` on the pooled data).
    proximal : float
        Penalty toward the first global readout (0 default: plain pooled FQI).
    bounded : bool
        Keep targets in the pooled value range (default), as ``RidgeFQI`` does with
        ``value_range="data"``; ``False``: unbounded targets.
    weighting, fraction_train, fraction_evaluate, min_*_nodes
        As in :class:`FedQHDAvg`; ``weighting`` only weights the round's reply metrics.
        Exactness needs ``fraction_train = 1``.
    """

    def __init__(self, dim: int, n_actions: int, gamma: float, ridge: float,
                 proximal: float = 0.0, bounded: bool = True,
                 weighting: str = "transitions", fraction_train: float = 1.0,
                 fraction_evaluate: float = 0.0, min_train_nodes: int = 2,
                 min_evaluate_nodes: int = 2, min_available_nodes: int = 2,
                 **safeguards: Any) -> None:
        if safeguards.get("aggregation", "mean") != "mean":
            raise ValueError("FedQHDExact sums sufficient statistics exactly: aggregation "
                             f"must be 'mean', got {safeguards['aggregation']!r}")
        super().__init__(weighting, fraction_train, fraction_evaluate, min_train_nodes,
                         min_evaluate_nodes, min_available_nodes, **safeguards)
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        self.dim, self.n_actions = int(dim), int(n_actions)
        self.gamma, self.ridge, self.proximal = float(gamma), float(ridge), float(proximal)
        self.bounded = bool(bounded)
        self._grams = np.zeros((self.n_actions, self.dim, self.dim))
        self._have: dict[int, int] = {}               # node -> transitions in _grams
        self._rhs: dict[int, np.ndarray] = {}         # node -> its latest phi-y
        self._extremes: dict[int, np.ndarray] = {}    # node -> its reward [min, max]
        self._systems: GramSystems | None = None
        self._prior: np.ndarray | None = None
        self._readout: np.ndarray | None = None
        self._want_rhs = False
        #: after a resume: the nodes whose Grams the checkpoint holds (checked once)
        self._resumed_nodes: set[int] | None = None

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Exact pooled ridge FQI: ridge %s, proximal %s, bounded %s",
            self.ridge, self.proximal, self.bounded)

    def checkpoint_state(self) -> dict[str, Any]:
        return {**super().checkpoint_state(), "grams": self._grams, "have": dict(self._have),
                "rhs": dict(self._rhs), "extremes": dict(self._extremes),
                "prior": self._prior, "readout": self._readout, "want-rhs": self._want_rhs}

    def restore_state(self, state: dict[str, Any]) -> None:
        super().restore_state(state)
        grams = np.asarray(state["grams"], dtype=np.float64)
        if grams.shape != self._grams.shape:
            raise ValueError(f"checkpointed Grams have shape {grams.shape}, expected "
                             f"{self._grams.shape}")
        self._grams = grams.copy()
        self._have = {int(k): int(v) for k, v in state["have"].items()}
        self._rhs = {int(k): np.asarray(v) for k, v in state["rhs"].items()}
        self._extremes = {int(k): np.asarray(v) for k, v in state["extremes"].items()}
        self._prior, self._readout = state["prior"], state["readout"]
        self._want_rhs = bool(state["want-rhs"])
        self._systems = None  # refactored from the Grams when next needed
        self._resumed_nodes = set(self._have)

    @property
    def q_range(self) -> tuple[float, float] | None:
        """The pooled value range (None before any reply, or when unbounded)."""
        if not self.bounded or not self._extremes:
            return None
        return pooled_value_range(list(self._extremes.values()), self.gamma)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        readout = global_readout(arrays, (self.dim, self.n_actions), "FedQHDExact")
        if self._resumed_nodes is not None:
            self._check_resumed_nodes(set(grid.get_node_ids()))
        if self._prior is None:
            self._prior = readout.copy()
        self._readout = readout
        q_range = self.q_range
        # without a range the targets are exact only when the readout is zero (y = r)
        self._want_rhs = not self.bounded or q_range is not None or not readout.any()
        template = super().configure_train(server_round, arrays, config, grid)
        messages = []
        for msg in template:
            node = msg.metadata.dst_node_id
            out = {C.READOUT: readout,
                   C.STATS_REQUEST: np.array([self._have.get(node, 0), int(self._want_rhs)],
                                             dtype=np.float64)}
            if q_range is not None:
                out[C.Q_RANGE] = np.array(q_range)
            content = RecordDict({C.ARRAYS: C.to_array_record(out),
                                  C.CONFIG: msg.content[C.CONFIG]})
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        label = f"FedQHDExact round {server_round}"
        sampled, self._sampled["train"] = self._sampled["train"], None
        screened = ScreenedReplies(label=label, sampled=sampled)
        known = self.identities.key_of
        replied: set[int] = set()
        for msg in replies:
            if screened.receive(msg, known):
                continue
            node = msg.metadata.src_node_id
            reason, rhs, metrics = _check(msg, C.PHI_Y if self._want_rhs else None,
                                          (self.dim, self.n_actions))
            gram, extremes = None, None
            if reason is None:
                reason, gram, extremes = self._check_statistics(msg, node, metrics)
            if reason is not None:
                screened.rejected += 1
                log(WARNING, "%s: reply of %s left out: %s", label,
                    describe(node, metrics, known), reason)
                continue
            if gram is not None:
                self._grams += C.unpack_upper(gram, self.dim)
                self._have[node] = int(metrics[C.GRAM_THROUGH])
                self._systems = None
            assert extremes is not None  # checked above
            self._extremes[node] = extremes
            if rhs is not None:
                self._rhs[node] = rhs
            replied.add(node)
            metrics.pop(C.GRAM_THROUGH, None)  # a count per client, not a round mean
            screened.metrics.append(metrics)
            screened.nodes.append(node)
            size = reply_size(metrics)
            assert size is not None  # _check refuses a reply without one
            screened.weights.append(1.0 if self.weighting == "uniform" else float(size[1]))
        log(INFO, "%s: %d replies aggregated, %d failed, %d rejected", label,
            len(screened.metrics), screened.failed, screened.rejected)
        metrics_out = screened.round_metrics()
        in_system = [node for node, n in self._have.items() if n > 0]
        metrics_out[C.EXACT_CLIENTS] = len(in_system)
        metrics_out[C.EXACT_STALE] = sum(node not in replied for node in in_system)
        self.last_train_metrics = metrics_out
        self.last_client_metrics = screened.per_node_metrics()
        if not screened.metrics or self._readout is None:
            return None, metrics_out
        if not self._want_rhs:  # a statistics-only round: the readout stays
            return C.to_array_record({C.READOUT: self._readout}), metrics_out
        if self._systems is None:
            self._systems = GramSystems(self._grams, self.ridge, self.proximal)
        rhs_total = sum((self._rhs[node] for node in in_system if node in self._rhs),
                        np.zeros((self.dim, self.n_actions)))
        readout = self._systems.solve(rhs_total, self._prior)
        return C.to_array_record({C.READOUT: readout}), metrics_out

    def _check_resumed_nodes(self, connected: set[int]) -> None:
        """Clients are keyed by node id: a resumed run whose nodes came back under other
        ids would add their Grams a second time, so it stops instead."""
        missing, self._resumed_nodes = (self._resumed_nodes or set()) - connected, None
        if missing:
            raise ValueError(f"FedQHDExact cannot continue: the checkpointed Grams belong to "
                             f"node(s) {sorted(missing)}, which are not connected (now: "
                             f"{sorted(connected)}); nodes that return under new ids would "
                             "be counted twice. Start the run again")

    def _check_statistics(self, msg: Message, node: int, metrics: dict[str, float]
                          ) -> tuple[str | None, np.ndarray | None, np.ndarray | None]:
        """(reason or None, packed Gram or None, reward extremes) of a reply."""
        record = msg.content.get(C.ARRAYS)
        reason, extremes = decode_reward_range(record)
        if reason is not None:
            return reason, None, None
        assert isinstance(record, ArrayRecord)  # decode_reward_range refuses anything else
        if C.GRAM not in record:
            if self._have.get(node, 0) == 0:
                return f"no '{C.GRAM}' from a client whose Gram the server lacks", None, None
            return None, None, extremes
        expected = (self.n_actions, self.dim * (self.dim + 1) // 2)
        reason, gram = decode_array(record[C.GRAM], expected)
        if reason is not None or gram is None:
            return f"'{C.GRAM}': {reason}", None, None
        if not np.all(np.isfinite(gram)):
            return f"'{C.GRAM}' holds non-finite values", None, None
        through = metrics.get(C.GRAM_THROUGH)
        if through is None or through <= self._have.get(node, 0):
            return (f"'{C.GRAM_THROUGH}' missing or not beyond the {self._have.get(node, 0)} "
                    f"transitions already held"), None, None
        return None, gram, extremes
