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

Screening. Besides the checks every strategy makes (:mod:`.screening`), each reply's
statistics must be consistent with themselves and with what the server already holds of
its node (a client is its node id, :mod:`.identity`), checks that every honest reply
passes exactly:

* ``action-counts`` sum to ``gram-through``, never decrease, and ``num-transitions`` is
  ``gram-through`` (a client claims the size of its statistics, nothing else);
* that size is at most ``weight_cap_factor`` x the median size of the clients (a claim of
  1e12 transitions is refused, not capped: a Gram cannot be reweighted afterwards);
* a Gram's diagonal is >= 0 and, with ``max_feature_sq_norm`` (2 for fedqhd's encoders,
  ``||phi||^2 <= 2``), each action's trace at most that times its new transitions;
* ``phi-y`` obeys Cauchy-Schwarz against the node's own Gram diagonal and counts,
  ``|(Phi_a^T y_a)_j| <= sqrt(G_a[j, j] n_a) max|y|``, where targets are bounded: in the
  pooled value range (``bounded``), or the client's rewards while the readout is zero.
  Otherwise (unbounded targets, or no feature bound) a reply whose per-transition norm is
  above ``norm_bound_factor`` x the round's median is refused.

Exactness needs every client's ``phi-y`` every round. A client that fails a round keeps
its Gram in the system and its previous ``phi-y`` is used (counted in ``exact-stale``):
the sweep is then no longer exactly pooled FQI. Clients are keyed by node id.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
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
    decode_action_counts,
    decode_array,
    decode_reward_range,
    describe,
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
    max_feature_sq_norm : float, optional
        A bound on ``||phi(s)||^2`` every feature vector obeys (fedqhd's HD encoders: 2),
        checked against each Gram's trace; None: unknown (a relative check instead).
    weighting, fraction_train, fraction_evaluate, min_*_nodes
        As in :class:`FedQHDAvg`; ``weighting`` only weights the round's reply metrics.
        Exactness needs ``fraction_train = 1``.
    **safeguards
        ``norm_bound_factor`` and ``weight_cap_factor`` as above (0: that check off),
        ``stale_rounds``, ``node_wait_timeout``; ``aggregation`` must be ``"mean"``
        and clipping does not apply (statistics are summed, not averaged).
    """

    def __init__(self, dim: int, n_actions: int, gamma: float, ridge: float,
                 proximal: float = 0.0, bounded: bool = True,
                 max_feature_sq_norm: float | None = None,
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
        if max_feature_sq_norm is not None and not max_feature_sq_norm > 0:
            raise ValueError(f"max_feature_sq_norm must be > 0, got {max_feature_sq_norm}")
        self.max_feature_sq_norm = max_feature_sq_norm
        self._grams = np.zeros((self.n_actions, self.dim, self.dim))
        self._have: dict[int, int] = {}               # node -> transitions in _grams
        self._rhs: dict[int, np.ndarray] = {}         # node -> its latest phi-y
        self._extremes: dict[int, np.ndarray] = {}    # node -> its reward [min, max]
        self._diag: dict[int, np.ndarray] = {}        # node -> its Gram diagonals (A, D)
        self._counts: dict[int, np.ndarray] = {}      # node -> its action counts (A,)
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
                "diag": dict(self._diag), "counts": dict(self._counts),
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
        self._diag = {int(k): np.asarray(v) for k, v in state["diag"].items()}
        self._counts = {int(k): np.asarray(v) for k, v in state["counts"].items()}
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
        screened = ScreenedReplies(label=label, sampled=sampled, safeguards=self.safeguards)
        candidates: list[_Statistics] = []
        for msg in replies:
            if screened.receive(msg, self.identities.labels):
                continue
            node = msg.metadata.src_node_id
            reason, rhs, metrics = _check(msg, C.PHI_Y if self._want_rhs else None,
                                          (self.dim, self.n_actions))
            stats = None
            if reason is None:
                reason, stats = self._decode_statistics(msg, node, metrics, rhs)
            if reason is not None or stats is None:
                self._refuse(screened, node, metrics, reason)
                continue
            candidates.append(stats)
        for stats, reason in zip(candidates, self._screen_statistics(candidates),
                                 strict=True):
            if reason is not None:
                self._refuse(screened, stats.node, stats.metrics, reason)
                screened.norm_refused += 1
                continue
            self._accept(stats)
            screened.metrics.append(stats.metrics)
            screened.nodes.append(stats.node)
            screened.weights.append(1.0 if self.weighting == "uniform" else stats.through)
        log(INFO, "%s: %d replies aggregated, %d failed, %d rejected", label,
            len(screened.metrics), screened.failed, screened.rejected)
        self._record_clients(screened, server_round)
        metrics_out = screened.round_metrics()
        in_system = [node for node, n in self._have.items() if n > 0]
        metrics_out[C.EXACT_CLIENTS] = len(in_system)
        metrics_out[C.EXACT_STALE] = sum(node not in screened.nodes for node in in_system)
        self.last_train_metrics = metrics_out
        self.last_client_metrics = screened.per_node_metrics()
        if not screened.metrics or self._readout is None:
            return None, metrics_out
        if not self._want_rhs:  # a statistics-only round: the readout stays
            return C.to_array_record({C.READOUT: self._readout}), metrics_out
        if self._systems is None:
            self._systems = self._make_systems()
        rhs_total = sum((self._rhs[node] for node in in_system if node in self._rhs),
                        np.zeros((self.dim, self.n_actions)))
        readout = self._systems.solve(rhs_total, self._prior)
        return C.to_array_record({C.READOUT: readout}), metrics_out

    def _make_systems(self) -> GramSystems:
        """The factored per-action systems of the summed Grams."""
        return GramSystems(self._grams, self.ridge, self.proximal)

    def _refuse(self, screened: ScreenedReplies, node: int, metrics: Any,
                reason: str | None) -> None:
        screened.rejected += 1
        log(WARNING, "%s: reply of %s left out: %s", screened.label,
            describe(node, metrics, self.identities.labels), reason)

    def _accept(self, stats: _Statistics) -> None:
        node = stats.node
        if stats.gram is not None:
            self._grams += C.unpack_upper(stats.gram, self.dim)
            self._have[node] = int(stats.through)
            self._diag[node] = stats.diag
            self._counts[node] = stats.counts
            self._systems = None
        self._extremes[node] = stats.extremes
        if stats.rhs is not None:
            self._rhs[node] = stats.rhs
        stats.metrics.pop(C.GRAM_THROUGH, None)  # a count per client, not a round mean

    def _screen_statistics(self, candidates: list[_Statistics]) -> list[str | None]:
        """The claim cap and the norm checks over the round's decoded replies; the reason
        each is refused, or None."""
        guards = self.safeguards
        sizes = {node: float(n) for node, n in self._have.items() if n > 0}
        sizes.update({s.node: s.through for s in candidates})
        cap = (guards.weight_cap_factor * float(np.median(list(sizes.values())))
               if guards.weight_cap_factor and len(sizes) >= 2 else math.inf)
        relative: dict[str, list[float]] = {"trace": [], "rhs": []}
        for s in candidates:
            if s.gram is not None and self.max_feature_sq_norm is None:
                relative["trace"].append(s.trace_per_transition)
            if s.rhs is not None and self._target_bound(s) is None:
                relative["rhs"].append(float(np.linalg.norm(s.rhs)) / s.through)
        bounds = {key: guards.norm_bound_factor * float(np.median(values))
                  for key, values in relative.items()
                  if guards.norm_bound_factor and len(values) >= 2}
        reasons: list[str | None] = []
        for s in candidates:
            reason = None
            if s.through > cap:
                reason = (f"claims {s.through:.4g} transitions, above {cap:.4g} "
                          f"({guards.weight_cap_factor:g} x the clients' median)")
            elif s.gram is not None and self.max_feature_sq_norm is not None:
                limit = self.max_feature_sq_norm * s.new_counts
                if np.any(s.traces > limit * (1 + 1e-6) + 1e-9):
                    reason = (f"a Gram trace above {self.max_feature_sq_norm:g} x its new "
                              "transitions (max_feature_sq_norm)")
            elif s.gram is not None and "trace" in bounds and \
                    s.trace_per_transition > bounds["trace"]:
                reason = (f"Gram trace per transition {s.trace_per_transition:.4g} above "
                          f"{bounds['trace']:.4g} ({guards.norm_bound_factor:g} x the median)")
            if reason is None and s.rhs is not None:
                reason = self._check_rhs(s, bounds.get("rhs"))
            reasons.append(reason)
        return reasons

    def _check_rhs(self, s: _Statistics, bound: float | None) -> str | None:
        """Cauchy-Schwarz where targets are bounded, else the relative ``bound``."""
        assert s.rhs is not None
        y_max = self._target_bound(s)
        if y_max is not None:
            limit = np.sqrt(np.maximum(s.diag, 0.0) * s.counts[:, None]).T * y_max
            if np.any(np.abs(s.rhs) > limit * (1 + 1e-6) + 1e-9):
                return ("'phi-y' above its Cauchy-Schwarz bound sqrt(G_jj n_a) max|y|: "
                        "inconsistent with the client's own Gram and counts")
        elif bound is not None and float(np.linalg.norm(s.rhs)) / s.through > bound:
            return (f"'phi-y' per transition above {bound:.4g} "
                    f"({self.safeguards.norm_bound_factor:g} x the median)")
        return None

    def _target_bound(self, s: _Statistics) -> float | None:
        """max |y| of every honest target of ``s``'s client this round, where known: its
        rewards while the readout is zero (y = r), else the pooled value range (bounded
        targets); None for unbounded targets."""
        if self._readout is not None and not self._readout.any():
            return float(np.abs(s.extremes).max())
        q_range = self.q_range
        if self.bounded and q_range is not None:
            return float(max(abs(q_range[0]), abs(q_range[1])))
        return None

    def _check_resumed_nodes(self, connected: set[int]) -> None:
        """Clients are keyed by node id: a resumed run whose nodes came back under other
        ids would add their Grams a second time, so it stops instead."""
        missing, self._resumed_nodes = (self._resumed_nodes or set()) - connected, None
        if missing:
            raise ValueError(f"FedQHDExact cannot continue: the checkpointed Grams belong to "
                             f"node(s) {sorted(missing)}, which are not connected (now: "
                             f"{sorted(connected)}); nodes that return under new ids would "
                             "be counted twice. Start the run again")

    def _decode_statistics(self, msg: Message, node: int, metrics: dict[str, float],
                           rhs: np.ndarray | None) -> tuple[str | None, _Statistics | None]:
        """(reason, None) or (None, the reply's statistics), checked against themselves
        and what the server holds of ``node``."""
        record = msg.content.get(C.ARRAYS)
        reason, extremes = decode_reward_range(record)
        if reason is not None or extremes is None:
            return reason, None
        assert isinstance(record, ArrayRecord)  # decode_reward_range refuses anything else
        reason, counts = decode_action_counts(record, self.n_actions)
        if reason is not None or counts is None:
            return reason, None
        have = self._have.get(node, 0)
        # without a Gram the statistics are the ``have`` rows the server holds
        through = metrics.get(C.GRAM_THROUGH, None if C.GRAM in record else have)
        if through is None or through < have or (C.GRAM in record) != (through > have):
            return (f"'{C.GRAM_THROUGH}' missing, below the {have} transitions already held, "
                    f"or inconsistent with the '{C.GRAM}' sent"), None
        if abs(float(counts.sum()) - through) > 0.5:
            return (f"'{C.ACTION_COUNTS}' sum to {counts.sum():.6g}, not "
                    f"'{C.GRAM_THROUGH}' {through:.6g}"), None
        previous = self._counts.get(node, np.zeros(self.n_actions))
        if np.any(counts < previous):
            return f"'{C.ACTION_COUNTS}' fell below the counts the server holds", None
        claim = metrics.get(C.NUM_TRANSITIONS, metrics.get(C.NUM_EXAMPLES))
        if claim != through:
            return (f"claims {claim!r} transitions, but its statistics hold {through:.6g} "
                    f"('{C.GRAM_THROUGH}')"), None
        stats = _Statistics(node, metrics, float(through), extremes, counts, rhs,
                            diag=self._diag.get(node, np.zeros((self.n_actions, self.dim))),
                            new_counts=counts - previous)
        if C.GRAM not in record:
            return None, stats
        expected = (self.n_actions, self.dim * (self.dim + 1) // 2)
        reason, gram = decode_array(record[C.GRAM], expected)
        if reason is not None or gram is None:
            return f"'{C.GRAM}': {reason}", None
        if not np.all(np.isfinite(gram)):
            return f"'{C.GRAM}' holds non-finite values", None
        diag = gram[:, _diagonal_positions(self.dim)]
        if np.any(diag < 0):
            return f"'{C.GRAM}' has a negative diagonal entry (no Gram has)", None
        stats.gram, stats.diag = gram, stats.diag + diag
        stats.traces = diag.sum(axis=1)
        return None, stats


def _diagonal_positions(dim: int) -> np.ndarray:
    """Where :func:`~fedqhd.gram.pack_upper` puts the diagonal of a (D, D) matrix."""
    i = np.arange(dim)
    return i * dim - i * (i - 1) // 2


@dataclass
class _Statistics:
    """One decoded FedQHDExact reply: its statistics and what they are checked by."""

    node: int
    metrics: dict[str, float]
    through: float
    extremes: np.ndarray
    counts: np.ndarray
    rhs: np.ndarray | None
    #: the node's Gram diagonals (A, D) with this reply's added
    diag: np.ndarray
    #: transitions per action this reply's Gram adds
    new_counts: np.ndarray
    gram: np.ndarray | None = None
    traces: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def trace_per_transition(self) -> float:
        return float(self.traces.sum()) / max(float(self.new_counts.sum()), 1.0)
