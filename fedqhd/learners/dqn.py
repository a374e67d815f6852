"""FedAvg-DQN in the Flower app: the FedQHD paper's deep baseline (``learner = "dqn"``).

Every round each client loads the global network, runs ``episodes-per-round``
epsilon-greedy episodes in its own env copy, one Adam step on a replay minibatch
after every env step (:class:`fedqhd.baselines.dqn.DQNClients` holding this one
client, its replay buffer, Adam state and epsilon kept in the process that serves
the node), and replies its network flattened (``"network"``); the server averages
the networks (:class:`~fedqhd.strategies.FedQHDAvg` with ``array_key="network"``:
plain FedAvg, screened like every fedqhd strategy) and evaluates the global
network's greedy policy. Every reply carries ``train-return-last100``.

Needs JAX and optax (the optional extra ``dqn``); without them the run config is
refused with the install command. Same network init, exploration streams and
settings as :func:`fedqhd.baselines.dqn.run_fedavg_dqn`, but not bit-identical to it:
in process one minibatch stream serves all clients and XLA computes them vectorised;
here each node draws its own minibatches and computes alone.
"""

from __future__ import annotations

import importlib.util
import secrets
from collections.abc import Sequence
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord

from fedqhd.baselines.dqn import (
    PAPER_HIDDEN,
    DQNClients,
    initial_network,
    mlp_q,
    network_shapes,
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
    reply_counts_text,
)
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, with_train_return
from fedqhd.seeding import SERVER, evaluation_seed
from fedqhd.strategies import FedQHDAvg
from fedqhd.strategies import contract as C

#: this process's DQN clients, by (run, partition, partitions, config): replay, Adam,
#: epsilon, episode returns, and the version of the node's context.state they belong to
_CLIENTS: dict[tuple[Any, ...], tuple[DQNClients, list[float], str]] = {}
STATE_META = "fedqhd-dqn-meta"  #: context.state ConfigRecord: version of the node's client

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


def _state_version(context: Context) -> str:
    if STATE_META not in context.state:
        return ""
    return str(context.state[STATE_META]["version"])  # type: ignore[index]


def node_client(context: Context, cfg: RunConfig) -> tuple[DQNClients, list[float]]:
    """This node's DQN client (built on its first message) and its episode returns.

    The client (replay buffer, Adam state, epsilon) lives in the process that serves the
    node; ``context.state`` holds only its version. A node whose state says it was served
    before by another process (Flower's Ray actor pool has no node affinity) raises
    rather than continue from a partial copy."""
    pid, n_parts = partition(context)
    key = (context.run_id, pid, n_parts, cfg)
    version = _state_version(context)
    cached = _CLIENTS.get(key)
    if cached is not None and cached[2] == version:
        return cached[0], cached[1]
    if version:
        raise RuntimeError(
            f"learner 'dqn': node {context.node_id} (partition {pid}) was served by another "
            "process since this process last saw it (its replay buffer and optimiser live "
            "in one process); run it in process, or under Ray with one actor "
            "(client-resources-num-cpus = the machine's CPUs)")
    dynamics = partition_settings(cfg.partition, pid, n_parts, cfg.seed,
                                  env_id=cfg.env_id)["dynamics"]
    client = DQNClients(cfg.env_id, 1, cfg.seed, hidden=PAPER_HIDDEN, gamma=cfg.gamma,
                        eps_start=cfg.epsilon_start, eps_decay=cfg.epsilon_decay,
                        eps_min=cfg.epsilon_floor, dynamics=dynamics or None,
                        first_client=pid)
    for stale in [k for k in _CLIENTS if k == key or k[0] != context.run_id or k[3] != cfg]:
        _CLIENTS.pop(stale)[0].close()
    _CLIENTS[key] = (client, [], version)
    return client, _CLIENTS[key][1]


def _save_version(context: Context, cfg: RunConfig) -> None:
    """A new version of the node's client, in ``context.state`` and this process's copy."""
    pid, n_parts = partition(context)
    key = (context.run_id, pid, n_parts, cfg)
    version = secrets.token_hex(8)
    context.state[STATE_META] = ConfigRecord({"version": version})
    client, returns, _ = _CLIENTS[key]
    _CLIENTS[key] = (client, returns, version)

