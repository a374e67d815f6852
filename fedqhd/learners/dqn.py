"""The FedQHD paper's deep baselines in the Flower app (``learner = "dqn"``).

Every round each client runs ``episodes-per-round`` epsilon-greedy episodes in its own
env copy, one Adam step on a replay minibatch after every env step
(:class:`fedqhd.baselines.dqn.DQNClients` holding this one client), and replies:

* FedAvg-DQN (``strategy = "auto"`` or ``"avg"``, shared ``encoder``): the client first
  loads the global network (target network reset to it, Adam state kept) and replies its
  network flattened (``"network"``); the server averages the networks
  (:class:`~fedqhd.strategies.FedQHDAvg` with ``array_key="network"``: plain FedAvg,
  screened like every fedqhd strategy) and evaluates the global network's greedy policy.
* Distillation FedDQN (``strategy = "anchor"``; ``encoder = "heterogeneous"`` gives
  the clients the cycled hidden widths of :data:`~fedqhd.baselines.dqn.HETERO_WIDTHS`):
  clients keep their own networks (independent inits) and reply their Q-values on the
  run's anchor states (:class:`~fedqhd.strategies.FedQHDAnchor`, the anchors the bench
  draws); each client takes ``distill_steps`` Adam steps of
  ``KL(softmax(teacher / tau) || softmax(Q / tau))`` toward the teacher once, at the
  round's evaluation (or its next train if it was not evaluated), and evaluates its own
  network. Settings: :data:`~fedqhd.baselines.dqn.DISTILL_SETTINGS`.

Offline FedAvg-DQN (``protocol = "offline"``; FedAvg only): no env steps; each round a
client loads the global network and takes ``local-iterations`` Adam steps of the same TD
update on minibatches of 64 drawn from its own shard (the shard is its replay buffer;
target network: the global network, copied every 500 steps; fresh Adam each round,
:func:`fedqhd.baselines.dqn.offline_train`), and replies its network. The client keeps
nothing between rounds; its minibatches are drawn from a stream of (seed, partition,
the received network). With ``privacy = "dp-fedavg"`` the server wraps the FedAvg strategy
in Flower's server-side fixed-clipping DP wrapper (:mod:`fedqhd.strategies.dp`: clip every
update to ``privacy-clip-norm``, uniform mean, Gaussian noise of noise multiplier
``sqrt(num-server-rounds / (2 privacy-rho))``; client-level DP with a trusted server).

Every online reply carries ``train-return-last100``. The paper suite (``fedqhd bench --suite
paper``, methods ``fedavg-dqn`` and ``distill-dqn``) runs this app in process.

A node's client (networks, target, both Adam states, replay rows and pointer, RNG
states, epsilon, counters, episode returns, the last distilled teacher's digest) lives in
its ``context.state``, written after every reply that changed it with a new version token
(:class:`~fedqhd.learners.nodestate.NodeStates`): Flower's Ray actor pool serves a node's
messages from whichever actor is free. A process's copy is used only at the Context's
version; otherwise the client is rebuilt from ``context.state``, bit for bit.

Needs JAX and optax (the optional extra ``dqn``); without them the run config is
refused with the install command.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord

from fedqhd.baselines.dqn import (
    DISTILL_SETTINGS,
    PAPER_HIDDEN,
    DQNClients,
    distill_hidden,
    initial_network,
    initial_networks,
    mlp_q,
    network_shapes,
    offline_train,
)
from fedqhd.config import RunConfig
from fedqhd.data.partition import partition_settings
from fedqhd.envs import ENV_IDS, batch_rollout_returns, get_spec
from fedqhd.learners.base import (
    Arrays,
    Curves,
    Metrics,
    ServerPlan,
    env_problem,
    greedy_final_line,
    partition,
    reference_report,
    reply_counts_text,
)
from fedqhd.learners.fqi import anchor_plan, generated_shard_problem, node_shard
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, with_train_return
from fedqhd.learners.nodestate import NodeStates
from fedqhd.privacy.ledger import REPORTED_DELTA
from fedqhd.seeding import SERVER, dqn_offline_rng, evaluation_seed
from fedqhd.strategies import FedQHDAvg
from fedqhd.strategies import contract as C
from fedqhd.strategies.dp import DP_FEDAVG, DPFedAvg, accounting, noise_multiplier

DISTILL_KL_BEFORE = "distill-kl-before"  #: reply metric: KL to the teacher before its steps
DISTILL_KL_AFTER = "distill-kl-after"  #: reply metric: and after
TD_LOSS_START = "td-loss-start"  #: offline reply metric: mean TD loss of the round's first steps
TD_LOSS_END = "td-loss-end"  #: offline reply metric: and of its last steps
#: Adam steps averaged in the offline loss metrics (at most a tenth of the round's)
_LOSS_WINDOW = 50
_INFO_KEYS = ("teacher-digest",)  # node facts in context.state beside the client's


@dataclass
class DQNNode:
    """One node's DQN client, its training episode returns and its last distillation."""

    client: DQNClients
    returns: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  #: _INFO_KEYS


