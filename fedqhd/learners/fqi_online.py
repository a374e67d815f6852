"""The FQI learner under the paper's online protocol (``protocol = "online"``).

Each client starts with an empty private buffer. Every round it collects
``episodes-per-round`` episodes with its current epsilon-greedy policy in its own
copy of the environment (its own physics under ``dynamics-skew``), offers them to
its buffer (per-action statistics updated, never recomputed), runs
``local-iterations`` warm-started sweeps of bounded ridge FQI and replies: its
readout (shared encoder, FedQHDAvg) or its Q-values on the anchors
(heterogeneous encoders, FedQHDAnchor: each teacher compiled once, after the round's
fit, with the anchors in the client's float32 features, as the bench does). Every
reply carries ``train-return-last100``, the paper's metric: the mean return of
the client's last 100 training episodes. The numeric core is
:class:`fedqhd.online.OnlineClient`.

The paper's baselines run in the same app (the paper suite, :mod:`fedqhd.studies.paper`, runs
this app in process): ``strategy = "independent"``
(independent learners: FedQHDIndependent, metrics only, each client learns from
its own readout and evaluates it) and ``strategy = "truncate"``
(FedQHDTruncate: each client replies its own readout, of its own ``D_i`` under
heterogeneous encoders, and continues from the truncated average in its first
rows). Under both, every client evaluates its own policy each round. ``strategy =
"pooled"`` (FedQHDPooled, the centralised oracle, shared encoder): each client acts
with the global readout, collects and replies its buffer's sufficient statistics
(:func:`pooled_statistics`) without fitting; the server then asks for one ``phi-y``
per sweep (:meth:`FQIOnline.pooled_sweep`, message type ``train.pooled_sweep``) and
solves the pooled fit itself.

A node's state (buffer rows and statistics, counters, readout, episode returns, RNG
state, the last compiled teacher's digest) lives in its ``context.state``, written after
every train message with a new version token: Flower's Ray actor pool serves a node's
messages from whichever actor is free, and only the node's Context follows the node.
Each process keeps the client it last served as a cache, used only while its version
is the Context's; otherwise the client is rebuilt from ``context.state`` (features
re-encoded from the rows, statistics copied), the same numbers bit for bit.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import replace
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context

from fedqhd.acting import collect, epsilon_schedule
from fedqhd.anchors import anchor_digest
from fedqhd.config import RunConfig
from fedqhd.data import Shard, collect_shard
from fedqhd.envs import get_spec
from fedqhd.learners.base import Arrays, Curves, Metrics, ServerPlan, partition
from fedqhd.learners.fqi import (
    FQI,
    client_dynamics,
    client_encoder,
    greedy_policy,
    greedy_return,
    private_evaluate,
    private_model,
    public_readout,
    readout_evaluator,
)
from fedqhd.learners.fqi_private import private_readout
from fedqhd.online import OnlineClient, default_capacity
from fedqhd.privacy.store import data_fingerprint
from fedqhd.seeding import private_online_seed, shard_seed
from fedqhd.strategies import FedQHDIndependent, FedQHDPooled, FedQHDTruncate
from fedqhd.strategies import contract as C
from fedqhd.strategies.truncate import with_head

TRAIN_RETURN_LAST100 = "train-return-last100"  #: reply and round metric (the paper's metric)
#: reply and round metric: value of the round's start states minus their realised
#: discounted return (:meth:`fedqhd.online.OnlineClient.value_bias`)
VALUE_BIAS = "value-bias"
#: per-client reply metrics the round row averages plainly over the clients that replied
_CLIENT_MEANS = (TRAIN_RETURN_LAST100, VALUE_BIAS)

STATE_ARRAYS = "fedqhd-online"  #: context.state ArrayRecord: the client's snapshot arrays
STATE_META = "fedqhd-online-meta"  #: context.state ConfigRecord: its scalars and version
_TEACHER_KEYS = ("teacher-digest", "projection-residual")  # cache entries that are state

#: this process's clients by (run, partition, partitions, config), each with its anchor
#: cache, version token and whether its buffer was restored: a speed-up only, valid
#: while its version token equals the one in the node's context.state
_CLIENTS: dict[tuple[Any, ...], tuple[OnlineClient, dict[str, Any], str, bool]] = {}
_ANCHOR_KEYS = ("anchor-digest", "anchor-features")  # process cache a rebuilt client keeps


def _client_key(context: Context, cfg: RunConfig) -> tuple[Any, ...]:
    pid, n_parts = partition(context)
    return (context.run_id, pid, n_parts, cfg)


def _new_client(cfg: RunConfig, pid: int, n_parts: int) -> tuple[OnlineClient, dict[str, Any]]:
    """A fresh client of partition ``pid`` (empty buffer, zero readout) and its cache."""
    encoder = client_encoder(cfg, pid)
    dynamics = client_dynamics(cfg, pid, n_parts)
    dim = int(encoder.omega_.shape[1])
    settings = cfg.online
    td = settings.update == "td"  # learns while it acts: no buffer, one episode at a time
    client = OnlineClient(cfg.env_id, encoder, gamma=cfg.gamma, ridge=cfg.ridge,
                          proximal=cfg.proximal, tail=settings.tail, mc_mix=settings.mc_mix,
                          mc_window=settings.mc_window,
                          capacity=0 if td else default_capacity(dim),
                          per_episode=settings.per_episode,
                          n_parallel=1 if td else cfg.episodes_per_round,
                          seed=shard_seed(cfg.seed, pid), dynamics=dynamics,
                          update=settings.update, td_rate=settings.td_rate,
                          replay=settings.td_replay, replay_rate=settings.td_replay_rate,
                          replay_size=settings.td_replay_size,
                          replay_start=settings.td_replay_start)
    return client, {"dynamics": dynamics}


def state_version(context: Context) -> str:
    """The version token of the node's online state ("" before its first message)."""
    if STATE_META not in context.state:
        return ""
    return str(context.state[STATE_META]["version"])  # type: ignore[index]


