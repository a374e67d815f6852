"""The FQI learner, in the role of Flower's ``task.py``: ridge fitted Q-iteration on a
client's private shard with HD features, and everything both apps need about it.

* :class:`FQILearner` -- one client's encoded shard and readout (no Flower): local
  sweeps pulled toward a global readout, one consensus-ADMM step, compilation of a
  teacher given on anchor states, Q-values on anchors, the greedy policy.
* The run's settings turned into objects: the shared or the client's own encoder,
  the local ridge and ADMM penalty, the node's learner (built once per process).
* :func:`greedy_return` -- THE evaluation of a greedy policy, with its episode seeds
  (server: :data:`~fedqhd.seeding.SERVER`; clients: their partition id).
* :data:`LEARNER` -- the registry entry: FedQHDAvg for a shared encoder (the server
  evaluates the global readout), FedQHDAnchor for heterogeneous encoders (each client
  evaluates its compiled policy in its own environment).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.common.logger import log

from fedqhd.anchors import anchor_digest, make_anchors
from fedqhd.config import FEATURE_DTYPES, RunConfig
from fedqhd.data import Shard, ShardLimits, client_shard
from fedqhd.data.partition import partition_settings
from fedqhd.encoders import (
    MAX_FEATURE_SQ_NORM,
    EncoderParams,
    HDEncoder,
    heterogeneous_encoder_params,
    shared_encoder_params,
)
from fedqhd.envs import ENV_IDS, batch_rollout_returns, get_spec, has_heuristic
from fedqhd.learners.base import (
    RETURN_CURVES,
    Arrays,
    Metrics,
    ServerPlan,
    env_problem,
    greedy_final_line,
    partition,
    reference_report,
    reply_counts_text,
)
from fedqhd.learners.cache import BoundedCache
from fedqhd.learners.fqi_private import PrivateReadout, private_readout, public_value_range
from fedqhd.memory import GIB, FitMemoryError, available_memory, fit_memory, format_bytes
from fedqhd.node_config import NodeSettings
from fedqhd.readout import (
    RidgeFQI,
    RidgeSystem,
    StreamingRidgeFQI,
    chunked_grams,
    distinct_state_count,
)
from fedqhd.seeding import SERVER, anchor_seed, evaluation_seed
from fedqhd.strategies import FedQHDAnchor, FedQHDAvg, FedQHDExact, PrivacyScreen
from fedqhd.strategies import contract as C

STATE_ADMM = "fedqhd-admm"  #: context.state ArrayRecord: the ADMM client's last reply
#: bytes a learner's in-memory features (one row per distinct state) may take before it fits
#: from streamed sufficient statistics instead
FEATURE_BUDGET = 1 << 30


class FQILearner:
    """Ridge fitted Q-iteration on one client's shard with the client's own encoder.

    Parameters
    ----------
    shard : Shard
        The client's private transitions (never leaves the learner).
    encoder : HDEncoder
        A fitted encoder; its dimension sets the readout's shape (D, |A|).
    n_actions : int
    gamma, ridge, proximal : float
        Discount, penalty toward zero, penalty toward the readout training starts from.
    compile_ridge : float or None
        Ridge penalty of the teacher compilation (default: ``ridge``).
    value_range : "data", (lo, hi) or None
        Where FQI keeps its Bellman targets (see :class:`~fedqhd.readout.RidgeFQI`):
        the range the shard's rewards allow, an explicit range, or no bound.
    streaming : bool or None
        Fit from chunked sufficient statistics (:class:`~fedqhd.readout.StreamingRidgeFQI`,
        memory O(|A| D^2 + chunk x D)) instead of in-memory features (O(n x D)). ``None``
        (default): stream when the feature table (one float64 row per distinct state,
        ``n`` + episodes rows, see :meth:`~fedqhd.readout.RidgeFQI.from_states`) would exceed
        ``feature_budget`` bytes, or the in-memory fit would exceed ``memory_cap``. Both
        give the same readouts (to rounding).
    feature_budget : int
        Bytes the in-memory features may take (default :data:`FEATURE_BUDGET`, 1 GiB).
    chunk_size : int
        Rows encoded at a time when streaming.
    memory_cap : int or None
        Bytes the fit may need (:func:`fedqhd.memory.fit_memory`); ``None`` (default): the
        memory available now (:func:`fedqhd.memory.available_memory`).
    feature_dtype : "float64" or "float32"
        The in-memory feature table's numbers (run-config ``feature-dtype``). ``"float32"``:
        half the bytes (twice the learners in ``learner-cache-mib``) and a 10 times cheaper
        encode, each feature rounded (about 5e-7 of its amplitude); the Grams, factors and
        products stay float64. Readouts then differ from float64's by about 1e-7
        relative (8e-8 after 5 rounds of 1000 clients; 1.3e-6 for one consensus step
        from a random readout; BENCHMARKS.md). The streamed fit ignores it (it keeps no
        features).

    Raises
    ------
    FitMemoryError
        Before anything is encoded, when the chosen fit would need more than
        ``memory_cap``; the message gives the estimate and what to change.
    """

    def __init__(self, shard: Shard, encoder: HDEncoder, n_actions: int, gamma: float = 0.99,
                 ridge: float = 1.0, proximal: float = 1.0,
                 compile_ridge: float | None = None,
                 value_range: str | tuple[float, float] | None = "data",
                 streaming: bool | None = None, feature_budget: int | None = None,
                 chunk_size: int = 4096, memory_cap: int | None = None,
                 feature_dtype: str = "float64") -> None:
        if feature_dtype not in FEATURE_DTYPES:
            raise ValueError(f"feature_dtype must be one of {FEATURE_DTYPES}, "
                             f"got {feature_dtype!r}")
        self.encoder = encoder
        self.n_actions = int(n_actions)
        self.compile_ridge = float(ridge if compile_ridge is None else compile_ridge)
        self.n_transitions = int(shard.n_transitions)
        self.shard = shard
        budget = FEATURE_BUDGET if feature_budget is None else int(feature_budget)
        cap = available_memory() if memory_cap is None else int(memory_cap)
        n, dim = self.n_transitions, encoder.hd_dim
        # each distinct state is encoded once (RidgeFQI.from_states): n + episodes rows
        states = distinct_state_count(shard.observations, shard.next_observations)
        dtype = np.dtype(feature_dtype)
        width = dtype.itemsize
        if streaming is None:
            streaming = (states * dim * width > budget
                         or (cap is not None
                             and fit_memory(n, dim, n_actions, False,
                                            obs_dim=shard.observations.shape[1],
                                            states=states, feature_bytes=width) > cap))
        _check_memory(n, dim, int(n_actions), streaming, chunk_size, shard.observations.shape[1],
                      cap, memory_cap is not None, states, width)
        self.fqi: RidgeFQI | StreamingRidgeFQI
        if streaming:
            self.fqi = StreamingRidgeFQI(encoder.encode, encoder.hd_dim, n_actions,
                                         gamma=gamma, ridge=ridge, proximal=proximal,
                                         value_range=value_range, chunk_size=chunk_size)
            self.fqi.add(shard.observations, shard.actions, shard.rewards,
                         shard.next_observations, shard.terminated)
        else:
            self.fqi = RidgeFQI.from_states(
                lambda states: encoder.encode(states, dtype.type), shard.observations,
                shard.actions, shard.rewards, shard.next_observations, shard.terminated, n_actions,
                gamma=gamma, ridge=ridge, proximal=proximal, value_range=value_range)
        self._anchor_key: str | None = None
        self._anchor_system: RidgeSystem | None = None

    @property
    def readout(self) -> np.ndarray:
        return self.fqi.readout_

    @readout.setter
    def readout(self, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.float64)
        if value.shape != self.fqi.readout_.shape:
            raise ValueError(f"readout must have shape {self.fqi.readout_.shape}, "
                             f"got {value.shape}")
        self.fqi.readout_ = value

    def train(self, iterations: int, start: np.ndarray | None = None) -> dict[str, float]:
        """``iterations`` FQI sweeps from ``start`` (default: current readout), each pulled
        toward ``start`` by the proximal term so federated knowledge is not forgotten."""
        result = self.fqi.fit(iterations, init=start)
        return {"bellman-residual": result.bellman_residuals[-1]}

    def consensus_step(self, global_readout: np.ndarray, iterations: int,
                       last_reply: np.ndarray | None = None
                       ) -> tuple[np.ndarray, dict[str, float]]:
        """One client step of consensus ADMM; returns (reply, metrics).

        Why: averaging plain local fits converges to a biased fixed point (each
        client shrinks the directions its data does not cover); ADMM's dual
        variable cancels that bias, so the fixed point of the federation is
        pooled ridge FQI. With the learner built with ``proximal = penalty * n_i``
        (``n_i``: its transitions), client ``i`` solves, per action,

            min (||Phi_i w - y_i||^2 + ridge_i ||w||^2) / n_i + penalty ||w - z + v_i||^2

        from the global readout ``z`` (``iterations`` sweeps, the first with
        targets ``y_i`` under ``z``), after the dual update ``v_i += w_i - z``, and
        replies ``w_i + v_i``; the server's weighted mean of the replies is the
        next ``z``. At a fixed point the clients' gradients sum to zero: the
        stationarity condition of FQI on the pooled data (for transition
        weights and ``ridge_i`` the client's share ``ridge / n`` of the pooled
        penalty).

        The client's whole memory is its last reply: the updated dual
        ``v_i + w_i - z`` is ``last_reply - z``.
        """
        z = np.asarray(global_readout, dtype=np.float64)
        if last_reply is None or last_reply.shape != z.shape:
            dual = np.zeros_like(z)
        else:
            dual = last_reply - z
        result = self.fqi.fit(iterations, init=z, prior=z - dual)
        local = self.fqi.readout_
        scale = max(float(np.linalg.norm(local)), float(np.linalg.norm(z)), 1e-300)
        gap = float(np.linalg.norm(local - z) / scale)  # in [0, 2]; 1 while z = 0
        return local + dual, {"bellman-residual": result.bellman_residuals[-1],
                              "consensus-gap": gap}

    def exact_statistics(self, readout: np.ndarray, have: int, want_rhs: bool,
                         q_range: tuple[float, float] | None) -> tuple[Arrays, Metrics]:
        """A FedQHDExact reply: the Gram of the transitions after the first ``have`` (none
        when the server holds them all), ``Phi_a^T y_a`` for ``readout``'s targets kept in
        the pooled ``q_range`` (if wanted), counts and the reward range."""
        arrays: Arrays = {C.ACTION_COUNTS: self.fqi.action_counts.astype(np.float64),
                          C.REWARD_RANGE: self.fqi.reward_extremes}
        if have < self.n_transitions:
            if have == 0:
                grams = self.fqi.grams()
            else:  # only the new transitions (a shard that grew)
                grams = chunked_grams(self.encoder.encode, self.shard.observations[have:],
                                      self.shard.actions[have:], self.n_actions,
                                      self.encoder.hd_dim)
            arrays[C.GRAM] = C.pack_upper(grams)
        if want_rhs:
            arrays[C.PHI_Y] = self.fqi.rhs(readout, q_range)
        return arrays, {C.GRAM_THROUGH: self.n_transitions}

    def compile(self, anchors: np.ndarray, teacher: np.ndarray) -> float:
        """Replace the readout by the ridge projection of ``teacher`` (Q on ``anchors``)
        onto this client's features; returns the residual ``||X W - T||_F``.

        The anchor system is factored once per anchor set and reused every round.
        """
        key = anchor_digest(anchors)
        if key != self._anchor_key:
            self._anchor_system = RidgeSystem(self.encoder.encode(anchors), self.compile_ridge)
            self._anchor_key = key
        system = self._anchor_system
        assert system is not None  # set above whenever the key changed; keys start as None
        self.readout = system.solve(teacher)
        return float(np.linalg.norm(system.features @ self.readout - teacher))

    @property
    def anchor_system(self) -> RidgeSystem | None:
        """The factored anchor system of the last :meth:`compile` (None before one): its
        conditioning is what the federation-gap study reports."""
        return self._anchor_system

    def q_values(self, states: np.ndarray) -> np.ndarray:
        """Q(s, .) for each row of ``states``, shape (n, |A|)."""
        return self.encoder.encode(states) @ self.readout

    def policy(self) -> Callable[[np.ndarray], int]:
        """The greedy policy of the current readout (a frozen copy)."""
        return greedy_policy(self.encoder, self.readout.copy())


def _check_memory(n: int, dim: int, n_actions: int, streaming: bool, chunk_size: int,
                  obs_dim: int, cap: int | None, cap_given: bool, states: int,
                  feature_bytes: int = 8) -> None:
    """Refuse a fit that would need more than ``cap`` bytes (``None``: unknown, allow)."""
    need = fit_memory(n, dim, n_actions, streaming, chunk_size, obs_dim, states=states,
                      feature_bytes=feature_bytes)
    if cap is None or need <= cap:
        return
    limit = (f"the cap of {format_bytes(cap)} (memory-cap-gib)" if cap_given
             else f"the {format_bytes(cap)} of memory available")
    if streaming:
        how = (f"the streaming fit keeps 2 x |A| x D^2 float64 (|A| = {n_actions}, D = {dim}) "
               "whatever the shard's size: lower hd-dim")
    else:
        kind = "float64" if feature_bytes == 8 else "float32"
        how = (f"the in-memory fit holds one {kind} feature row per distinct state "
               f"({states} states of n = {n} transitions, D = {dim}): use "
               f"the streaming fit (streaming=None or True; it needs "
               f"{format_bytes(fit_memory(n, dim, n_actions, True, chunk_size, obs_dim))}), lower "
               "hd-dim, or split the shard")
    raise FitMemoryError(f"the client's fit needs about {format_bytes(need)}, more than {limit}; "
                         f"{how}; or raise run-config memory-cap-gib (0: the memory "
                         "available)")


def greedy_policy(encoder: HDEncoder, readout: np.ndarray) -> Callable[[np.ndarray], int]:
    """``s -> argmax_a phi(s) . w_a`` for one observation at a time."""

    def act(observation: np.ndarray) -> int:
        return int(np.argmax(encoder.encode(observation[None, :])[0] @ readout))

    return act


def greedy_return(cfg: RunConfig, encoder: HDEncoder, readout: np.ndarray, party: int = SERVER,
                  dynamics: dict[str, float] | None = None) -> np.ndarray:
    """Returns of ``eval-episodes`` greedy episodes of ``readout``, on the fixed episode seeds
    of evaluator ``party`` (the server, or a client's partition id), under ``dynamics``.
    The episodes run side by side, their states encoded together at each step: online, in
    the float32 features the clients act with (:meth:`~fedqhd.encoders.HDEncoder.encode32`)."""
    if cfg.protocol == "online":
        w32 = np.asarray(readout, dtype=np.float32)

        def policy(states: np.ndarray) -> np.ndarray:
            return np.argmax(encoder.encode32(states) @ w32, axis=1)
    else:
        def policy(states: np.ndarray) -> np.ndarray:
            return np.argmax(encoder.encode(states) @ readout, axis=1)
    return batch_rollout_returns(cfg.env_id, policy, cfg.eval_episodes,
                                 seed=evaluation_seed(cfg.seed, party),
                                 dynamics=dynamics or None)


def readout_evaluator(cfg: RunConfig) -> Callable[[ArrayRecord], MetricRecord]:
    """The server's evaluation of a global shared-encoder ``readout``: the greedy return
    of ``eval-episodes`` episodes on the server's episode seeds."""
    encoder = shared_encoder(cfg)

    def evaluate(arrays: ArrayRecord) -> MetricRecord:
        returns = greedy_return(cfg, encoder, arrays[C.READOUT].numpy())
        return MetricRecord({C.RETURN_MEAN: float(returns.mean()),
                             C.RETURN_STD: float(returns.std())})

    return evaluate


# ---------------------------------------------------------------- settings -> objects
def encoder_bound(env_id: str, obs_scale: Sequence[float] | None = None) -> np.ndarray:
    """The per-coordinate scale the online encoders divide observations by: the task's
    ``obs_bound`` times ``obs_scale`` (one positive multiplier per coordinate; ``None``
    or empty: the bound itself). The env's own bounds (value checks, anchors) stay."""
    bound = np.asarray(get_spec(env_id).obs_bound, dtype=float)
    if obs_scale is None or len(obs_scale) == 0:
        return bound
    scale = np.asarray(obs_scale, dtype=float)
    if scale.shape != bound.shape or not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise ValueError(f"obs_scale for {env_id} needs {bound.size} positive finite "
                         f"multipliers, got {list(obs_scale)!r}")
    return bound * scale


def encoder_scale(cfg: RunConfig) -> np.ndarray:
    """What the run's encoders divide observations by: the task's bounds, times the
    preset's ``obs-scale`` (:func:`encoder_bound`)."""
    return encoder_bound(cfg.env_id, cfg.online.obs_scale)


@functools.lru_cache(maxsize=8)
def _built_encoder(params: EncoderParams, bound: tuple[float, ...]) -> HDEncoder:
    """One encoder object per definition and process, shared read-only by its users: a
    learner rebuilt per message (see :data:`_NODE_LEARNERS`) no longer redraws it."""
    return params.build(np.asarray(bound, dtype=np.float64))


def shared_encoder(cfg: RunConfig) -> HDEncoder:
    """The run's shared encoder, as the server and every client build it."""
    return _built_encoder(shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth),
                          tuple(encoder_scale(cfg).tolist()))


