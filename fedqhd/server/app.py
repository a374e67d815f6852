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
from fedqhd.console import CONSOLE, LOG_NAME, RunConsole, summary_line
from fedqhd.learners import check_run_config, get_learner, parse_run_config
from fedqhd.seeding import seed_globals
from fedqhd.server.checkpoint import Checkpoint, CheckpointError, capture_rng, restore_rng
from fedqhd.server.failures import RoundFailed, RunFailed, fail_fast, quiet_reported, reported
from fedqhd.server.preflight import preflight
from fedqhd.server.results import RunRecorder, new_run_dir
from fedqhd.server.resume import Resume, RoundOffset, open_resume
from fedqhd.server.window import for_deployment, for_simulation
from fedqhd.strategies import contract as C

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Parse the run config first (importing ``env-module``): a bad key raises
    :class:`~fedqhd.config.ConfigError` naming it, and Flower marks the run failed.

    Every failure is logged here in one line and raised :func:`reported`, so that Flower's
    traceback of it is dropped (:mod:`fedqhd.server.failures`)."""
    quiet_reported()
    try:
        cfg = parse_run_config(context.run_config)
    except ConfigError as exc:
        log(ERROR, "fedqhd: invalid run config, the run stops: %s", exc)
        raise reported(exc) from None
    # quiet console from here on (Ray's workers print through this process's streams);
    # run_federation names the run folder, whose run.log gets everything
    with RunConsole(verbose=cfg.verbose, streams=True):
        try:
            # Flower's simulation polls every stored message per node: keep few stored at
            # once, and let a node's poll look at its own messages only
            final, out_dir = run_federation(for_deployment(for_simulation(grid)), cfg)
        except (CheckpointError, ConfigError) as exc:
            log(ERROR, "fedqhd: %s, the run stops: %s", "cannot resume" if isinstance(
                exc, CheckpointError) else "invalid run config", exc)
            raise reported(exc) from None
    if final.get("status") == "failed":
        # Flower 1.42 logs a ServerApp exception, marks the run "finished:failed" with the
        # message as its details, and exits flwr-serverapp with a non-zero code
        raise reported(RunFailed(f"fedqhd run failed: {final.get('reason')} "
                                 f"(results in {out_dir})"))


def strategy_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """The strategy settings of a run config (sampling, weighting, safeguards)."""
    return dict(weighting=cfg.weighting, fraction_train=cfg.fraction_train,
                min_train_nodes=min(cfg.min_nodes, 2), min_evaluate_nodes=min(cfg.min_nodes, 2),
                min_available_nodes=cfg.min_nodes, aggregation=cfg.aggregation,
                trim_fraction=cfg.trim_fraction, clip_factor=cfg.clip_factor,
                norm_bound_factor=cfg.norm_bound_factor,
                weight_cap_factor=cfg.weight_cap_factor, stale_rounds=cfg.stale_rounds,
                node_wait_timeout=cfg.node_wait_timeout, evaluate_rounds=cfg.evaluates)


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

    After every round the run's checkpoint is written (:mod:`fedqhd.server.checkpoint`);
    with ``cfg.resume_from`` the run continues from the checkpoint of that folder, in
    that folder, and ends as the uninterrupted run would (:class:`CheckpointError` if it
    cannot). A ``cfg`` its learner does not take raises
    :class:`~fedqhd.config.ConfigError` before anything runs.

    ``final["status"]`` is ``"failed"`` (with ``final["reason"]``) when no round
    aggregated a reply or too few replies were accepted (``min-success-fraction``); an
    exception during the rounds is recorded the same way and raised again (logged in one
    line). A round whose every reply failed with the same error ends the run
    (:class:`~fedqhd.server.failures.RoundFailed`); a simulation's ``data-dir`` is checked
    before round 1 (:func:`~fedqhd.server.preflight.preflight`, a ``ConfigError``).
    """
    check_run_config(cfg)  # a RunConfig built in code has had only its own checks
    grid = fail_fast(grid)
    preflight(grid, cfg)
    seed_globals(cfg.seed)  # Flower samples nodes with Python's random
    resume = open_resume(cfg) if cfg.resume_from else None
    out_dir = resume.run_dir if resume is not None else new_run_dir(cfg.output_dir)
    # in process a console of its own; under the ServerApp's, this only names the folder
    with RunConsole(verbose=cfg.verbose, run_dir=out_dir):
        return _run_rounds(grid, cfg, resume, out_dir), out_dir