#: the nodes' states in context.state, and this process's copies
STATES: NodeStates[DQNNode] = NodeStates("fedqhd-dqn", close=lambda node: node.client.close())


def pack(params: Sequence[np.ndarray]) -> np.ndarray:
    """The network's arrays flattened into one float32 vector (the ``"network"`` array)."""
    return np.concatenate([np.asarray(a, np.float32).ravel() for a in params])


def unpack(vector: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Inverse of :func:`pack` for arrays of ``shapes`` (float32)."""
    sizes = [int(np.prod(s)) for s in shapes]
    if vector.shape != (sum(sizes),):
        raise ValueError(f"a network of shapes {list(shapes)} has {sum(sizes)} parameters, "
                         f"got an array of shape {vector.shape}")
    parts = np.split(np.asarray(vector, np.float32), np.cumsum(sizes)[:-1])
    return [p.reshape(s) for p, s in zip(parts, shapes, strict=True)]


def _shapes(cfg: RunConfig) -> list[tuple[int, ...]]:
    spec = get_spec(cfg.env_id)
    return network_shapes(spec.obs_dim, spec.n_actions, PAPER_HIDDEN)


def _greedy_returns(cfg: RunConfig, params: Sequence[np.ndarray], party: int,
                    dynamics: dict[str, float] | None = None) -> np.ndarray:
    return batch_rollout_returns(cfg.env_id, lambda s: np.argmax(mlp_q(params, s), axis=1),
                                 cfg.eval_episodes, seed=evaluation_seed(cfg.seed, party),
                                 dynamics=dynamics or None)


def is_distillation(cfg: RunConfig) -> bool:
    """Distillation FedDQN (``strategy`` anchor), else FedAvg-DQN."""
    return cfg.resolved_strategy == "anchor"


def distill_setting(cfg: RunConfig) -> str:
    """The distillation setting of ``cfg``: one architecture (shared ``encoder``) or the
    cycled widths (heterogeneous)."""
    return "shared" if cfg.encoder == "shared" else "heterogeneous"


def _hidden(cfg: RunConfig, client: int) -> tuple[int, int]:
    return distill_hidden(distill_setting(cfg), client) if is_distillation(cfg) else PAPER_HIDDEN


def _dynamics(cfg: RunConfig, pid: int, n_parts: int) -> dict[str, float]:
    return partition_settings(cfg.partition, pid, n_parts, cfg.seed,
                              env_id=cfg.env_id)["dynamics"]


def _new_node(cfg: RunConfig, pid: int, n_parts: int) -> DQNNode:
    """A fresh client of partition ``pid``: client ``pid`` of the in-process run (its
    exploration and minibatch streams; under distillation its own initial network and the
    run's widest shapes, as the in-process run pads it)."""
    hidden = [_hidden(cfg, i) for i in range(n_parts)]
    networks = ([initial_networks(cfg.env_id, cfg.seed, hidden[:pid + 1])[pid]]
                if is_distillation(cfg) else None)  # FedAvg: the global network, each round
    client = DQNClients(cfg.env_id, 1, cfg.seed, hidden=[hidden[pid]], gamma=cfg.gamma,
                        eps_start=cfg.online.epsilon[0], eps_decay=cfg.online.epsilon[1],
                        eps_min=cfg.online.epsilon[2],
                        dynamics=_dynamics(cfg, pid, n_parts) or None, first_client=pid,
                        networks=networks,
                        pad_to=(max(h[0] for h in hidden), max(h[1] for h in hidden)),
                        as_nodes=True)
    return DQNNode(client)


def _restore(node: DQNNode, arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    node.client.restore(arrays, meta)
    node.returns = [float(r) for r in arrays["episode-returns"]]
    node.info = {k: meta[k] for k in _INFO_KEYS if k in meta}


def node_client(context: Context, cfg: RunConfig) -> DQNNode:
    """This node's client: this process's copy when it is the version in
    ``context.state``, else rebuilt from ``context.state`` (fresh on the first message)."""
    pid, n_parts = partition(context)
    return STATES.load(context, cfg, lambda: _new_node(cfg, pid, n_parts), _restore)


def save_node(context: Context, cfg: RunConfig, node: DQNNode) -> None:
    """Write the node's client into ``context.state`` under a new version."""
    arrays, scalars = node.client.snapshot()
    arrays["episode-returns"] = np.asarray(node.returns, dtype=np.float64)
    STATES.save(context, cfg, node, arrays, {**scalars, **node.info})


def _adopt(node: DQNNode, cfg: RunConfig, arrays: Arrays, metrics: Metrics) -> bool:
    """Start from the global model: load the global network (FedAvg), or distil the
    teacher, once (a teacher distilled at evaluation is not distilled again by the next
    train, which receives the same one; the KLs are reported by the call that distilled).
    True when the client changed."""
    if C.NETWORK in arrays:
        node.client.set_parameters(unpack(arrays[C.NETWORK], _shapes(cfg)), 0)
        return True
    if C.TEACHER not in arrays:
        return False
    teacher = np.ascontiguousarray(arrays[C.TEACHER], dtype=np.float64)
    digest = hashlib.sha1(teacher.tobytes()).hexdigest()
    if node.info.get("teacher-digest") == digest:
        return False
    before, after = node.client.distill(arrays[C.ANCHORS], teacher, DISTILL_SETTINGS["tau"],
                                        DISTILL_SETTINGS["distill_steps"])
    node.info = {"teacher-digest": digest}
    metrics.update({DISTILL_KL_BEFORE: float(before[0]), DISTILL_KL_AFTER: float(after[0])})
    return True


class DeepBaselines:
    """Registry entry ``dqn``: FedAvg-DQN or distillation FedDQN."""

    name = "dqn"
    log_label = "fedqhd"
    curves = Curves("return", ((C.RETURN_MEAN, "greedy return (FedAvg: the global network; "
                                               "distillation: the clients' own)"),
                               (TRAIN_RETURN_LAST100, "training return, clients' last 100 "
                                                      "episodes (the paper's metric)")),
                    band=(C.RETURN_STD, "+- std of the greedy return over episodes"),
                    diagnostics=((DISTILL_KL_AFTER, "KL to the teacher after distillation"),))

    def title(self, cfg: RunConfig) -> str:
        if cfg.protocol == "offline":
            dp = (f", DP-FedAvg (z {dp_noise_multiplier(cfg):.3g}, C "
                  f"{cfg.privacy_clip_norm:g})" if cfg.privacy == DP_FEDAVG else "")
            return (f"{cfg.env_id}: offline FedAvg-DQN, {cfg.local_iterations} Adam steps per "
                    f"round{dp}")
        method = (f"distillation FedDQN ({distill_setting(cfg)} widths)"
                  if is_distillation(cfg) else "FedAvg-DQN")
        return f"{cfg.env_id}: {method}, {cfg.episodes_per_round} episodes per round"

    def check_config(self, cfg: RunConfig) -> str | None:
        problem = env_problem(self.name, tuple(ENV_IDS), cfg.env_id)
        if problem:
            return problem
        missing = [m for m in ("jax", "optax") if importlib.util.find_spec(m) is None]
        if missing:
            return (f"run-config key 'learner' = 'dqn' needs {' and '.join(missing)}: install "
                    "the optional extra, pip install 'fedqhd[dqn]'")
        if cfg.protocol == "offline" and is_distillation(cfg):
            return ("run-config key 'protocol' = 'offline' with 'learner' = 'dqn' runs "
                    "FedAvg-DQN only (strategy 'auto' or 'avg', encoder 'shared'); "
                    "distillation FedDQN (strategy 'anchor' or a heterogeneous encoder) needs "
                    "'protocol' = 'online'")
        if cfg.protocol == "offline":
            problem = generated_shard_problem(cfg)
            if problem:
                return problem
        if cfg.strategy not in ("auto", "avg", "anchor"):
            return (f"run-config key 'strategy' = {cfg.strategy!r}: learner 'dqn' runs "
                    "FedAvg-DQN (strategy 'auto' or 'avg', shared encoder) or distillation "
                    "FedDQN (strategy 'anchor', or 'auto' with encoder 'heterogeneous')")
        if cfg.partition == "dynamics-skew" and not get_spec(cfg.env_id).dynamics_ranges:
            return (f"run-config key 'partition' = 'dynamics-skew' needs an env with dynamics "
                    f"parameters; {cfg.env_id!r} registers none")
        return None

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        if is_distillation(cfg):
            plan = anchor_plan(cfg, **strategy_kwargs)
            plan.run_info["distillation"] = {**DISTILL_SETTINGS, "n_anchors": cfg.num_anchors,
                                             "setting": distill_setting(cfg)}
            return with_train_return(plan)
        shapes = _shapes(cfg)
        kwargs = {k: v for k, v in strategy_kwargs.items() if k != "min_evaluate_nodes"}
        info: dict[str, Any] = {"network-shapes": [list(s) for s in shapes]}
        if cfg.privacy == DP_FEDAVG:
            # the noise is calibrated to a uniform mean of clipped updates: no weights and no
            # screening that depends on the other replies (the DP clip bounds every update)
            kwargs.update(weighting="uniform", clip_factor=0.0, norm_bound_factor=0.0)
        strategy: Any = FedQHDAvg(fraction_evaluate=0.0, array_key=C.NETWORK, **kwargs)
        if cfg.privacy == DP_FEDAVG:
            z = dp_noise_multiplier(cfg)
            strategy = DPFedAvg(strategy, z, cfg.privacy_clip_norm, cfg.min_nodes)
            info[DP_FEDAVG] = dp_report(cfg)

        def evaluate(arrays: ArrayRecord) -> MetricRecord:
            returns = _greedy_returns(cfg, unpack(arrays[C.NETWORK].numpy(), shapes), SERVER)
            return MetricRecord({C.RETURN_MEAN: float(returns.mean()),
                                 C.RETURN_STD: float(returns.std())})

        initial = C.to_array_record({C.NETWORK: pack(initial_network(cfg.env_id, cfg.seed))})
        plan = ServerPlan(strategy, initial, evaluate, info)
        return plan if cfg.protocol == "offline" else with_train_return(plan)

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        nan = float("nan")
        kl = (f" | KL to teacher {row[DISTILL_KL_BEFORE]:.3g} -> {row[DISTILL_KL_AFTER]:.3g}"
              if DISTILL_KL_AFTER in row else "")
        if cfg.protocol == "offline":
            return (f"greedy return {row.get(C.RETURN_MEAN, nan):.1f} +- "
                    f"{row.get(C.RETURN_STD, nan):.1f} | TD loss {row.get(TD_LOSS_START, nan):.3g}"
                    f" -> {row.get(TD_LOSS_END, nan):.3g} | {reply_counts_text(row)}")
        return (f"train return (last 100) {row.get(TRAIN_RETURN_LAST100, nan):.1f} | greedy "
                f"return {row.get(C.RETURN_MEAN, nan):.1f} +- {row.get(C.RETURN_STD, nan):.1f}"
                f"{kl} | {reply_counts_text(row)}")

    def final_report(self, cfg: RunConfig, plan: ServerPlan, rows: list[dict[str, Any]]
                     ) -> dict[str, Any] | None:
        report = reference_report(cfg)
        if cfg.privacy == DP_FEDAVG:
            report[DP_FEDAVG] = dp_report(cfg)
        return report

    def final_line(self, final: dict[str, Any]) -> str:
        return greedy_final_line(final)

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        """Adopt the global model, collect and train on ``episodes-per-round`` episodes,
        save the client into ``context.state``, reply the network (FedAvg) or its Q-values
        on the anchors (distillation). Offline: :func:`offline_reply`."""
        if cfg.protocol == "offline":
            return offline_reply(context, cfg, arrays)
        node = node_client(context, cfg)
        metrics: Metrics = {}
        try:
            _adopt(node, cfg, arrays, metrics)
            client = node.client
            node.returns.extend(client.collect_and_train(cfg.episodes_per_round)[0].tolist())
            save_node(context, cfg, node)
        except BaseException:
            STATES.forget(context, cfg)  # the copy moved past context.state
            raise
        metrics.update({C.NUM_TRANSITIONS: int(client.transitions[0]),
                        TRAIN_RETURN_LAST100: float(np.mean(node.returns[-100:]))})
        if is_distillation(cfg):
            return {C.Q_ANCHORS: client.q_values(arrays[C.ANCHORS])[0]}, metrics
        return {C.NETWORK: pack(client.get_parameters(0))}, metrics

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        """Greedy return in this client's own environment: of the global network
        (FedAvg), or of the client's own after distilling the round's teacher."""
        pid, n_parts = partition(context)
        if cfg.protocol == "offline":
            shard = node_shard(context, cfg)
            returns = _greedy_returns(cfg, unpack(arrays[C.NETWORK], _shapes(cfg)), pid,
                                      shard.metadata.get("dynamics"))
            return {C.NUM_TRANSITIONS: shard.n_transitions,
                    C.RETURN_MEAN: float(returns.mean()), C.RETURN_STD: float(returns.std())}
        node = node_client(context, cfg)
        metrics: Metrics = {C.NUM_TRANSITIONS: max(int(node.client.transitions[0]), 1)}
        if is_distillation(cfg):
            if _adopt(node, cfg, arrays, metrics):
                save_node(context, cfg, node)
            params = node.client.get_parameters(0)
        else:
            params = unpack(arrays[C.NETWORK], _shapes(cfg))
        returns = _greedy_returns(cfg, params, pid, _dynamics(cfg, pid, n_parts))
        metrics.update({C.RETURN_MEAN: float(returns.mean()), C.RETURN_STD: float(returns.std())})
        return metrics


def offline_reply(context: Context, cfg: RunConfig, arrays: Arrays
                  ) -> tuple[Arrays | None, Metrics]:
    """Offline FedAvg-DQN's client update: ``local-iterations`` TD steps on this node's
    shard from the global network (:func:`~fedqhd.baselines.dqn.offline_train`), the
    minibatches drawn from (seed, partition id, the received network)."""
    pid, _ = partition(context)
    shard = node_shard(context, cfg)
    network = np.ascontiguousarray(arrays[C.NETWORK], dtype=np.float32)
    rng = dqn_offline_rng(cfg.seed, pid, hashlib.sha1(network.tobytes()).digest())
    data = (shard.observations, shard.actions, shard.rewards, shard.next_observations,
            shard.terminated)
    params, losses = offline_train(unpack(network, _shapes(cfg)), data, cfg.local_iterations,
                                   rng, gamma=cfg.gamma)
    window = max(1, min(_LOSS_WINDOW, len(losses) // 10))
    return {C.NETWORK: pack(params)}, {C.NUM_TRANSITIONS: shard.n_transitions,
                                       TD_LOSS_START: float(losses[:window].mean()),
                                       TD_LOSS_END: float(losses[-window:].mean())}


def dp_noise_multiplier(cfg: RunConfig) -> float:
    """DP-FedAvg's noise multiplier: ``num-server-rounds`` rounds spend ``privacy-rho``."""
    return noise_multiplier(cfg.privacy_rho, cfg.num_server_rounds)


def dp_report(cfg: RunConfig) -> dict[str, Any]:
    """DP-FedAvg's settings and epsilon at :data:`~fedqhd.privacy.ledger.REPORTED_DELTA`
    (:func:`fedqhd.strategies.dp.accounting`; ``min-nodes`` is the ``n`` the noise is
    calibrated on)."""
    return accounting(dp_noise_multiplier(cfg), cfg.privacy_clip_norm, cfg.min_nodes,
                      cfg.num_server_rounds, REPORTED_DELTA)


LEARNER = DeepBaselines()
