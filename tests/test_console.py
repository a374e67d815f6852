"""The quiet console (fedqhd.console): our round lines and every error reach the console,
Flower's dump, metric dicts and known-harmless warnings go to run.log only, and
``verbose`` brings them back. The flwr-run line count is checked in test_e2e_flwr_run.py."""

from __future__ import annotations

import io
import itertools
import logging
import sys
import warnings
from collections.abc import Iterator
from logging import ERROR, INFO, WARNING
from pathlib import Path

import pytest
from flwr.app import Message
from flwr.clientapp import ClientApp
from flwr.common.logger import FLOWER_LOGGER, console_handler, log

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.console import CONSOLE, LOG_NAME, RunConsole, summary_line
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

ROUND = "fedqhd round 3/20: return 234.2 +- 99.7 | replies ok 5 failed 0 rejected 0"
DUMP = "\t  20: {'return-mean': '2.3420e+02', 'return-std': '9.9665e+01'}}"
METRICS = "\t└──> Aggregated MetricRecord: {'bellman-residual': 0.21, 'replies-ok': 5}"
SWIG = "builtin type SwigPyPacked has no __module__ attribute"
RAY_TIP = ("Tip: In future versions of Ray, Ray will no longer override accelerator visible "
           "devices env var if num_gpus=0 or num_gpus=None (default).")
# what Ray's driver prints for its workers (prefixed, Flower's colours kept)
WORKER_SWIG = ("(ClientAppActor pid=4972) <frozen importlib._bootstrap>:241: "
               f"DeprecationWarning: {SWIG}")
WORKER_INFO = ("(ClientAppActor pid=4972) \x1b[92mINFO \x1b[0m:      fedqhd: ClientApp process "
               "under Ray with 1 CPU(s): BLAS threads 1")
WORKER_TRACEBACK = ["(ClientAppActor pid=4972) Traceback (most recent call last):",
                    "(ClientAppActor pid=4972)   File \"app.py\", line 3, in train",
                    "(ClientAppActor pid=4972) ValueError: shard-3.npz: env mismatch"]


