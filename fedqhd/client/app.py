"""The fedqhd ClientApp: a private shard, the client's own encoder, a local learner.

Only Q-function summaries leave the client: a readout (shared encoder) or
Q-values on the server's anchor states (heterogeneous encoders). The shard is
read from the node's data folder (node config ``data-dir``, else run config
``data-dir``) or generated deterministically from (seed, partition-id).

With ``learner = "pool"`` the handlers dispatch to :mod:`fedqhd.client.pool_learner`
(private inventory shard, one noisy release kept in ``context.state``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedqhd.client import pool_learner
from fedqhd.client.learners import FQILearner, greedy_policy
from fedqhd.config import RunConfig
from fedqhd.data import Shard, client_shard
from fedqhd.encoders import heterogeneous_encoder_params, shared_encoder_params
from fedqhd.envs import get_spec, rollout_returns
from fedqhd.strategies import contract as C

app = ClientApp()

STATE_ADMM = "fedqhd-admm"  #: context.state ArrayRecord: the ADMM client's last "reply"

#: learners kept in this process between rounds (encoded shard and factorisations), for
#: every node of the current run this process serves (a Ray actor serves many nodes);
#: a new process rebuilds the same learner deterministically
_LEARNERS: dict[tuple[Any, ...], tuple[FQILearner, Shard]] = {}


def node_learner(context: Context, cfg: RunConfig) -> tuple[FQILearner, Shard]:
    """This node's learner and shard (built once per process)."""
    pid = int(context.node_config["partition-id"])
    n_parts = int(context.node_config["num-partitions"])
    data_dir = str(context.node_config.get("data-dir", "")) or cfg.data_dir
    key = (context.run_id, pid, n_parts, data_dir, cfg)
    if key not in _LEARNERS:
        shard = client_shard(cfg.env_id, cfg.partition, pid, n_parts, cfg.episodes_per_client,
                             cfg.seed, data_dir=data_dir or None,
                             epsilon_min=cfg.epsilon_min, epsilon_max=cfg.epsilon_max)
        spec = get_spec(cfg.env_id)
        params = (shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth)
                  if cfg.encoder == "shared"
                  else heterogeneous_encoder_params(cfg.seed, pid, cfg.bandwidth))
        learner = FQILearner(shard, params.build(spec.obs_bound), spec.n_actions,
                             gamma=cfg.gamma, ridge=local_ridge(cfg.ridge, n_parts),
                             proximal=local_proximal(cfg, shard.n_transitions),
                             compile_ridge=cfg.ridge)
        for stale in [k for k in _LEARNERS if k[0] != context.run_id or k[4] != cfg]:
            del _LEARNERS[stale]  # free what earlier runs left in this process
        _LEARNERS[key] = (learner, shard)
    return _LEARNERS[key]


def local_ridge(ridge: float, num_partitions: int) -> float:
    """Each of n clients carries ``ridge / n`` of the pooled objective's penalty, so the
    clients' objectives add up to the pooled one; a client penalising with the full
    ``ridge`` over-smooths, and the average of over-smoothed fits stays over-smoothed."""
    return ridge / num_partitions


def uses_admm(cfg: RunConfig) -> bool:
    """Consensus ADMM applies to readout averaging (shared encoder) only."""
    return cfg.resolved_strategy == "avg" and cfg.client_update == "admm"


def local_proximal(cfg: RunConfig, n_transitions: int) -> float:
    """The learner's proximal weight: ADMM's penalty is per transition (so the server's
    transition-weighted mean is the consensus step), the plain pull is absolute."""
    return cfg.admm_penalty * n_transitions if uses_admm(cfg) else cfg.proximal


def _last_admm_reply(context: Context) -> np.ndarray | None:
    if STATE_ADMM not in context.state:
        return None
    return context.state[STATE_ADMM]["reply"].numpy()


def _reply(msg: Message, arrays: dict[str, np.ndarray] | None,
           metrics: dict[str, float]) -> Message:
    content = RecordDict({C.METRICS: MetricRecord(metrics)})
    if arrays is not None:
        content[C.ARRAYS] = C.to_array_record(arrays)
    return Message(content, reply_to=msg)


def _adopt_global(learner: FQILearner, arrays: dict[str, np.ndarray],
                  metrics: dict[str, float]) -> None:
    """Set the learner's readout from what the server sent: the global readout, or the
    compiled teacher (recording the projection residual)."""
    if C.READOUT in arrays:
        learner.readout = arrays[C.READOUT]
    elif C.TEACHER in arrays:
        metrics[C.PROJECTION_RESIDUAL] = learner.compile(arrays[C.ANCHORS], arrays[C.TEACHER])
    else:
        learner.readout = np.zeros_like(learner.readout)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Adopt the global Q-function, run local FQI sweeps pulled toward it, reply
    (admm: one consensus step, its dual kept in ``context.state``; pool: reply the
    client's values on the anchors and its privacy ledger)."""
    arrays = C.from_array_record(msg.content[C.ARRAYS])
    if (cfg := RunConfig.from_run_config(context.run_config)).learner == "pool":
        return _reply(msg, *pool_learner.train_reply(context, cfg, arrays))
    learner, _ = node_learner(context, cfg)
    metrics: dict[str, float] = {C.NUM_TRANSITIONS: learner.n_transitions}
    if C.READOUT in arrays and uses_admm(cfg):
        # identifies the client to the server's latest-reply memory across node restarts
        metrics[C.PARTITION_ID] = int(context.node_config["partition-id"])
        reply, step = learner.consensus_step(arrays[C.READOUT], cfg.local_iterations,
                                             _last_admm_reply(context))
        context.state[STATE_ADMM] = C.to_array_record({"reply": reply})
        return _reply(msg, {C.READOUT: reply}, {**metrics, **step})
    _adopt_global(learner, arrays, metrics)
    metrics.update(learner.train(cfg.local_iterations, start=learner.readout))
    if C.READOUT in arrays:
        return _reply(msg, {C.READOUT: learner.readout}, metrics)
    return _reply(msg, {C.Q_ANCHORS: learner.q_values(arrays[C.ANCHORS])}, metrics)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Greedy return of the global Q-function as this client's features express it
    (compiled teacher, or the shared readout), in this client's own environment
    (pool: gap of the client's own and of its teacher-informed policy)."""
    arrays = C.from_array_record(msg.content[C.ARRAYS])
    if (cfg := RunConfig.from_run_config(context.run_config)).learner == "pool":
        return _reply(msg, None, pool_learner.evaluate_metrics(context, cfg, arrays))
    learner, shard = node_learner(context, cfg)
    metrics: dict[str, float] = {C.NUM_TRANSITIONS: learner.n_transitions}
    _adopt_global(learner, arrays, metrics)
    pid = int(context.node_config["partition-id"])
    returns = rollout_returns(cfg.env_id, greedy_policy(learner.encoder, learner.readout),
                              cfg.eval_episodes, seed=evaluation_seed(cfg.seed, pid),
                              dynamics=shard.metadata.get("dynamics") or None)
    metrics[C.RETURN_MEAN] = float(returns.mean())
    metrics[C.RETURN_STD] = float(returns.std())
    return _reply(msg, None, metrics)


def evaluation_seed(seed: int, stream: int) -> int:
    """Episode seeds for evaluation, fixed per (run seed, evaluator) so that rounds are
    compared on the same start states, and disjoint from data-collection seeds."""
    return int(np.random.SeedSequence([seed, stream, 0xE7A1]).generate_state(1)[0])
