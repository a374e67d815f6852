"""The fedqhd ServerApp: the learner registry picks the strategy and the evaluation; this
module runs the rounds and writes the results.

What each learner does (``fqi``: FedQHDAvg with server-side greedy evaluation, or
FedQHDAnchor with federated evaluation; ``pool``: a privacy-screened FedQHDAnchor
scored by its gap against c*) is in :mod:`fedqhd.learners`.
"""

from __future__ import annotations

from logging import ERROR, INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners import get_learner
from fedqhd.seeding import seed_globals
from fedqhd.server.results import RunRecorder, new_run_dir
from fedqhd.strategies import contract as C

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config first (importing ``env-module``): a bad key raises
    :class:`~fedqhd.config.ConfigError` naming it, and Flower marks the run failed."""
    try:
        cfg = RunConfig.from_run_config(context.run_config)
    except ConfigError as exc:
        log(ERROR, "fedqhd: invalid run config, the run stops: %s", exc)
        raise
    run_federation(grid, cfg)


def run_federation(grid: Grid, cfg: RunConfig) -> tuple[dict[str, Any], Path]:
    """Run ``cfg.num_server_rounds`` rounds on ``grid``; returns (final entry, run folder)."""
    seed_globals(cfg.seed)  # Flower samples nodes with Python's random
    out_dir = new_run_dir(cfg.output_dir)
    log(INFO, "fedqhd: results of this run go to %s", out_dir)
    learner = get_learner(cfg.learner_key)
    plan = learner.server_plan(cfg, weighting=cfg.weighting, fraction_train=cfg.fraction_train,
                               min_train_nodes=min(cfg.min_nodes, 2),
                               min_evaluate_nodes=min(cfg.min_nodes, 2),
                               min_available_nodes=cfg.min_nodes)
    recorder = RunRecorder(cfg, out_dir, plan.run_info)

    def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        if server_round == 0:
            return None
        metrics = plan.evaluate(arrays) if plan.evaluate is not None else None
        row: dict[str, Any] = {"round": server_round}
        for record in (plan.strategy.last_train_metrics,  # type: ignore[attr-defined]
                       plan.strategy.last_evaluate_metrics, metrics):  # type: ignore[attr-defined]
            row.update(dict(record.items()) if record is not None else {})
        recorder.record_round(row)
        log(INFO, "%s round %d/%d: %s", learner.log_label, server_round, cfg.num_server_rounds,
            learner.round_line(cfg, row))
        return metrics

    result = plan.strategy.start(grid, plan.initial_arrays, num_rounds=cfg.num_server_rounds,
                                 timeout=cfg.round_timeout, train_config=ConfigRecord({}),
                                 evaluate_fn=after_round)
    final = recorder.finish(C.from_array_record(result.arrays or plan.initial_arrays),
                            learner.final_report(plan, recorder.rounds))
    log(INFO, "fedqhd: final greedy return %.1f +- %.1f after %s rounds; results in %s",
        final["return-mean"] or float("nan"), final["return-std"] or float("nan"),
        final["round"], out_dir)
    return final, out_dir