def node_client(context: Context, cfg: RunConfig, buffer: bool = True
                ) -> tuple[OnlineClient, dict[str, Any]]:
    """This node's online client and its anchor cache: this process's copy when it is the
    version in ``context.state``, else rebuilt from ``context.state`` (fresh if empty).

    ``buffer=False`` (evaluation: it acts with the readout and never fits) rebuilds
    without the buffer (no rows re-encoded, no statistics copied); such a copy serves
    later evaluations at that version but never a ``buffer=True`` call. A rebuilt client
    keeps the process's anchor features and anchor-kernel factor of its node's earlier
    copy (same encoder and anchors: the same numbers, not computed again), and that
    copy's features of every buffer row that has not changed since: a copy with its
    buffer, behind the node's state, is brought forward in place (nothing allocated)."""
    key = _client_key(context, cfg)
    version = state_version(context)
    cached = _CLIENTS.get(key)
    if cached is not None and cached[2] == version and (cached[3] or not buffer):
        return cached[0], cached[1]
    meta: dict[str, Any] = dict(context.state[STATE_META]) if version else {}  # type: ignore[arg-type]
    earlier = cached[0] if cached is not None and cached[3] else None
    # an earlier copy with its buffer, behind the node's state: brought forward in place
    in_place = (buffer and earlier is not None and bool(version)
                and earlier.size <= int(meta["size"]))
    if in_place:
        assert cached is not None and earlier is not None
        client, cache = earlier, {"dynamics": cached[1]["dynamics"]}
        del _CLIENTS[key]  # half-restored if restore fails: never served again
    else:
        client, cache = _new_client(cfg, key[1], key[2])
    if version:
        record = context.state[STATE_ARRAYS]
        if not isinstance(record, ArrayRecord):
            raise TypeError(f"context.state[{STATE_ARRAYS!r}] is not an ArrayRecord")
        names = list(record.keys()) if buffer else ["readout", "episode-returns"]
        client.restore({k: record[k].numpy() for k in names}, meta, buffer=buffer,
                       reuse=earlier)
        cache.update({k: meta[k] for k in _TEACHER_KEYS if k in meta})
    if cached is not None:
        if not in_place:
            client.share_anchor_factor(cached[0])
        cache.update({k: cached[1][k] for k in _ANCHOR_KEYS if k in cached[1]})
    for stale in [k for k in _CLIENTS if k[0] != context.run_id or k[3] != cfg]:
        del _CLIENTS[stale]
    _CLIENTS[key] = (client, cache, version, buffer or not version)
    return client, cache