def client_encoder(cfg: RunConfig, partition_id: int) -> HDEncoder:
    """A client's encoder: the shared one, or its own (heterogeneous setting)."""
    if cfg.encoder == "shared":
        return shared_encoder(cfg)
    return _built_encoder(heterogeneous_encoder_params(cfg.seed, partition_id, cfg.bandwidth),
                          tuple(encoder_scale(cfg).tolist()))


def local_ridge(ridge: float, num_partitions: int) -> float:
    """Each of n clients carries ``ridge / n`` of the pooled objective's penalty, so the
    clients' objectives add up to the pooled one; a client penalising with the full
    ``ridge`` over-smooths, and the average of over-smoothed fits stays over-smoothed."""
    return ridge / num_partitions


def uses_admm(cfg: RunConfig) -> bool:
    """Consensus ADMM is offline readout averaging's client update (shared encoder; its
    fixed point is pooled FQI). Online clients reply what they just learned, pulled
    toward the global readout: plain proximal averaging."""
    return cfg.resolved_strategy == "avg" and cfg.protocol == "offline"


def local_proximal(cfg: RunConfig, n_transitions: int) -> float:
    """The learner's proximal weight: ADMM's penalty is per transition (so the server's
    transition-weighted mean is the consensus step), the plain pull is absolute."""
    return cfg.admm_penalty * n_transitions if uses_admm(cfg) else cfg.proximal


