"""Any gymnasium env id runs without ``register_env`` (issue 31): an id registered with
``gym.register`` only (examples/custom_env/gym_env.py: a rank-2 unbounded Box, Discrete
actions) gets its entry from its spaces and spec, learns under ``fedqhd bench`` and
``flwr run``; a misspelled id names its near matches.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from fedqhd.commands.main import main as fedqhd_main
from fedqhd.config import ConfigError, RunConfig
from fedqhd.envs import get_spec, is_registered, register_env, rollout_returns, unregister_env

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env"
BIN = Path(sys.executable).parent
GYM_ID = "GymDrift-v0"


@pytest.fixture
def gym_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The example module importable (as env-module 'gym_env' would be); fedqhd's entry
    made from it is dropped afterwards."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield GYM_ID
    unregister_env(GYM_ID)


class Box01(gym.Env):
    """A finite Box in [0, 4] x [-1, 1], three actions, no time limit of its own."""

    observation_space = gym.spaces.Box(np.array([0.0, -1.0]), np.array([4.0, 1.0]),
                                       dtype=np.float64)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):  # type: ignore[no-untyped-def]
        super().reset(seed=seed)
        return np.array([2.0, 0.0]), {}

    def step(self, action):  # type: ignore[no-untyped-def]
        return np.array([2.0, 0.0]), 0.0, False, False, {}


def test_a_gym_registered_id_gets_its_entry_from_spaces_and_spec(gym_env: str) -> None:
    cfg = RunConfig.from_run_config({"env-module": "gym_env", "env-id": gym_env})
    assert cfg.env_id == gym_env
    spec = get_spec(gym_env)
    assert spec.observation_shape == (2, 3) and spec.obs_dim == 6  # flattened
    assert spec.n_actions == 2 and spec.max_episode_steps == 100  # the spec's limit
    assert spec.obs_bound_source == "data"  # unbounded Box: inferred from random rollouts
    assert np.all(np.isfinite(spec.obs_bound)) and np.all(spec.obs_bound > 0)


def test_a_finite_box_gives_the_bounds_and_the_spec_the_time_limit() -> None:
    gym.register("test/Box01-v0", entry_point=Box01, max_episode_steps=7)
    try:
        spec = get_spec("test/Box01-v0")
        assert spec.obs_bound_source == "space" and spec.max_episode_steps == 7
        np.testing.assert_allclose(spec.obs_bound, [2.0, 1.0])
        np.testing.assert_allclose(spec.center, [2.0, 0.0])
        assert spec.n_actions == 3
    finally:
        unregister_env("test/Box01-v0")
        gym.registry.pop("test/Box01-v0")


def test_what_cannot_be_inferred_is_refused_with_its_reason() -> None:
    gym.register("test/NoLimit-v0", entry_point=Box01)  # no max_episode_steps
    try:
        assert not is_registered("test/NoLimit-v0")
        with pytest.raises(ValueError, match="no time limit; register it with "
                                             "max_episode_steps"):
            get_spec("test/NoLimit-v0")
        register_env("test/NoLimit-v0", max_episode_steps=9)  # register_env stays for this
        assert get_spec("test/NoLimit-v0").max_episode_steps == 9
    finally:
        unregister_env("test/NoLimit-v0")
        gym.registry.pop("test/NoLimit-v0")
    with pytest.raises(ConfigError, match="Pendulum-v1: fedqhd needs Discrete actions"):
        RunConfig.from_run_config({"env-id": "Pendulum-v1"})


def test_a_misspelled_id_is_a_config_error_naming_near_matches(gym_env: str) -> None:
    with pytest.raises(ConfigError, match=r"'env-id' = 'GymDrift-v9' is invalid: .*unknown "
                                          r"env id 'GymDrift-v9' \(did you mean 'GymDrift-v0'"):
        RunConfig.from_run_config({"env-module": "gym_env", "env-id": "GymDrift-v9"})
    # inside register_env: refused at once, not gymnasium's NameNotFound on first use
    with pytest.raises(ValueError, match=r"gymnasium knows no env id 'CartPol-v1' \(did you "
                                         r"mean 'CartPole-v1'"):
        register_env("test/Mine-v0", factory="CartPol-v1")


def test_fedqhd_bench_learns_a_gym_registered_env(gym_env: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = fedqhd_main(["bench", "--env-module", "gym_env", "--env", gym_env, "--only", "avg",
                        "--clients", "3", "--rounds", "3", "--seeds", "0", "--out",
                        str(tmp_path), "--set", "hd-dim=500", "--set", "partition='iid'",
                        "--set", "epsilon-min=1.0", "--set", "epsilon-max=1.0"])
    assert code == 0, capsys.readouterr().err[-2000:]
    row = json.loads((tmp_path / "bench-avg.json").read_text())["per-seed"][0]
    rng = np.random.default_rng(0)
    random = rollout_returns(gym_env, lambda o: int(rng.integers(2)), 10, seed=1).mean()
    assert row["return-mean"] > random + 40, (row["return-mean"], random)


@pytest.mark.slow
def test_flwr_run_learns_a_gym_registered_env(gym_env: str, tmp_path: Path,
                                              local_superlink: dict[str, str]) -> None:
    out_dir = tmp_path / "outputs"
    run_config = (f"env-module='gym_env' env-id='{gym_env}' partition='iid' epsilon-min=1.0 "
                  f"epsilon-max=1.0 num-server-rounds=3 hd-dim=500 output-dir='{out_dir}'")
    proc = subprocess.run(
        [str(BIN / "flwr"), "run", ".", "--stream", "--federation-config",
         "num-supernodes=3 client-resources-num-cpus=1", "--run-config", run_config],
        cwd=EXAMPLE, env=local_superlink, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    data = json.loads(next(out_dir.glob("*/*/results.json")).read_text())
    assert [r["replies-ok"] for r in data["rounds"]] == [3, 3, 3]
    import importlib

    importlib.import_module("gym_env")  # gym.register here too, for the random baseline

    rng = np.random.default_rng(0)
    random = rollout_returns(gym_env, lambda o: int(rng.integers(2)), 10, seed=1).mean()
    assert data["final"]["return-mean"] > random + 40, (data["final"], random)
