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
from fedqhd.server.window import for_simulation
from fedqhd.strategies import contract as C

app = ServerApp()


class RunFailed(RuntimeError):
    """The run ended without a usable federation (``final.status = "failed"``)."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config first (importing ``env-module``): a bad key raises
    :class:`~fedqhd.config.ConfigError` naming it, and Flower marks the run failed."""
    try:
        cfg = RunConfig.from_run_config(context.run_config)
    except ConfigError as exc:
        log(ERROR, "fedqhd: invalid run config, the run stops: %s", exc)
        raise
    # Flower's simulation polls every stored message per node: keep few stored at once
    final, out_dir = run_federation(for_simulation(grid, cfg.sim_window), cfg)
    if final.get("status") == "failed":
        # Flower 1.42 logs a ServerApp exception, marks the run "finished:failed" with the
        # message as its details, and exits flwr-serverapp with a non-zero code
        raise RunFailed(f"fedqhd run failed: {final.get('reason')} (results in {out_dir})")


def strategy_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The strategy settings of a run config (sampling, weighting, safeguards)."""
    return dict(weighting=cfg.weighting, fraction_train=cfg.fraction_train,
                min_train_nodes=min(cfg.min_nodes, 2), min_evaluate_nodes=min(cfg.min_nodes, 2),
                min_available_nodes=cfg.min_nodes, aggregation=cfg.aggregation,
                trim_fraction=cfg.trim_fraction, clip_factor=cfg.clip_factor,
                norm_bound_factor=cfg.norm_bound_factor,
                weight_cap_factor=cfg.weight_cap_factor, stale_rounds=cfg.stale_rounds,
                node_wait_timeout=cfg.node_wait_timeout)


def run_status(rows: list[dict[str, Any]], cfg: RunConfig) -> dict[str, Any]:
    """``status`` (``completed`` or ``failed``, with the ``reason``) and the run's train
    reply totals, from its round rows."""
    totals = {key: int(sum(r.get(key, 0) for r in rows)) for key in C.REPLY_COUNTS
              if key != C.CLIENTS_AVERAGED}
    sampled, ok = totals[C.REPLIES_SAMPLED], totals[C.REPLIES_OK]
    fraction = ok / sampled if sampled else 0.0
    out: dict[str, Any] = {"status": "completed", "reason": None,
                           "success-fraction": round(fraction, 6), "replies": totals}
    if not rows or not any(r.get(C.REPLIES_OK, 0) > 0 for r in rows):
        out.update(status="failed", reason="no round aggregated a single reply")
    elif fraction < cfg.min_success_fraction:
        out.update(status="failed", reason=(
            f"{ok} of {sampled} sampled train replies accepted ({fraction:.3g}), below "
            f"min-success-fraction {cfg.min_success_fraction:g}"))
    return out


def run_federation(grid: Grid, cfg: RunConfig) -> tuple[dict[str, Any], Path]:
    """Run ``cfg.num_server_rounds`` rounds on ``grid``; returns (final entry, run folder).

    ``final["status"]`` is ``"failed"`` (with ``final["reason"]``) when no round
    aggregated a reply or too few replies were accepted (``min-success-fraction``); an
    exception during the rounds is recorded the same way and raised again.
    """
    seed_globals(cfg.seed)  # Flower samples nodes with Python's random
    out_dir = new_run_dir(cfg.output_dir)
    log(INFO, "fedqhd: results of this run go to %s", out_dir)
    learner = get_learner(cfg.learner_key)
    plan = learner.server_plan(cfg, **strategy_kwargs(cfg))
    recorder = RunRecorder(cfg, out_dir, plan.run_info)
    latest = {"arrays": plan.initial_arrays}

    def after_round(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        latest["arrays"] = arrays
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

    try:
        result = plan.strategy.start(grid, plan.initial_arrays, num_rounds=cfg.num_server_rounds,
                                     timeout=cfg.round_timeout, train_config=ConfigRecord({}),
                                     evaluate_fn=after_round)
    except Exception as exc:
        status = run_status(recorder.rounds, cfg)
        status.update(status="failed", reason=f"{type(exc).__name__}: {exc}")
        recorder.finish(C.from_array_record(latest["arrays"]), status)
        log(ERROR, "fedqhd: run failed after %d round(s): %s; results in %s",
            len(recorder.rounds), status["reason"], out_dir)
        raise
    status = run_status(recorder.rounds, cfg)
    report = learner.final_report(plan, recorder.rounds) or {}
    final = recorder.finish(C.from_array_record(result.arrays or plan.initial_arrays),
                            {**status, **report})
    log(INFO, "fedqhd: final greedy return %.1f +- %.1f after %s rounds; results in %s",
        final["return-mean"] or float("nan"), final["return-std"] or float("nan"),
        final["round"], out_dir)
    if final["status"] == "failed":
        log(ERROR, "fedqhd: run FAILED: %s", final["reason"])
    return final, out_dir