#: learners kept in this process between rounds (encoded shard and factorisations) for
#: the nodes of the current run this process serves (a Ray actor serves many nodes), up to
#: run-config ``learner-cache-mib`` per process; a learner that does not fit is rebuilt
#: per message, deterministically, from its shard
_NODE_LEARNERS: BoundedCache[tuple[FQILearner, Shard]] = BoundedCache(0)
#: the nodes' shards as loaded and validated (raw transitions, about 10 KB a node at the
#: defaults), up to :data:`SHARD_SHARE` of ``learner-cache-mib``: a rebuild then encodes
#: only, instead of reading, unzipping and validating the file again
_NODE_SHARDS: BoundedCache[Shard] = BoundedCache(0)
SHARD_SHARE = 8  #: the shard cache's budget is 1 / SHARD_SHARE of ``learner-cache-mib``


def _node_shard(cfg: RunConfig, pid: int, n_parts: int, data_dir: str,
                node: NodeSettings) -> Shard:
    """Partition ``pid``'s shard (generated, or read from ``data_dir``) under the node's
    own limits."""
    return client_shard(cfg.env_id, cfg.partition, pid, n_parts, cfg.episodes_per_client,
                        cfg.seed, data_dir=data_dir or None,
                        epsilon_min=cfg.epsilon_min, epsilon_max=cfg.epsilon_max,
                        limits=ShardLimits(node.value_check, node.max_shard_transitions,
                                           node.max_compression_ratio))


