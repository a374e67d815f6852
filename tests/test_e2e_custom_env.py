"""The custom-env example (examples/custom_env) under a real ``flwr run``: SuperLink in
simulation mode, Ray, 3 SuperNodes; and an env-id typo ends the run as failed.

As in test_e2e_flwr_run.py, the test starts its own SuperLink on free ports with a
private FLWR_HOME, and stops it, with everything it spawned, by process group.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env"
BIN = Path(sys.executable).parent


def _flwr(args: list[str], env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "flwr"), *args], cwd=EXAMPLE, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_custom_env_under_flwr_run(tmp_path: Path, monkeypatch,
                                  local_superlink: dict[str, str]) -> None:
    env = local_superlink
    out_dir = tmp_path / "outputs"
    fed = ["--federation-config", "num-supernodes=3 client-resources-num-cpus=1"]
    run_config = ("env-module='my_env' env-id='MyEnv-v0' partition='iid' epsilon-min=1.0 "
                  f"epsilon-max=1.0 num-server-rounds=3 hd-dim=500 output-dir='{out_dir}'")
    proc = _flwr(["run", ".", "--stream", *fed, "--run-config", run_config], env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    results = sorted(out_dir.glob("*/*/results.json"))
    assert len(results) == 1, f"no results.json under {out_dir}\n{log[-4000:]}"
    data = json.loads(results[0].read_text())
    assert [r["replies-ok"] for r in data["rounds"]] == [3, 3, 3]
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import my_env  # noqa: F401 (registers MyEnv-v0 here, for the random baseline)

    from fedqhd.envs import rollout_returns

    rng = np.random.default_rng(0)
    random = rollout_returns("MyEnv-v0", lambda o: int(rng.integers(2)), 10, seed=1).mean()
    assert data["final"]["return-mean"] > random + 40, (data["final"], random)

    # a typo in env-id: the run ends, marked failed, with the key named in its log
    typo = run_config.replace("MyEnv-v0", "MyEnv-v9")
    proc = _flwr(["run", ".", "--format", "json", *fed, "--run-config", typo], env)
    run_id = json.loads(proc.stdout)["run-id"]
    deadline = time.monotonic() + 300
    while True:
        listing = _flwr(["ls", "--run-id", str(run_id), "--format", "json"], env, 60)
        status = json.loads(listing.stdout)["runs"][0]["status"]
        if status.startswith("finished") or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert "finished:failed" in status, status
    logs = _flwr(["log", str(run_id), "--show"], env, 60)
    assert "'env-id' = 'MyEnv-v9' is invalid" in logs.stdout + logs.stderr


@pytest.mark.slow
@pytest.mark.heavy
def test_custom_env_under_the_deployment_launcher(tmp_path: Path, monkeypatch) -> None:
    """The same env under ``fedqhd deploy local``: SuperLink, SuperExecs and SuperNodes as
    separate processes (TLS, node auth), shards generated with the env module imported."""
    cmd = [sys.executable, "-m", "fedqhd.commands", "deploy", "local", "-n", "3", "--app",
           str(EXAMPLE), "--env", "MyEnv-v0", "--env-module", "my_env", "--rounds", "3",
           "--workdir", str(tmp_path / "deploy"), "--timeout", "400", "--run-config",
           "partition='iid' epsilon-min=1.0 epsilon-max=1.0 hd-dim=500"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "round 3/3" in proc.stdout  # progress reached the user
    path = next(line.split(": ", 1)[1] for line in proc.stdout.splitlines()
                if line.startswith("results: "))
    data = json.loads(Path(path).read_text())
    assert [r["replies-ok"] for r in data["rounds"]] == [3, 3, 3]
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import my_env  # noqa: F401

    from fedqhd.envs import rollout_returns

    rng = np.random.default_rng(0)
    random = rollout_returns("MyEnv-v0", lambda o: int(rng.integers(2)), 10, seed=1).mean()
    assert data["final"]["return-mean"] > random + 40, (data["final"], random)
