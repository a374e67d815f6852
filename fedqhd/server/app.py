"""The fedqhd ServerApp: picks the strategy from the run config, evaluates, writes results.

Shared encoder: ``FedQHDAvg``; the server rebuilds the shared encoder from the
seed and evaluates the global readout's greedy policy in the real environment.
Heterogeneous encoders: ``FedQHDAnchor``; each client evaluates its compiled
policy (federated evaluation) and the server records the weighted mean.
``learner = "pool"``: a privacy-screening ``FedQHDAnchor`` on (state, action)
anchors (:mod:`fedqhd.server.pool`); the server scores the federated policy's gap
against c*, clients report their own and teacher-informed gaps, and the final
entry of ``results.json`` holds every client's privacy ledger.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedqhd.anchors import make_anchors
from fedqhd.client.app import evaluation_seed
from fedqhd.client.learners import greedy_policy
from fedqhd.config import RunConfig
from fedqhd.encoders import shared_encoder_params
from fedqhd.envs import get_spec, rollout_returns
from fedqhd.server.pool import PrivateAnchor, pool_setup
from fedqhd.server.results import RunRecorder, new_run_dir
from fedqhd.strategies import FedQHDAnchor, FedQHDAvg
from fedqhd.strategies import contract as C
from fedqhd.strategies.base import FunctionSpaceStrategy

app = ServerApp()

SERVER_EVALUATOR = 2**31 - 1  #: evaluation-seed stream of the server (clients use partition ids)


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = RunConfig.from_run_config(context.run_config)
    run_federation(grid, cfg)


def run_federation(grid: Grid, cfg: RunConfig) -> tuple[dict[str, Any], Path]:
    """Run ``cfg.num_server_rounds`` rounds on ``grid``; returns (final entry, run folder)."""
    random.seed(cfg.seed)  # Flower samples nodes with Python's random
    np.random.seed(cfg.seed)
    out_dir = new_run_dir(cfg.output_dir)
    log(INFO, "fedqhd: results of this run go to %s", out_dir)
    kwargs = {"weighting": cfg.weighting, "fraction_train": cfg.fraction_train,
              "min_train_nodes": min(cfg.min_nodes, 2), "min_available_nodes": cfg.min_nodes}
    strategy: FunctionSpaceStrategy
    server_eval: Callable[[ArrayRecord], MetricRecord | None] | None = None
    if cfg.learner == "pool":
        strategy, server_eval, extra = pool_setup(
            cfg, min_evaluate_nodes=min(cfg.min_nodes, 2), **kwargs)
        initial = strategy.initial_arrays()
    elif cfg.resolved_strategy == "avg":
        spec = get_spec(cfg.env_id)
        # ADMM's consensus is over all clients: keep every node's latest reply
        strategy = FedQHDAvg(fraction_evaluate=0.0, **kwargs,
                             aggregate="latest" if cfg.client_update == "admm" else "sampled")
        dim = cfg.hd_dim
        initial = C.to_array_record({C.READOUT: np.zeros((dim, spec.n_actions))})
        encoder = shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth).build(
            spec.obs_bound)
        extra = {"readout-shape": [dim, spec.n_actions]}

        def server_eval(arrays: ArrayRecord) -> MetricRecord:
            returns = rollout_returns(cfg.env_id, greedy_policy(encoder, arrays[C.READOUT].numpy()),
                                      cfg.eval_episodes,
                                      seed=evaluation_seed(cfg.seed, SERVER_EVALUATOR))
            return MetricRecord({C.RETURN_MEAN: float(returns.mean()),
                                 C.RETURN_STD: float(returns.std())})
    else:
        spec = get_spec(cfg.env_id)
        anchors = make_anchors(cfg.anchor_source, cfg.env_id, cfg.num_anchors,
                               seed=cfg.seed, path=cfg.anchor_file)
        strategy = FedQHDAnchor(anchors, spec.n_actions, fraction_evaluate=1.0,
                                min_evaluate_nodes=min(cfg.min_nodes, 2), **kwargs)
        initial = strategy.initial_arrays()
        extra = {"anchors-shape": list(anchors.shape)}
    recorder = RunRecorder(cfg, out_dir, extra)

    def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        row: dict[str, Any] = {"round": server_round}
        row.update(_plain(strategy.last_train_metrics))
        row.update(_plain(strategy.last_evaluate_metrics))
        metrics = server_eval(arrays) if server_eval is not None else None
        row.update(_plain(metrics))
        recorder.record_round(row)
        if C.GAP in row:
            log(INFO, "fedqhd pool round %d/%d: federated gap %.1f%% | clients alone %.1f%%, "
                "teacher-informed %.1f%% | replies ok %s failed %s refused non-private %s",
                server_round, cfg.num_server_rounds, row[C.GAP],
                row.get(C.GAP_OWN, float("nan")), row.get(C.GAP_INFORMED, float("nan")),
                row.get(C.REPLIES_OK, 0), row.get(C.REPLIES_FAILED, 0),
                row.get(C.REPLIES_REFUSED_NON_PRIVATE, 0))
            return metrics
        gap = (f" | consensus gap {row[C.CONSENSUS_GAP]:.3g}" if C.CONSENSUS_GAP in row else "")
        log(INFO, "fedqhd round %d/%d: return %.1f +- %.1f | bellman residual %.3g%s | "
            "replies ok %s failed %s rejected %s", server_round, cfg.num_server_rounds,
            row.get(C.RETURN_MEAN, float("nan")), row.get(C.RETURN_STD, float("nan")),
            row.get(C.BELLMAN_RESIDUAL, float("nan")), gap, row.get(C.REPLIES_OK, 0),
            row.get(C.REPLIES_FAILED, 0), row.get(C.REPLIES_REJECTED, 0))
        return metrics

    result = strategy.start(grid, initial, num_rounds=cfg.num_server_rounds,
                            timeout=cfg.round_timeout,
                            train_config=ConfigRecord({}), evaluate_fn=after_round)
    ledgers = ({"privacy-ledgers": {str(pid): entry for pid, entry
                                    in sorted(strategy.ledgers.items())},
                "gap-percent": recorder.rounds[-1].get(C.GAP) if recorder.rounds else None}
               if isinstance(strategy, PrivateAnchor) else None)
    final = recorder.finish(C.from_array_record(result.arrays or initial), ledgers)
    log(INFO, "fedqhd: final greedy return %.1f +- %.1f after %s rounds; results in %s",
        final["return-mean"] or float("nan"), final["return-std"] or float("nan"),
        final["round"], out_dir)
    return final, out_dir


def _plain(metrics: MetricRecord | None) -> dict[str, Any]:
    return {} if metrics is None else {k: v for k, v in metrics.items()}