def save_node(context: Context, cfg: RunConfig, client: OnlineClient,
              cache: dict[str, Any]) -> None:
    """Write the client into ``context.state`` under a new version token (a counter and
    a random tag: a process whose earlier write was discarded cannot match a later
    write of another process) and mark this process's copy as that version."""
    arrays, scalars = client.snapshot()
    counter = (int(context.state[STATE_META]["counter"]) + 1  # type: ignore[index,arg-type]
               if STATE_META in context.state else 1)
    version = f"{counter}-{secrets.token_hex(8)}"
    scalars.update({"counter": counter, "version": version},
                   **{k: cache[k] for k in _TEACHER_KEYS if k in cache})
    context.state[STATE_ARRAYS] = C.to_array_record(arrays)
    context.state[STATE_META] = ConfigRecord(scalars)
    _CLIENTS[_client_key(context, cfg)] = (client, cache, version, True)


def forget_node(context: Context, cfg: RunConfig) -> None:
    """Drop this process's copy of the node, after a message that failed midway: its
    env, generator and buffer may have moved past ``context.state``, so the next message
    rebuilds the node from ``context.state``, as any other process would."""
    _CLIENTS.pop(_client_key(context, cfg), None)


def _anchor_features(client: OnlineClient, cache: dict[str, Any],
                     anchors: np.ndarray) -> np.ndarray:
    """The client's float32 features of the run's anchors (as the bench encodes them,
    :meth:`~fedqhd.online.OnlineClient.encode`), computed once per anchor set."""
    digest = anchor_digest(anchors)
    if cache.get("anchor-digest") != digest:
        cache["anchor-digest"] = digest
        cache["anchor-features"] = client.encode(np.asarray(anchors, dtype=np.float64))
    return cache["anchor-features"]


def _adopt(client: OnlineClient, cache: dict[str, Any], arrays: Arrays, cfg: RunConfig,
           metrics: Metrics) -> None:
    """Start from the global model: the shared readout, the truncated average in this
    client's first rows (truncate), or the teacher compiled into this client's features.
    Nothing (none): its own readout.

    A teacher is compiled once: the compilation pulls toward the current readout, so
    compiling it again (evaluation, then the next round's training get the same teacher)
    would move the readout twice where the bench's round moves it once."""
    if C.READOUT in arrays:
        client.readout = np.array(arrays[C.READOUT], dtype=np.float64)
    elif C.READOUT_HEAD in arrays:
        client.readout = with_head(client.readout, arrays[C.READOUT_HEAD])
    elif C.TEACHER in arrays:
        teacher = np.ascontiguousarray(arrays[C.TEACHER], dtype=np.float64)
        digest = hashlib.sha1(teacher.tobytes()).hexdigest()
        if cache.get("teacher-digest") != digest:
            features = _anchor_features(client, cache, arrays[C.ANCHORS])
            cache["teacher-digest"] = digest
            cache["projection-residual"] = client.compile(
                features, teacher, cfg.ridge, toward_own=cfg.online.compile_toward == "own")
        metrics[C.PROJECTION_RESIDUAL] = cache["projection-residual"]


def with_train_return(plan: ServerPlan) -> ServerPlan:
    """``plan`` whose every round's row carries ``train-return-last100`` as the paper
    defines it, the plain mean over the clients that replied this round (the strategy's
    round metric weights clients by their transitions, which favours long episodes), and
    ``value-bias`` likewise, evaluated rounds or not."""
    strategy = plan.strategy

    def client_means() -> dict[str, float]:
        replies = strategy.last_client_metrics.values()  # type: ignore[attr-defined]
        means = {}
        for key in _CLIENT_MEANS:
            per_client = [float(m[key]) for m in replies if key in m]
            per_client = [v for v in per_client if np.isfinite(v)]
            if per_client:
                means[key] = float(np.mean(per_client))
        return means

    return replace(plan, round_metrics=client_means)