def _node_key(context: Context, cfg: RunConfig) -> tuple[Any, ...]:
    pid, n_parts = partition(context)
    data_dir = str(context.node_config.get("data-dir", "")) or cfg.data_dir
    return (context.run_id, pid, n_parts, data_dir, cfg, NodeSettings.of(context.node_config))


def _resize_caches(node: NodeSettings) -> None:
    budget = node.learner_cache_mib << 20
    if _NODE_LEARNERS.budget != budget:
        _NODE_LEARNERS.resize(budget)
        _NODE_SHARDS.resize(budget // SHARD_SHARE)


def node_shard(context: Context, cfg: RunConfig) -> Shard:
    """This node's shard (generated, or read from its data-dir) under the node's limits,
    cached in this process while it fits the node's budget; flagged values are logged."""
    key = _node_key(context, cfg)
    _, pid, n_parts, data_dir, _, node = key
    _resize_caches(node)

    def load() -> Shard:
        shard = _node_shard(cfg, pid, n_parts, data_dir, node)
        for flag in shard.value_flags:
            log(WARNING, "client %d: shard value flagged (value-check = \"warn\"): %s", pid, flag)
        return shard

    return _NODE_SHARDS.get(key, load, (context.run_id, cfg))


def node_learner(context: Context, cfg: RunConfig) -> tuple[FQILearner, Shard]:
    """This node's learner and shard (cached in this process while they fit its budget)."""
    key = _node_key(context, cfg)
    _, pid, n_parts, _, _, node = key

    def build() -> tuple[FQILearner, Shard]:
        shard = node_shard(context, cfg)
        # exact: the client only computes statistics (its Gram is built once, chunked)
        learner = FQILearner(shard, client_encoder(cfg, pid), get_spec(cfg.env_id).n_actions,
                             gamma=cfg.gamma, ridge=local_ridge(cfg.ridge, n_parts),
                             proximal=local_proximal(cfg, shard.n_transitions),
                             compile_ridge=cfg.ridge,
                             streaming=True if cfg.resolved_strategy == "exact" else None,
                             memory_cap=int(node.memory_cap_gib * GIB) or None,
                             feature_dtype=cfg.feature_dtype)
        return learner, shard

    _resize_caches(node)
    # what earlier runs (or other settings) left in this process is freed
    return _NODE_LEARNERS.get(key, build, (context.run_id, cfg))


def _adopt_global(learner: FQILearner, arrays: Arrays, metrics: Metrics) -> None:
    """Set the learner's readout from what the server sent: the global readout, or the
    compiled teacher (recording the projection residual)."""
    if C.READOUT in arrays:
        learner.readout = arrays[C.READOUT]
    elif C.TEACHER in arrays:
        metrics[C.PROJECTION_RESIDUAL] = learner.compile(arrays[C.ANCHORS], arrays[C.TEACHER])
    else:
        learner.readout = np.zeros_like(learner.readout)


def anchor_plan(cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
    """FedQHDAnchor on the run's anchors (``anchor-source``, seeded by the run seed): no
    global model, so every client evaluates its own policy each round; behind a
    PrivacyScreen in a private run."""
    anchors = make_anchors(cfg.anchor_source, cfg.env_id, cfg.num_anchors,
                           seed=anchor_seed(cfg.seed))
    strategy = FedQHDAnchor(anchors, get_spec(cfg.env_id).n_actions, fraction_evaluate=1.0,
                            **strategy_kwargs)
    info: dict[str, Any] = {"anchors-shape": list(anchors.shape)}
    if cfg.privacy != "zcdp":
        return ServerPlan(strategy, strategy.initial_arrays(), run_info=info)
    # private: the clients' noisy anchor values, post-processing only
    return ServerPlan(PrivacyScreen(strategy, cfg.non_private), strategy.initial_arrays(),
                      run_info={**info, **private_info(cfg, len(anchors))})


# ------------------------------------------------------------ private FedQHD (zcdp)
_PRIVATE_READOUTS: BoundedCache[PrivateReadout] = BoundedCache(256 << 20)


def private_reply(context: Context, cfg: RunConfig, arrays: Arrays
                  ) -> tuple[Arrays | None, Metrics]:
    """A private run's reply (:mod:`fedqhd.learners.fqi_private`): the node's noisy
    readout, or its noisy advantages on the anchors the server sent (heterogeneous
    encoders); the clipped chunk fits are cached in this process, the release lives in
    ``context.state`` and the ledger on disk."""
    node_key = _node_key(context, cfg)
    _, pid, n_parts, data_dir, _, node = node_key
    anchors = arrays.get(C.ANCHORS)
    key = ("private", *node_key, None if anchors is None else anchor_digest(anchors))

    def build() -> PrivateReadout:
        return private_model(cfg, _node_shard(cfg, pid, n_parts, data_dir, node), pid, anchors)

    model = _PRIVATE_READOUTS.get(key, build, (context.run_id, cfg))
    return private_readout(context, cfg, model, pid)


def public_readout(cfg: RunConfig, encoder: HDEncoder, arrays: Arrays) -> np.ndarray:
    """A private client's model from what the server sent, nothing fitted to its data:
    the global readout, the teacher compiled into its own features, or zero."""
    if C.READOUT in arrays:
        return np.asarray(arrays[C.READOUT], dtype=np.float64)
    if C.TEACHER in arrays:
        features = encoder.encode(arrays[C.ANCHORS])
        out: np.ndarray = RidgeSystem(features, cfg.ridge).solve(arrays[C.TEACHER])
        return out
    return np.zeros((int(encoder.omega_.shape[1]), get_spec(cfg.env_id).n_actions))


def client_dynamics(cfg: RunConfig, pid: int, n_parts: int) -> dict[str, float] | None:
    """The physics of partition ``pid``'s env copy (``dynamics-skew``; else None)."""
    return partition_settings(cfg.partition, pid, n_parts, cfg.seed,
                              env_id=cfg.env_id)["dynamics"] or None


def private_evaluate(context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
    """A private heterogeneous client's evaluation: the greedy return of the (public)
    teacher compiled into its own features, nothing fitted to its shard, so the return is
    post-processing of the releases; it claims no size (its shard's is private). The env
    it acts in (its dynamics under dynamics-skew) is not its trajectories."""
    pid, n_parts = partition(context)
    encoder = client_encoder(cfg, pid)
    returns = greedy_return(cfg, encoder, public_readout(cfg, encoder, arrays), party=pid,
                            dynamics=client_dynamics(cfg, pid, n_parts))
    noisy = int(NodeSettings.of(context.node_config).noise != "none")
    return {C.NUM_TRANSITIONS: 1, C.PRIVATE: noisy, C.RETURN_MEAN: float(returns.mean()),
            C.RETURN_STD: float(returns.std())}


def private_model(cfg: RunConfig, shard: Shard, partition_id: int = 0,
                  anchors: np.ndarray | None = None) -> PrivateReadout:
    """A private client's readout model of ``shard`` under the run's settings, in client
    ``partition_id``'s encoder, released on ``anchors`` when given (the privacy audit builds
    its neighbouring releases with it too)."""
    encoder = client_encoder(cfg, partition_id)
    return PrivateReadout(shard, encoder.encode, get_spec(cfg.env_id).n_actions,
                          cfg.gamma, cfg.ridge, public_reward_range(cfg), cfg.privacy_chunks,
                          cfg.privacy_clip_norm, cfg.local_iterations,
                          None if anchors is None else encoder.encode(anchors))


def public_reward_range(cfg: RunConfig) -> tuple[float, float]:
    """The env's registered reward range (public), which private targets are clipped to."""
    reward_range = get_spec(cfg.env_id).reward_range
    if reward_range is None:
        raise ValueError(f"privacy = 'zcdp' needs {cfg.env_id!r} registered with a reward "
                         "range: private targets must lie in a public range")
    return reward_range


def private_plan(cfg: RunConfig, initial: ArrayRecord,
                 evaluate: Callable[[ArrayRecord], MetricRecord], shape: list[int],
                 **strategy_kwargs: Any) -> ServerPlan:
    """FedQHDAvg (uniform average of the noisy readouts: post-processing) behind a
    PrivacyScreen (replies must declare ``private = 1`` unless the run is marked
    non-private)."""
    avg = FedQHDAvg(fraction_evaluate=0.0, aggregate="sampled", **strategy_kwargs)
    info = {"readout-shape": shape, **private_info(cfg)}
    return ServerPlan(PrivacyScreen(avg, cfg.non_private), initial, evaluate, info)


def private_info(cfg: RunConfig, anchors: int = 1) -> dict[str, Any]:
    """A private run's facts for ``run_config.json``: rho, the public value range and the
    release's sensitivity (on ``anchors`` anchor states, or 1 for a readout)."""
    value_range = public_value_range(public_reward_range(cfg), cfg.gamma)
    return {"privacy": "zcdp", "privacy-rho": cfg.privacy_rho, "value-range": list(value_range),
            "release-sensitivity": 2.0 * cfg.privacy_clip_norm * math.sqrt(anchors)
            / cfg.privacy_chunks}


def generated_shard_problem(cfg: RunConfig) -> str | None:
    """The config error of offline shards generated (no ``data-dir``) with a heuristic
    behaviour the env does not have, or ``None``."""
    generated = cfg.protocol == "offline" and not cfg.data_dir
    if generated and cfg.epsilon_min < 1.0 and not has_heuristic(cfg.env_id):
        return (f"run-config keys 'epsilon-min' = {cfg.epsilon_min} and 'env-id' = "
                f"{cfg.env_id!r}: the env has no heuristic controller, so generated shards "
                "need random behaviour: set epsilon-min=1.0 epsilon-max=1.0 (or register "
                "a heuristic, or give data-dir)")
    return None


# ------------------------------------------------------------------ registry entry
class FQI:
    """Registry entry ``fqi``."""

    name = "fqi"
    log_label = "fedqhd"
    curves = RETURN_CURVES

    def title(self, cfg: RunConfig) -> str:
        return f"{cfg.env_id}: FQI, {cfg.resolved_strategy}, {cfg.encoder} encoder"

    def check_config(self, cfg: RunConfig) -> str | None:
        problem = env_problem(self.name, tuple(ENV_IDS), cfg.env_id)
        if problem:
            return problem
        try:
            spec = get_spec(cfg.env_id)  # a registered env that cannot be used fails here
        except ValueError as exc:
            return f"run-config key 'env-id' = {cfg.env_id!r}: {exc}"
        problem = generated_shard_problem(cfg)
        if problem:
            return problem
        if cfg.partition == "dynamics-skew" and not spec.dynamics_ranges:
            return (f"run-config key 'partition' = 'dynamics-skew' needs an env with dynamics "
                    f"parameters; {cfg.env_id!r} registers none")
        return None

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        spec = get_spec(cfg.env_id)
        if cfg.resolved_strategy == "anchor":
            return anchor_plan(cfg, **strategy_kwargs)
        evaluate = readout_evaluator(cfg)
        shape = [cfg.hd_dim, spec.n_actions]
        initial = C.to_array_record({C.READOUT: np.zeros(shape)})
        # the server evaluates a global readout itself: no federated evaluation rounds
        readout_kwargs = {k: v for k, v in strategy_kwargs.items() if k != "min_evaluate_nodes"}
        if cfg.privacy == "zcdp":
            return private_plan(cfg, initial, evaluate, shape, **readout_kwargs)
        if cfg.resolved_strategy == "exact":
            exact = FedQHDExact(cfg.hd_dim, spec.n_actions, cfg.gamma, cfg.ridge,
                                max_feature_sq_norm=MAX_FEATURE_SQ_NORM,
                                fraction_evaluate=0.0, **readout_kwargs)
            return ServerPlan(exact, initial, evaluate, {"readout-shape": shape})
        # ADMM's consensus is over all clients: keep every node's latest reply
        avg = FedQHDAvg(fraction_evaluate=0.0, aggregate="latest" if uses_admm(cfg) else "sampled",
                        **readout_kwargs)
        return ServerPlan(avg, initial, evaluate, {"readout-shape": shape})

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        gap = (f" | consensus gap {row[C.CONSENSUS_GAP]:.3g}" if C.CONSENSUS_GAP in row else "")
        residual = (f" | bellman residual {row[C.BELLMAN_RESIDUAL]:.3g}"
                    if C.BELLMAN_RESIDUAL in row else "")
        # a round not evaluated (eval-every), or evaluated with the next round's messages
        # (its own line follows then): "return -"
        greedy = (f"return {row[C.RETURN_MEAN]:.1f} +- {row.get(C.RETURN_STD, float('nan')):.1f}"
                  if C.RETURN_MEAN in row else "return -")
        return f"{greedy}{residual}{gap} | {reply_counts_text(row)}"

    def final_report(self, cfg: RunConfig, plan: ServerPlan, rows: list[dict[str, Any]]
                     ) -> dict[str, Any] | None:
        report = reference_report(cfg)
        if isinstance(plan.strategy, PrivacyScreen):
            report["privacy-ledgers"] = {str(pid): entry for pid, entry
                                         in sorted(plan.strategy.ledgers.items())}
        return report

    def final_line(self, final: dict[str, Any]) -> str:
        return greedy_final_line(final)

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        """Adopt the global Q-function, run local FQI sweeps pulled toward it, reply (admm:
        one consensus step, its dual kept in ``context.state``)."""
        if cfg.privacy == "zcdp":
            return private_reply(context, cfg, arrays)
        learner, shard = node_learner(context, cfg)
        metrics: Metrics = {C.NUM_TRANSITIONS: learner.n_transitions}
        if NodeSettings.of(context.node_config).value_check == "warn":
            metrics[C.VALUE_FLAGS] = len(shard.value_flags)
        if C.STATS_REQUEST in arrays:  # FedQHDExact: sufficient statistics, no local fit
            have, want = arrays[C.STATS_REQUEST]
            q_range = (tuple(float(v) for v in arrays[C.Q_RANGE]) if C.Q_RANGE in arrays
                       else None)
            stats, extra = learner.exact_statistics(arrays[C.READOUT], int(have), bool(want),
                                                    q_range)  # type: ignore[arg-type]
            # the partition id names the client in the server's log lines (a label only)
            return stats, {**metrics, **extra, C.PARTITION_ID: partition(context)[0]}
        if C.READOUT in arrays and uses_admm(cfg):
            # identifies the client to the server's latest-reply memory across node restarts
            metrics[C.PARTITION_ID] = partition(context)[0]
            # its memory, or after a resumed server's restart the copy the server kept
            last = (context.state[STATE_ADMM]["reply"].numpy()  # type: ignore[union-attr]
                    if STATE_ADMM in context.state else arrays.get(C.LAST_REPLY))
            reply, step = learner.consensus_step(arrays[C.READOUT], cfg.local_iterations, last)
            context.state[STATE_ADMM] = C.to_array_record({"reply": reply})
            return {C.READOUT: reply}, {**metrics, **step}
        _adopt_global(learner, arrays, metrics)
        metrics.update(learner.train(cfg.local_iterations, start=learner.readout))
        if C.READOUT in arrays:
            return {C.READOUT: learner.readout}, metrics
        return {C.Q_ANCHORS: learner.q_values(arrays[C.ANCHORS])}, metrics

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        """Greedy return of the global Q-function as this client's features express it
        (compiled teacher, or the shared readout), in this client's own environment."""
        if cfg.privacy == "zcdp":
            return private_evaluate(context, cfg, arrays)
        learner, shard = node_learner(context, cfg)
        metrics: Metrics = {C.NUM_TRANSITIONS: learner.n_transitions}
        _adopt_global(learner, arrays, metrics)
        returns = greedy_return(cfg, learner.encoder, learner.readout, party=partition(context)[0],
                                dynamics=shard.metadata.get("dynamics"))
        metrics[C.RETURN_MEAN] = float(returns.mean())
        metrics[C.RETURN_STD] = float(returns.std())
        return metrics


LEARNER = FQI()
