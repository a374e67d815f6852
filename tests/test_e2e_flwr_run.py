"""One real ``flwr run .`` end to end: SuperLink in simulation mode, Ray, 5 SuperNodes.

The test starts its own SuperLink on free ports with a private FLWR_HOME (the
same command ``flwr run`` would start for ``:local:``), so ``flwr run`` reuses
it and the test can stop it, with everything it spawned, by process group.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_flwr_run_writes_results(tmp_path: Path) -> None:
    http_port, control_port = _free_port(), _free_port()
    env = dict(os.environ, FLWR_HOME=str(tmp_path / "flwr-home"),
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
               FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
               FLWR_DISABLE_UPDATE_CHECK="1", RAY_DEDUP_LOGS="0")
    link = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", f"127.0.0.1:{control_port}", "--host", "127.0.0.1",
         "--port", str(http_port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    out_dir = tmp_path / "outputs"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=0.5).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert link.poll() is None, "flower-superlink exited early"
            assert time.monotonic() < deadline, "SuperLink not healthy after 60 s"
            time.sleep(0.3)
        run_config = (f"num-server-rounds=2 eval-episodes=3 hd-dim=500 "
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
        assert [r["round"] for r in data["rounds"]] == [1, 2]
        assert all(r["replies-ok"] == 5 and r["replies-failed"] == 0 for r in data["rounds"])
        assert all(r["return-mean"] > 0 for r in data["rounds"])
        assert data["final"]["return-mean"] == data["rounds"][-1]["return-mean"]
        run_dir = results[0].parent
        assert json.loads((run_dir / "run_config.json").read_text())["config"]["hd-dim"] == 500
        assert (run_dir / "learning_curve.png").stat().st_size > 1000
        # Ray computes exactly the in-process ADMM iteration: each client's dual, kept in
        # its node state, survives from round 1 to round 2 under the simulation engine too
        cfg = RunConfig.from_run_config({"num-server-rounds": 2, "eval-episodes": 3,
                                         "hd-dim": 500, "output-dir": str(tmp_path / "inproc")})
        _, inproc_dir = run_federation(
            InProcessGrid([client_app] * 5, run_config=cfg.to_run_config()), cfg)
        ray_readout = np.load(run_dir / "final_model.npz")["readout"]
        inproc_readout = np.load(inproc_dir / "final_model.npz")["readout"]
        np.testing.assert_allclose(ray_readout, inproc_readout, rtol=0,
                                   atol=1e-9 * np.abs(inproc_readout).max())
    finally:
        try:
            os.killpg(link.pid, signal.SIGTERM)
            link.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(link.pid, signal.SIGKILL)
