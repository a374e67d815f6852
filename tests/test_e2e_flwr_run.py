"""One real ``flwr run .`` end to end: SuperLink in simulation mode, Ray, 5 SuperNodes,
20 rounds as in the quickstart (the quiet console: at most 40 lines, our lines only).

The test starts its own SuperLink on free ports with a private FLWR_HOME (the
same command ``flwr run`` would start for ``:local:``), so ``flwr run`` reuses
it and the test can stop it, with everything it spawned, by process group.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


@pytest.mark.slow
def test_flwr_run_writes_results(tmp_path: Path, local_superlink: dict[str, str]) -> None:
    env = local_superlink
    out_dir = tmp_path / "outputs"
    run_config = (f"num-server-rounds=20 eval-episodes=3 hd-dim=500 "
                  f"output-dir='{out_dir}'")
    proc = subprocess.run(
        [str(BIN / "flwr"), "run", ".", "--stream", "--federation-config",
         "num-supernodes=5 client-resources-num-cpus=1", "--run-config", run_config],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    results = sorted(out_dir.glob("*/*/results.json"))
    assert len(results) == 1, f"no results.json under {out_dir}\n{log[-4000:]}"
    data = json.loads(results[0].read_text())
    assert [r["round"] for r in data["rounds"]] == list(range(1, 21))
    assert all(r["replies-ok"] == 5 and r["replies-failed"] == 0 for r in data["rounds"])
    assert all(r["return-mean"] > 0 for r in data["rounds"])
    # each Ray actor limited its BLAS pool to the 1 CPU Ray gave it (client-resources-num-cpus)
    assert all(r["blas-threads"] == pytest.approx(1.0) for r in data["rounds"]), data["rounds"]
    assert data["final"]["return-mean"] == data["rounds"][-1]["return-mean"]
    run_dir = results[0].parent
    # the quiet console (fedqhd.console): Flower's lines before our ServerApp starts, then
    # our header, a line per round and the summary, nothing between them (no metric
    # dicts, no results dump, no Ray worker lines); all of it in run.log
    lines = log.splitlines()
    assert len(lines) <= 40, log
    ours = [i for i, line in enumerate(lines) if f"results in {run_dir}" in line]
    assert len(ours) == 2 and ours[1] - ours[0] == 21, log
    assert all(f"fedqhd round {k}/20: return" in lines[ours[0] + k] for k in range(1, 21)), log
    assert "fedqhd: finished: final greedy return" in lines[ours[1]], log
    run_log = (run_dir / "run.log").read_text()
    assert "Final results" in run_log and "Aggregated MetricRecord" in run_log
    assert "ClientApp process under Ray with 1 CPU(s): BLAS threads 1" in run_log, run_log[-4000:]
    assert json.loads((run_dir / "run_config.json").read_text())["config"]["hd-dim"] == 500
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    # Ray computes exactly the in-process ADMM iteration: each client's dual, kept in
    # its node state, survives from round 1 to round 2 under the simulation engine too
    cfg = RunConfig.from_run_config({"num-server-rounds": 20, "eval-episodes": 3,
                                     "hd-dim": 500, "output-dir": str(tmp_path / "inproc")})
    _, inproc_dir = run_federation(
        InProcessGrid([client_app] * 5, run_config=cfg.to_run_config()), cfg)
    ray_readout = np.load(run_dir / "final_model.npz")["readout"]
    inproc_readout = np.load(inproc_dir / "final_model.npz")["readout"]
    np.testing.assert_allclose(ray_readout, inproc_readout, rtol=0,
                               atol=1e-9 * np.abs(inproc_readout).max())