def pooled_statistics(client: OnlineClient) -> Arrays:
    """A FedQHDPooled train reply: the per-action Gram of the whole buffer, packed (its
    lower triangle, the one the pooled Cholesky factor reads, so the server's system is
    the bench's bit for bit), the buffer's transitions per action and its rewards'
    [min, max]. Statistics only: no row of the buffer leaves the client."""
    if client.form != "primal":
        raise ValueError(f"the pooled oracle needs primal statistics: D = {client.dim} is "
                         f"above the buffer's {client.capacity} slots")
    return {C.GRAM: C.pack_upper(np.swapaxes(client.gram, 1, 2)),
            C.ACTION_COUNTS: client.action_counts().astype(np.float64),
            C.REWARD_RANGE: np.array([client.r_min, client.r_max])}


#: context.state ArrayRecord of a private online client: every episode it collected
STATE_PRIVATE_EPISODES = "fqi-private-online"


def private_online_train(context: Context, cfg: RunConfig, arrays: Arrays
                         ) -> tuple[Arrays, Metrics]:
    """A private online client's round (``privacy = "zcdp"``): act with the PUBLIC model
    the server sent (its readout, or the teacher compiled into this client's features;
    nothing fitted to the client's own data) epsilon-greedily for ``episodes-per-round``
    episodes (the preset's epsilon schedule, counted in rounds), keep them with the
    earlier ones in ``context.state``, and release the noisy chunked model of all of them
    (:func:`~fedqhd.learners.fqi_private.private_readout`) at ``1 / num-server-rounds`` of
    the rho: an episode is in every later release, so its
    releases add up to at most the run's rho. The data a round collects depend only on
    public releases and the env, so the releases compose adaptively (zCDP).

    The episodes are kept whole (no buffer capacity, no subsample): a reservoir or a
    per-episode subsample would draw from one random stream, so one episode more would
    change which rows of the others are kept, and the chunks' sensitivity argument needs
    an episode to change its own chunk only."""
    pid, n_parts = partition(context)
    encoder = client_encoder(cfg, pid)
    earlier = context.state.get(STATE_PRIVATE_EPISODES)
    old: dict[str, np.ndarray] = ({k: v.numpy() for k, v in earlier.items()}
                                  if isinstance(earlier, ArrayRecord) else {})
    k = cfg.episodes_per_round
    done = int(old["episode_ids"].max()) + 1 if old else 0  # ids run 0 .. done - 1
    round_index = done // k
    # the schedule counts rounds here: a round's episodes all follow one public model
    epsilon = float(epsilon_schedule(*cfg.online.epsilon)(np.array(round_index)))
    new = collect_shard(cfg.env_id, k, epsilon, private_online_seed(cfg.seed, pid, round_index),
                        client_dynamics(cfg, pid, n_parts),
                        policy=greedy_policy(encoder, public_readout(cfg, encoder, arrays)))
    fresh = new.arrays()
    fresh["episode_ids"] = fresh["episode_ids"] + done
    merged: dict[str, Any] = {name: np.concatenate([old[name], fresh[name]]) if old
                              else fresh[name] for name in fresh}
    context.state[STATE_PRIVATE_EPISODES] = C.to_array_record(merged)
    model = private_model(cfg, Shard(**merged, metadata=new.metadata), pid,
                          arrays.get(C.ANCHORS))
    # one ledger for the node's online trajectories of this env, seed and partition (a run
    # of the same seed collects the same episodes again): every round's release counts
    ledger_key = data_fingerprint(np.frombuffer(
        f"online|{cfg.env_id}|{cfg.seed}|{cfg.partition}|{pid}/{n_parts}".encode(), np.uint8))
    return private_readout(context, cfg, model, pid, rounds=cfg.num_server_rounds,
                           round_index=round_index, ledger_key=ledger_key)