@pytest.fixture
def console_out(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What Flower's console handler prints (with Flower's logger at its INFO default,
    whatever a test before this one in the process left it at)."""
    out = io.StringIO()
    monkeypatch.setattr(console_handler, "stream", out)
    level = FLOWER_LOGGER.level
    FLOWER_LOGGER.setLevel(logging.INFO)
    yield out
    FLOWER_LOGGER.setLevel(level)


def _streams_to(out: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    """sys.stdout and sys.stderr (where a ServerApp process's raw output and Ray's worker
    lines go) into ``out``; set in the test itself, as pytest's capture resets them
    between a fixture and the test."""
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", out)


def _emit_a_run() -> None:
    """The kinds of output a flwr run makes, each once."""
    log(INFO, "fedqhd: CartPole-v1, 20 rounds; results in DIR", extra=CONSOLE)
    log(INFO, ROUND, extra=CONSOLE)
    log(INFO, METRICS)
    log(INFO, "Final results:")
    log(INFO, DUMP)
    log(INFO, "fedqhd: simulation link state indexed by node (sim-index)")  # not for the console
    log(WARNING, "Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.")
    log(WARNING, "FedQHDAvg train round 3: 2 replies rejected (norm bound)")
    log(ERROR, "ClientApp raised an exception: ValueError: boom")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(SWIG, DeprecationWarning, stacklevel=1)
        warnings.warn(RAY_TIP, FutureWarning, stacklevel=1)
        warnings.warn("a warning nobody has seen before", UserWarning, stacklevel=1)
    print(WORKER_SWIG)
    print(WORKER_INFO)
    print("\n".join(WORKER_TRACEBACK), file=sys.stderr)


def test_quiet_console_keeps_rounds_and_errors_and_logs_everything(
        tmp_path: Path, console_out: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    _streams_to(console_out, monkeypatch)
    with RunConsole(run_dir=tmp_path, streams=True):
        _emit_a_run()
    shown = console_out.getvalue()
    for kept in (ROUND, "results in DIR", "replies rejected (norm bound)",
                 "ClientApp raised an exception: ValueError: boom",
                 "a warning nobody has seen before", *WORKER_TRACEBACK):
        assert kept in shown, (kept, shown)
    for dropped in (METRICS, "Final results", DUMP, "sim-index", "SuperNodes changed",
                    SWIG, "Ray will no longer override", "warnings.warn(SWIG",
                    "warnings.warn(RAY_TIP", "BLAS threads"):
        assert dropped not in shown, (dropped, shown)
    assert len(shown.splitlines()) <= 12, shown
    # run.log has every line, the dropped ones included, without colour codes
    logged = (tmp_path / LOG_NAME).read_text()
    for line in (ROUND, METRICS, "Final results", DUMP, "SuperNodes changed", SWIG,
                 "Ray will no longer override", "a warning nobody has seen before",
                 "fedqhd: ClientApp process under Ray with 1 CPU(s): BLAS threads 1",
                 *WORKER_TRACEBACK):
        assert line in logged, (line, logged)
    assert "\x1b[" not in logged


def test_verbose_shows_everything(tmp_path: Path, console_out: io.StringIO,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    _streams_to(console_out, monkeypatch)
    with RunConsole(verbose=True, run_dir=tmp_path, streams=True):
        _emit_a_run()
    shown = console_out.getvalue()
    for line in (ROUND, METRICS, "Final results", DUMP, "SuperNodes changed", SWIG,
                 "Ray will no longer override", WORKER_SWIG, WORKER_INFO, *WORKER_TRACEBACK):
        assert line in shown, (line, shown)
    assert METRICS in (tmp_path / LOG_NAME).read_text()


def test_console_is_restored_and_lines_before_the_folder_are_kept(
        tmp_path: Path, console_out: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    _streams_to(console_out, monkeypatch)
    showwarning, stdout = warnings.showwarning, sys.stdout
    with RunConsole(streams=True) as console:
        log(INFO, "before the run folder exists")
        # run_federation names the folder from inside the ServerApp's console
        with RunConsole(run_dir=tmp_path) as inner:
            assert inner is console
            log(INFO, "inside")
    assert warnings.showwarning is showwarning and sys.stdout is stdout
    assert not console_handler.filters
    log(INFO, "after the run")
    assert "after the run" in console_out.getvalue()
    logged = (tmp_path / LOG_NAME).read_text()
    assert "before the run folder exists" in logged and "inside" in logged
    assert "after the run" not in logged


def test_summary_line() -> None:
    assert summary_line("fedqhd", "finished", "final greedy return 234.2 +- 99.7", "/r") == (
        "fedqhd: finished: final greedy return 234.2 +- 99.7; results in /r")
    assert summary_line("fedqhd", "failed", "ignored", "/r", "no round aggregated") == (
        "fedqhd: failed: no round aggregated; results in /r")


def _cfg(tmp_path: Path, **keys: object) -> RunConfig:
    return RunConfig.from_run_config({"num-server-rounds": 2, "eval-episodes": 2,
                                      "hd-dim": 200, "output-dir": str(tmp_path), **keys})


def test_inprocess_run_is_quiet_and_verbose_brings_flower_back(
        tmp_path: Path, console_out: io.StringIO) -> None:
    cfg = _cfg(tmp_path / "quiet")
    _, run_dir = run_federation(InProcessGrid([client_app] * 2, cfg.to_run_config()), cfg)
    lines = console_out.getvalue().splitlines()
    assert len(lines) == 4, lines  # header, 2 rounds, summary
    assert f"results in {run_dir}" in lines[0]
    assert "fedqhd round 1/2" in lines[1] and "fedqhd round 2/2" in lines[2]
    assert "fedqhd: finished: final greedy return" in lines[3] and str(run_dir) in lines[3]
    logged = (run_dir / LOG_NAME).read_text()
    assert "Final results" in logged and "Aggregated MetricRecord" in logged

    console_out.truncate(0)
    cfg = _cfg(tmp_path / "verbose", verbose=True)
    run_federation(InProcessGrid([client_app] * 2, cfg.to_run_config()), cfg)
    shown = console_out.getvalue()
    assert "Final results" in shown and "Aggregated MetricRecord" in shown, shown


def test_a_failed_run_says_so_on_the_quiet_console(
        tmp_path: Path, console_out: io.StringIO, caplog: pytest.LogCaptureFixture) -> None:
    broken = ClientApp()
    reasons = itertools.cycle(["shard-0.npz: env mismatch", "disk full"])

    @broken.train()
    def train(msg: Message, context: object) -> Message:
        # two different errors: the run goes on (one same error would end it at round 1)
        raise ValueError(next(reasons))

    cfg = _cfg(tmp_path)
    with caplog.at_level(logging.INFO, logger="flwr"):
        final, run_dir = run_federation(InProcessGrid([broken] * 2, cfg.to_run_config()), cfg)
    assert final["status"] == "failed"
    shown = console_out.getvalue()
    assert f"fedqhd: failed: no round aggregated a single reply; results in {run_dir}" in shown
    assert "final greedy return" not in shown
    assert "failed" in (run_dir / LOG_NAME).read_text()