class FedAvgDQN:
    """Registry entry ``dqn``."""

    name = "dqn"
    log_label = "fedqhd"
    curves = Curves("return", ((C.RETURN_MEAN, "greedy return of the global network"),
                               (TRAIN_RETURN_LAST100, "training return, clients' last 100 "
                                                      "episodes (the paper's metric)")),
                    band=(C.RETURN_STD, "+- std of the greedy return over episodes"))

    def title(self, cfg: RunConfig) -> str:
        return f"{cfg.env_id}: FedAvg-DQN, {cfg.episodes_per_round} episodes per round"

    def check_config(self, cfg: RunConfig) -> str | None:
        problem = env_problem(self.name, tuple(ENV_IDS), cfg.env_id)
        if problem:
            return problem
        missing = [m for m in ("jax", "optax") if importlib.util.find_spec(m) is None]
        if missing:
            return (f"run-config key 'learner' = 'dqn' needs {' and '.join(missing)}: install "
                    "the optional extra, pip install 'fedqhd[dqn]'")
        if cfg.protocol != "online":
            return ("run-config key 'learner' = 'dqn' (FedAvg-DQN learns from the episodes it "
                    f"collects) needs 'protocol' = 'online', got {cfg.protocol!r}")
        if cfg.strategy not in ("auto", "avg"):
            return (f"run-config key 'strategy' = {cfg.strategy!r}: learner 'dqn' is FedAvg "
                    "of networks, strategy 'auto' or 'avg'")
        if cfg.partition == "dynamics-skew" and not get_spec(cfg.env_id).dynamics_ranges:
            return (f"run-config key 'partition' = 'dynamics-skew' needs an env with dynamics "
                    f"parameters; {cfg.env_id!r} registers none")
        return None

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        shapes = _shapes(cfg)
        kwargs = {k: v for k, v in strategy_kwargs.items() if k != "min_evaluate_nodes"}
        strategy = FedQHDAvg(fraction_evaluate=0.0, array_key=C.NETWORK, **kwargs)

        def evaluate(arrays: ArrayRecord) -> MetricRecord:
            returns = _greedy_returns(cfg, unpack(arrays[C.NETWORK].numpy(), shapes), SERVER)
            return MetricRecord({C.RETURN_MEAN: float(returns.mean()),
                                 C.RETURN_STD: float(returns.std())})

        initial = C.to_array_record({C.NETWORK: pack(initial_network(cfg.env_id, cfg.seed))})
        return with_train_return(ServerPlan(strategy, initial, evaluate,
                                            {"network-shapes": [list(s) for s in shapes]}))

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        nan = float("nan")
        return (f"train return (last 100) {row.get(TRAIN_RETURN_LAST100, nan):.1f} | greedy "
                f"return {row.get(C.RETURN_MEAN, nan):.1f} +- {row.get(C.RETURN_STD, nan):.1f} "
                f"| {reply_counts_text(row)}")

    def final_report(self, plan: ServerPlan, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
        return None

    def final_line(self, final: dict[str, Any]) -> str:
        return greedy_final_line(final)

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        """Load the global network (target network reset to it, Adam state kept), collect
        and train on ``episodes-per-round`` episodes, reply the network."""
        client, returns = node_client(context, cfg)
        client.set_parameters(unpack(arrays[C.NETWORK], _shapes(cfg)), 0)
        returns.extend(client.collect_and_train(cfg.episodes_per_round)[0].tolist())
        _save_version(context, cfg)
        metrics: Metrics = {C.NUM_TRANSITIONS: int(client.transitions[0]),
                            TRAIN_RETURN_LAST100: float(np.mean(returns[-100:]))}
        return {C.NETWORK: pack(client.get_parameters(0))}, metrics

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        """Greedy return of the global network in this client's own environment."""
        client, _ = node_client(context, cfg)
        pid, n_parts = partition(context)
        dynamics = partition_settings(cfg.partition, pid, n_parts, cfg.seed,
                                      env_id=cfg.env_id)["dynamics"]
        returns = _greedy_returns(cfg, unpack(arrays[C.NETWORK], _shapes(cfg)), pid, dynamics)
        return {C.NUM_TRANSITIONS: max(int(client.transitions[0]), 1),
                C.RETURN_MEAN: float(returns.mean()), C.RETURN_STD: float(returns.std())}


LEARNER = FedAvgDQN()