class FQIOnline(FQI):
    """Registry entry ``fqi-online`` (run config ``learner = "fqi"``, ``protocol = "online"``)."""

    name = "fqi-online"
    curves = Curves("return", ((C.RETURN_MEAN, "greedy return, mean over episodes"),
                               (TRAIN_RETURN_LAST100, "training return, clients' last 100 "
                                                      "episodes (the paper's metric)")),
                    band=(C.RETURN_STD, "+- std of the greedy return over episodes"),
                    diagnostics=((VALUE_BIAS, "value bias: Q(start) - its return"),)
                    + FQI.curves.diagnostics)

    def title(self, cfg: RunConfig) -> str:
        return (f"{cfg.env_id}: online FQI, {cfg.resolved_strategy}, {cfg.encoder} encoder, "
                f"{cfg.episodes_per_round} episodes per round")

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        baseline: FedQHDIndependent | FedQHDTruncate | None = None
        if cfg.privacy != "zcdp":  # clients evaluate a round's model with the next round's
            # train messages (evaluate_and_train); the last round with evaluate messages
            last = cfg.num_server_rounds
            strategy_kwargs["evaluate_with_next_train"] = lambda server_round: (
                server_round < last)
        if cfg.resolved_strategy == "pooled":  # one global readout, evaluated by the server
            kwargs = {k: v for k, v in strategy_kwargs.items() if k != "min_evaluate_nodes"}
            oracle = FedQHDPooled(cfg.hd_dim, get_spec(cfg.env_id).n_actions, cfg.ridge,
                                  cfg.proximal, cfg.local_iterations,
                                  sweep_timeout=cfg.round_timeout, **kwargs)
            return with_train_return(ServerPlan(oracle, oracle.initial_arrays(),
                                                readout_evaluator(cfg),
                                                {"readout-shape": [cfg.hd_dim,
                                                                   oracle.n_actions]}))
        if cfg.resolved_strategy == "independent":
            baseline = FedQHDIndependent(fraction_evaluate=1.0, **strategy_kwargs)
        elif cfg.resolved_strategy == "truncate":
            baseline = FedQHDTruncate(get_spec(cfg.env_id).n_actions, fraction_evaluate=1.0,
                                      **strategy_kwargs)
        if baseline is not None:  # no global policy: every client evaluates its own
            plan = ServerPlan(baseline, baseline.initial_arrays())
        else:
            # every client replies every round with what it just learned: plain averaging
            plan = super().server_plan(cfg, **strategy_kwargs)
        return with_train_return(plan)

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        if cfg.privacy == "zcdp":  # private replies carry no training returns
            return super().round_line(cfg, row)
        return (f"train return (last 100) {row.get(TRAIN_RETURN_LAST100, float('nan')):.1f} | "
                f"value bias {row.get(VALUE_BIAS, float('nan')):.1f} | "
                + super().round_line(cfg, row))

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        return self._round(context, cfg, arrays, evaluate_first=False)

    def evaluate_and_train(self, context: Context, cfg: RunConfig, arrays: Arrays
                           ) -> tuple[Arrays | None, Metrics]:
        """:meth:`evaluate` of the global model the message carries, then :meth:`train`
        from it, in one message (the strategies' ``evaluate_with_next_train``): the reply
        holds both, the evaluation's metrics prefixed ``evaluated-``."""
        if cfg.privacy == "zcdp":
            raise ValueError("a private online client evaluates with evaluate messages only")
        return self._round(context, cfg, arrays, evaluate_first=True)

    def _round(self, context: Context, cfg: RunConfig, arrays: Arrays, evaluate_first: bool
               ) -> tuple[Arrays | None, Metrics]:
        if cfg.privacy == "zcdp":
            return private_online_train(context, cfg, arrays)
        client, cache = node_client(context, cfg)
        try:
            return self._train(context, cfg, arrays, client, cache, evaluate_first)
        except BaseException:
            forget_node(context, cfg)
            raise

    def _train(self, context: Context, cfg: RunConfig, arrays: Arrays, client: OnlineClient,
               cache: dict[str, Any], evaluate_first: bool) -> tuple[Arrays | None, Metrics]:
        metrics: Metrics = {}
        _adopt(client, cache, arrays, cfg, metrics)
        if evaluate_first:  # the client as an evaluate message would find it: not yet moved
            evaluated = _evaluation(context, cfg, client, cache, metrics)
            metrics.update({C.EVALUATED_PREFIX + k: v for k, v in evaluated.items()})
        start = client.readout.copy()
        done = len(client.episode_returns)
        k = cfg.episodes_per_round
        collect(client, k, epsilon_schedule(*cfg.online.epsilon)(np.arange(done, done + k)))
        strategy = cfg.resolved_strategy
        # the oracle's fit is the server's sweeps (pooled_sweep); a td client learnt as it
        # collected
        if strategy != "pooled" and client.update == "fqi":
            client.fit(cfg.local_iterations, init=start, prior=start)
        save_node(context, cfg, client, cache)
        metrics.update({C.NUM_TRANSITIONS: client.n_transitions,
                        TRAIN_RETURN_LAST100: float(np.mean(client.episode_returns[-100:])),
                        VALUE_BIAS: client.value_bias()})
        if strategy in ("independent", "truncate", "pooled"):
            # names the client: the server sums truncated readouts in partition order
            metrics[C.PARTITION_ID] = partition(context)[0]
        if strategy == "independent":
            return None, metrics
        if strategy == "pooled":
            return pooled_statistics(client), metrics
        if strategy in ("avg", "truncate"):
            return {C.READOUT: client.readout}, metrics
        features = _anchor_features(client, cache, arrays[C.ANCHORS])
        return {C.Q_ANCHORS: features.astype(np.float64) @ client.readout}, metrics

    def pooled_sweep(self, context: Context, cfg: RunConfig, arrays: Arrays
                     ) -> tuple[Arrays, Metrics]:
        """This client's share of one sweep of the pooled oracle (FedQHDPooled): ``Phi_a^T
        y_a`` of its buffer for the targets of the server's ``readout``, kept in the value
        range of the pooled ``reward-range``. Changes nothing in the client (not saved)."""
        if cfg.resolved_strategy != "pooled":
            raise ValueError(f"a pooled sweep request reached a client of strategy "
                             f"{cfg.resolved_strategy!r}")
        client, _ = node_client(context, cfg)
        lo, hi = (float(v) for v in arrays[C.REWARD_RANGE])
        rhs = client.pooled_rhs(np.asarray(arrays[C.READOUT], dtype=np.float64), (lo, hi))
        return {C.PHI_Y: rhs}, {C.NUM_TRANSITIONS: client.n_transitions}

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        if cfg.privacy == "zcdp":
            return private_evaluate(context, cfg, arrays)
        client, cache = node_client(context, cfg, buffer=False)
        metrics: Metrics = {}
        # not saved: what _adopt changes here, the next train redoes from the same arrays
        # (a teacher compiled here or there, once), and evaluation draws no client RNG
        _adopt(client, cache, arrays, cfg, metrics)
        return _evaluation(context, cfg, client, cache, metrics)


def _evaluation(context: Context, cfg: RunConfig, client: OnlineClient,
                cache: dict[str, Any], adopted: Metrics) -> Metrics:
    """An evaluate reply's metrics for ``client`` after :func:`_adopt` (whose metrics are
    ``adopted``): its transitions, the projection residual, the greedy return."""
    metrics: Metrics = {C.NUM_TRANSITIONS: max(client.n_transitions, 1), **adopted}
    returns = greedy_return(cfg, client.encoder, client.readout,
                            party=partition(context)[0], dynamics=cache["dynamics"])
    metrics[C.RETURN_MEAN] = float(returns.mean())
    metrics[C.RETURN_STD] = float(returns.std())
    return metrics


LEARNER = FQIOnline()