def _run_rounds(grid: Grid, cfg: RunConfig, resume: Resume | None, out_dir: Path
                ) -> dict[str, Any]:
    """:func:`run_federation`'s rounds, in ``out_dir``, with its console active."""
    learner = get_learner(cfg.learner_key)
    plan = learner.server_plan(cfg, **strategy_kwargs(cfg))
    restore = getattr(plan.strategy, "restore_state", None)
    snapshot = getattr(plan.strategy, "checkpoint_state", None)
    done, initial, resumes = 0, plan.initial_arrays, []
    if resume is not None:
        if restore is None:
            raise CheckpointError(f"resume-from: the strategy {type(plan.strategy).__name__} "
                                  "keeps no checkpoint state")
        ckpt = resume.checkpoint
        try:
            restore(ckpt.strategy)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"resume-from {out_dir}: the checkpoint's strategy state "
                                  f"does not fit this run ({type(exc).__name__}: {exc})") from None
        done, initial, resumes = ckpt.round, C.to_array_record(ckpt.arrays), ckpt.resumes + [
            ckpt.round]
        restore_rng(ckpt.rng)  # last: building the plan may draw from the global streams
        log(INFO, "fedqhd: resuming %s after round %d of %d", out_dir, done,
            cfg.num_server_rounds, extra=CONSOLE)
    log(INFO, "%s: %s, %d rounds; results in %s (Flower's full log: %s there%s)",
        learner.log_label, learner.title(cfg), cfg.num_server_rounds, out_dir, LOG_NAME,
        "" if cfg.verbose else "; run config verbose=true shows it here", extra=CONSOLE)
    recorder = RunRecorder(cfg, out_dir, plan.run_info, curves=learner.curves,
                           title=learner.title(cfg),
                           rows=resume.rows if resume is not None else None,
                           rows_bytes=resume.checkpoint.rows_bytes if resume is not None else 0)
    latest = {"arrays": initial}

    def after_round(flower_round: int, arrays: ArrayRecord) -> MetricRecord | None:
        latest["arrays"] = arrays
        if flower_round == 0:
            return None
        server_round = flower_round + done
        deferred = getattr(plan.strategy, "deferred_evaluation", None)
        if deferred is not None and deferred[0] == server_round - 1:
            # the clients evaluated the previous round's model with this round's messages
            # (the strategy's evaluate_with_next_train): that round's row gets it now
            earlier = recorder.amend_round(deferred[0], dict(deferred[1].items()))
            log(INFO, "%s round %d/%d, evaluated with round %d's messages: %s",
                learner.log_label, deferred[0], cfg.num_server_rounds, server_round,
                learner.round_line(cfg, earlier), extra=CONSOLE)
        metrics = (plan.evaluate(arrays)
                   if plan.evaluate is not None and cfg.evaluates(server_round) else None)
        extra = plan.round_metrics() if plan.round_metrics is not None else {}
        if extra:
            metrics = MetricRecord({**(dict(metrics.items()) if metrics is not None else {}),
                                    **extra})
        row: dict[str, Any] = {"round": server_round}
        for record in (plan.strategy.last_train_metrics,  # type: ignore[attr-defined]
                       plan.strategy.last_evaluate_metrics, metrics):  # type: ignore[attr-defined]
            row.update(dict(record.items()) if record is not None else {})
        recorder.record_round(row)
        if snapshot is not None:
            Checkpoint(round=server_round, config=cfg.to_run_config(),
                       arrays=C.from_array_record(arrays), strategy=snapshot(),
                       rng=capture_rng(), rows=len(recorder.rounds),
                       rows_bytes=recorder.rows_bytes, resumes=resumes).save(out_dir)
        log(INFO, "%s round %d/%d: %s", learner.log_label, server_round, cfg.num_server_rounds,
            learner.round_line(cfg, row), extra=CONSOLE)
        return metrics

    strategy = plan.strategy if resume is None else RoundOffset(plan.strategy, done)
    extra: dict[str, Any] = {"resumed-after-rounds": resumes} if resumes else {}
    try:
        strategy.start(grid, initial, num_rounds=cfg.num_server_rounds - done,
                       timeout=cfg.round_timeout, train_config=ConfigRecord({}),
                       evaluate_fn=after_round)
    except Exception as exc:
        status = run_status(recorder.rounds, cfg)
        status.update(status="failed", reason=f"{type(exc).__name__}: {exc}", **extra)
        if isinstance(exc, RoundFailed):  # its replies never reached a round's row
            status["replies"][C.REPLIES_FAILED] += exc.replies
        recorder.finish(C.from_array_record(latest["arrays"]), status)
        log(ERROR, "%s", summary_line(
            learner.log_label, "failed", None, out_dir,
            f"{status['reason']} (after {len(recorder.rounds)} round(s))"))
        reported(exc)
        raise
    status = run_status(recorder.rounds, cfg)
    report = learner.final_report(cfg, plan, recorder.rounds) or {}
    try:
        final = recorder.finish(C.from_array_record(latest["arrays"]),
                                {**status, **report, **extra})
    except Exception as exc:  # results.json says failed (RunRecorder.finish); so does the log
        log(ERROR, "%s", summary_line(learner.log_label, "failed", None, out_dir,
                                      f"writing its outputs: {type(exc).__name__}: {exc}"))
        reported(exc)
        raise
    if final["status"] == "failed":  # the last line says so, not a return
        log(ERROR, "%s", summary_line(learner.log_label, "failed", None, out_dir,
                                      final["reason"]))
    else:
        log(INFO, "%s", summary_line(learner.log_label, "finished", learner.final_line(final),
                                     out_dir), extra=CONSOLE)
    return final
