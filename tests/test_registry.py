"""The environment registry, plug-in env modules, shards from arrays, and encoder scales."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from fedqhd.commands.data import register as register_data_cli
from fedqhd.config import ConfigError, RunConfig
from fedqhd.data import ShardError, collect_shard, load_shard, save_shard, shards_from_arrays
from fedqhd.encoders import HDEncoder
from fedqhd.envs import (
    BUILTIN_ENV_IDS,
    ENV_IDS,
    get_spec,
    infer_obs_bound,
    make_env,
    register_env,
    rollout_returns,
    unregister_env,
)
from fedqhd.learners import parse_run_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env"

#: the specs of the four tasks before the registry (copied from the old table)
OLD_SPECS = {
    "CartPole-v1": (4, 2, [2.4, 3.0, 0.5, 3.5], 500,
                    {"length": (0.25, 1.0), "gravity": (7.0, 13.0), "masscart": (0.5, 2.0),
                     "masspole": (0.05, 0.3)},
                    {"length": 0.5, "gravity": 9.8, "masscart": 1.0, "masspole": 0.1}),
    "Acrobot-v1": (6, 3, [1.0, 1.0, 1.0, 1.0, 4 * np.pi, 9 * np.pi], 500,
                   {"link_mass_1": (0.8, 1.2), "link_mass_2": (0.8, 1.2),
                    "link_length_1": (0.8, 1.2), "link_length_2": (0.8, 1.2)},
                   {"link_mass_1": 1.0, "link_mass_2": 1.0, "link_length_1": 1.0,
                    "link_length_2": 1.0}),
    "MountainCar-v0": (2, 3, [1.2, 0.07], 200,
                       {"force": (0.0008, 0.0013), "gravity": (0.0020, 0.0030)},
                       {"force": 0.001, "gravity": 0.0025}),
    "LunarLander-v3": (8, 4, [1.0, 1.6, 2.0, 2.0, 1.5, 2.0, 1.0, 1.0], 1000,
                       {"gravity": (-11.0, -8.0), "wind_power": (0.0, 10.0)},
                       {"gravity": -10.0, "wind_power": 0.0}),
}


# ------------------------------------------------------------ environments of this test
class Line(gym.Env):
    """2 observations, 3 actions: not MountainCar, though shaped like it."""

    observation_space = gym.spaces.Box(-50.0, 50.0, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:  # no render_mode argument
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([10.0, -5.0], dtype=np.float32) + self.np_random.normal(size=2).astype(
            np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([10.0 + self.t, -5.0 * int(action)], dtype=np.float32)
        return obs, 0.0, self.t >= 10, False, {}


class Continuous(Line):
    action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)


class Wide(Line):
    """Unbounded observations of rank 3 with a constant coordinate."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1, 2, 2), dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        gym.Env.reset(self, seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        u = self.np_random.uniform(-4.0, 4.0)
        return np.array([[[u, 100.0 + u / 4], [7.0, 0.0]]])

    def step(self, action):
        self.t += 1
        return self._obs(), 0.0, False, False, {}


# ------------------------------------------------------------ registry
def test_builtin_entries_have_the_specs_they_had() -> None:
    assert tuple(BUILTIN_ENV_IDS) == tuple(OLD_SPECS)
    assert tuple(ENV_IDS)[:4] == tuple(OLD_SPECS)
    for env_id, (obs_dim, n_actions, bound, steps, ranges, defaults) in OLD_SPECS.items():
        spec = get_spec(env_id)
        assert (spec.env_id, spec.obs_dim, spec.n_actions, spec.max_episode_steps) == (
            env_id, obs_dim, n_actions, steps)
        np.testing.assert_array_equal(spec.obs_bound, np.asarray(bound, dtype=np.float64))
        assert spec.dynamics_ranges == ranges and spec.dynamics_defaults == defaults
        assert spec.obs_shape is None and spec.obs_center is None
    assert "fedqhd/Inventory-v0" not in ENV_IDS  # the pool learner's task: no discrete actions
    assert RunConfig(learner="pool", env_id="fedqhd/Inventory-v0").env_id == "fedqhd/Inventory-v0"


def test_unknown_env_id_is_named_everywhere(tmp_path: Path) -> None:
    for call in (lambda: get_spec("Nope-v9"), lambda: make_env("Nope-v9"),
                 lambda: collect_shard("Nope-v9", 1, 1.0, 0)):
        with pytest.raises(ValueError, match="unknown env id 'Nope-v9'; fedqhd's ids: "
                                             "CartPole-v1, .*register_env"):
            call()
    with pytest.raises(ConfigError, match="'env-id' = 'Nope-v9' is invalid: expected a "
                                          "registered env id: .*env-module"):
        RunConfig.from_run_config({"env-id": "Nope-v9"})


def test_custom_env_flattened_bounded_from_data_and_no_render_mode(temp_envs) -> None:
    env_id = temp_envs("test/Wide-v0", factory=Wide, obs_bound="data", max_episode_steps=30)
    spec = get_spec(env_id)
    assert spec.obs_shape == (1, 2, 2) and spec.obs_dim == 4 and spec.max_episode_steps == 30
    env = make_env(env_id)  # Wide() takes no render_mode: none may be passed
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4,)
    # u ~ U(-4, 4): half-range about 4; 100 + u/4: about 1 (the offset does not count);
    # constant coordinates: scale 1
    np.testing.assert_allclose(spec.obs_bound, [4.0, 1.0, 1.0, 1.0], rtol=0.1)
    with pytest.raises(ValueError, match="test/Wide-v0: its factory takes no render_mode"):
        make_env(env_id, render_mode="human")
    with pytest.raises(ValueError, match="test/Wide-v0: no heuristic controller"):
        collect_shard(env_id, 2, 0.5, 0)
    assert collect_shard(env_id, 2, 1.0, 0).n_transitions == 60


def test_infer_obs_bound_is_robust() -> None:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(-2, 2, 10_000), np.full(10_000, 5.0),
                         rng.uniform(10, 12, 10_000)])
    X[:20, 0] = 1e6  # outliers below the 99th percentile's reach
    np.testing.assert_allclose(infer_obs_bound(X), [2.0, 1.0, 1.0], rtol=0.05)
    with pytest.raises(ValueError, match="non-finite"):
        infer_obs_bound(np.array([[1.0], [np.inf]]))


def test_registration_errors_name_the_id_and_what_is_missing(temp_envs) -> None:
    temp_envs("test/Cont-v0", factory=Continuous, max_episode_steps=10)
    with pytest.raises(ValueError, match="test/Cont-v0: fedqhd needs Discrete actions"):
        get_spec("test/Cont-v0")
    temp_envs("test/NoLimit-v0", factory=Line)
    with pytest.raises(ValueError, match="test/NoLimit-v0: the env has no time limit; "
                                         "register it with max_episode_steps"):
        get_spec("test/NoLimit-v0")
    temp_envs("test/Space-v0", factory=Wide, obs_bound="space", max_episode_steps=5)
    with pytest.raises(ValueError, match="test/Space-v0: obs_bound='space' needs finite"):
        get_spec("test/Space-v0")
    temp_envs("test/Rank3-v0", factory=Wide, flatten=False, max_episode_steps=5)
    with pytest.raises(ValueError, match="test/Rank3-v0: observation space .* is not a rank-1"):
        get_spec("test/Rank3-v0")
    temp_envs("test/Count-v0", factory=Line, n_actions=2, max_episode_steps=5)
    with pytest.raises(ValueError, match="test/Count-v0: registered with n_actions=2, but the "
                                         "env has 3"):
        get_spec("test/Count-v0")
    with pytest.raises(ValueError, match="already registered"):
        register_env("CartPole-v1")
    with pytest.raises(ValueError, match="test/Bad-v0: obs_bound must be positive finite"):
        register_env("test/Bad-v0", factory=Line, obs_bound=[1.0, np.inf])
    # a finite Box: bounds from the space
    temp_envs("test/Line-v0", factory=Line, max_episode_steps=10)
    np.testing.assert_array_equal(get_spec("test/Line-v0").obs_bound, [50.0, 50.0])


# ------------------------------------------------------------ env-module, end to end
@pytest.fixture
def example_env(monkeypatch):
    """examples/custom_env on sys.path, and MyEnv-v0 not registered yet."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    unregister_env("MyEnv-v0")
    sys.modules.pop("my_env", None)
    yield
    unregister_env("MyEnv-v0")
    sys.modules.pop("my_env", None)


def test_env_module_is_imported_before_validation(example_env) -> None:
    with pytest.raises(ConfigError, match="unknown|registered env id"):
        RunConfig.from_run_config({"env-id": "MyEnv-v0"})
    with pytest.raises(ConfigError, match="'env-module' = 'no_such_mod' is invalid: env module "
                                          "'no_such_mod' could not be imported"):
        RunConfig.from_run_config({"env-module": "no_such_mod"})
    with pytest.raises(ConfigError, match="'epsilon-min' = 0.8 .*no heuristic controller"):
        parse_run_config({"env-module": "my_env", "env-id": "MyEnv-v0", "preset": "manual"})
    # preset auto: an env without a preset gets derived settings, uniform-random behaviour
    # among them (no heuristic controller to be noisy with)
    cfg = parse_run_config({"env-module": "my_env", "env-id": "MyEnv-v0"})
    assert (cfg.epsilon_min, cfg.epsilon_max) == (1.0, 1.0)
    assert cfg.env_id == "MyEnv-v0" and "MyEnv-v0" in ENV_IDS


def test_custom_env_runs_federated_in_process_and_beats_random(example_env, tmp_path,
                                                               monkeypatch, request) -> None:
    from flwr.common.logger import FLOWER_LOGGER

    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import main as server_main
    from fedqhd.server.inprocess import InProcessGrid

    monkeypatch.setenv("FEDQHD_CACHE_DIR", str(tmp_path / "cache"))
    level = FLOWER_LOGGER.level  # restored: later tests in this process read Flower's INFO lines
    request.addfinalizer(lambda: FLOWER_LOGGER.setLevel(level))
    FLOWER_LOGGER.setLevel(logging.WARNING)
    run_config = {"env-module": "my_env", "env-id": "MyEnv-v0", "partition": "iid",
                  "epsilon-min": 1.0, "epsilon-max": 1.0, "num-server-rounds": 5,
                  "hd-dim": 500, "eval-episodes": 10, "output-dir": str(tmp_path / "out")}
    grid = InProcessGrid([client_app] * 3, run_config=run_config)
    # the ServerApp's own entry point: the run config is all it is given
    from flwr.app import Context, RecordDict
    server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                              run_config=run_config))
    results = json.loads(next((tmp_path / "out").glob("*/*/results.json")).read_text())
    rounds = results["rounds"]
    assert [r["replies-ok"] for r in rounds] == [3] * 5
    federated = results["final"]["return-mean"]
    rng = np.random.default_rng(0)
    random = rollout_returns("MyEnv-v0", lambda o: int(rng.integers(2)), 10, seed=1).mean()
    assert federated > random + 40, (federated, random)
    shard = load_shard(next((tmp_path / "cache").glob("MyEnv-v0-*.npz")), "MyEnv-v0")
    assert shard.metadata["env_spec"]["obs_shape"] == [2, 3]


# ------------------------------------------------------------ mislabelled shards
def test_mislabelled_shards_are_refused(temp_envs, tmp_path: Path) -> None:
    env_id = temp_envs("test/Line-v0", factory=Line, max_episode_steps=10)
    other = collect_shard(env_id, 3, 1.0, 0)  # 2 observations, 3 actions, like MountainCar
    # relabelled by editing the metadata: the recorded spec is not MountainCar's
    other.metadata["env_id"] = "MountainCar-v0"
    with pytest.raises(ShardError, match="env spec mismatch: .*MountainCar-v0 here has"):
        other.validate()
    # a label without a recorded spec: the observations are not in MountainCar's space
    del other.metadata["env_spec"]
    with pytest.raises(ShardError, match="observations outside MountainCar-v0's observation "
                                         "space.*another environment"):
        other.validate()
    # imported with the wrong label
    with pytest.raises(ShardError, match="outside MountainCar-v0's observation space"):
        shards_from_arrays(other.observations, other.actions, other.rewards,
                           other.next_observations, other.terminated, other.truncated,
                           env_id="MountainCar-v0")
    # a shard of a re-registered env with other bounds
    good = collect_shard(env_id, 3, 1.0, 0)
    path = save_shard(good, tmp_path / "line.npz")
    register_env(env_id, factory=Line, max_episode_steps=10, obs_bound=[1.0, 2.0],
                 overwrite=True)
    with pytest.raises(ShardError, match="obs_bound: shard \\['50', '50'\\], env \\['1', '2'\\]"):
        load_shard(path, expected_env_id=env_id)


# ------------------------------------------------------------ shards from arrays
def test_shards_from_arrays_round_trip(tmp_path: Path) -> None:
    src = collect_shard("CartPole-v1", 7, 1.0, 3)
    n = src.n_transitions
    shards = shards_from_arrays(
        src.observations.astype(np.float64).tolist(), src.actions.astype(np.float32),
        src.rewards.astype(np.int8), src.next_observations, src.terminated.astype(int),
        src.truncated, env_id="CartPole-v1", num_partitions=3, seed=5)
    assert sum(s.n_transitions for s in shards) == n
    assert sum(s.n_episodes for s in shards) == 7 == src.n_episodes
    back = np.concatenate([s.episode_ids for s in shards])
    np.testing.assert_array_equal(np.sort(back), src.episode_ids)  # ids from the done flags
    for i, shard in enumerate(shards):
        assert shard.metadata["partition_id"] == i and shard.metadata["num_partitions"] == 3
        assert shard.observations.dtype == np.float32 and shard.actions.dtype == np.int64
        loaded = load_shard(save_shard(shard, tmp_path / f"shard-{i}.npz"), "CartPole-v1")
        np.testing.assert_array_equal(loaded.observations, shard.observations)
    rows = np.isin(src.episode_ids, shards[1].episode_ids)
    np.testing.assert_array_equal(shards[1].observations, src.observations[rows])
    # a key per transition (by episode)
    keyed = shards_from_arrays(src.observations, src.actions, src.rewards, src.next_observations,
                               src.terminated, src.truncated, src.episode_ids,
                               env_id="CartPole-v1", num_partitions=2,
                               partition=src.episode_ids % 2)
    assert [s.n_transitions for s in keyed] == [int((src.episode_ids % 2 == k).sum())
                                                for k in (0, 1)]


@pytest.mark.parametrize("change, message", [
    ({"actions": "half"}, r"actions: not integer-valued \(row 0"),
    ({"actions": "text"}, "actions: expected numbers, got dtype <U"),
    ({"observations": "3col"}, r"observations: rows of shape \(3,\), expected \(4,\)"),
    ({"terminated": "two"}, r"terminated: flags must be booleans or 0/1 \(row \d+: 2\)"),
    ({"rewards": "short"}, r"rewards: expected shape \(\d+,\)"),
    ({"observations": "nan"}, "observations: 1 non-finite values"),
    ({"actions": "range"}, "actions out of range"),
])
def test_shards_from_arrays_conversion_errors(change: dict, message: str) -> None:
    src = collect_shard("CartPole-v1", 2, 1.0, 0)
    arrays = {k: getattr(src, k) for k in ("observations", "actions", "rewards",
                                            "next_observations", "terminated", "truncated")}
    (key, how), = change.items()
    value = arrays[key]
    arrays[key] = {
        "half": lambda v: v + 0.5, "text": lambda v: v.astype(str), "3col": lambda v: v[:, :3],
        "two": lambda v: np.where(v, 2, 0), "short": lambda v: v[:-1],
        "range": lambda v: v + 2,
        "nan": lambda v: np.where(np.arange(v.size).reshape(v.shape) == 0, np.nan, v),
    }[how](value)
    with pytest.raises(ShardError, match=message):
        shards_from_arrays(*arrays.values(), env_id="CartPole-v1")


def test_data_import_cli_round_trip(tmp_path: Path) -> None:
    import argparse

    src = collect_shard("Acrobot-v1", 4, 1.0, 0)
    npz = tmp_path / "mine.npz"
    arrays = {k: getattr(src, k) for k in ("observations", "actions", "rewards",
                                            "next_observations", "terminated", "truncated")}
    np.savez(npz, **arrays)
    parser = argparse.ArgumentParser()
    register_data_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "import", "--npz", str(npz), "--env", "Acrobot-v1",
                              "--num-partitions", "2", "--out", str(tmp_path / "shards")])
    assert args.func(args) == 0
    loaded = [load_shard(tmp_path / "shards" / f"shard-{i}.npz", "Acrobot-v1") for i in (0, 1)]
    assert sum(s.n_transitions for s in loaded) == src.n_transitions
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    assert sum(e["n_transitions"] for e in manifest["shards"]) == src.n_transitions
    args = parser.parse_args(["data", "import", "--npz", str(npz), "--env", "Nope-v1",
                              "--out", str(tmp_path / "x")])
    assert args.func(args) == 2


# ------------------------------------------------------------ encoder scales
@pytest.mark.parametrize("scale, message", [
    ([1.0, np.inf], r"coordinates \[1\] are \[inf\]"),
    ([0.0, 1.0], r"coordinates \[0\] are \[0.0\]"),
    ([1.0, -2.0], r"coordinates \[1\] are \[-2.0\]"),
    ([np.nan, 1.0], r"coordinates \[0\] are \[nan\]"),
    ([1.0, 1.0, 1.0], "scale must be 2 positive finite numbers"),
    ("wide", "scale must be numbers, 'auto' or None"),
])
def test_encoder_refuses_bad_scales(scale, message) -> None:
    with pytest.raises(ValueError, match=message):
        HDEncoder(16, 1.0, scale=scale).fit(np.zeros((3, 2)))


def test_encoder_auto_scale_learns_from_the_data() -> None:
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.uniform(-300, 300, 5000), np.full(5000, 2.0)])
    enc = HDEncoder(64, 1.0, scale="auto", random_state=0).fit(X)
    np.testing.assert_allclose(enc.scale_, [300.0, 1.0], rtol=0.05)


def test_server_app_fails_the_run_on_a_bad_env_id(caplog) -> None:
    """flwr runs no app code before the run starts: the ServerApp's main raises (Flower
    then marks the run failed), naming the key, before it contacts any node."""
    from flwr.app import Context, RecordDict

    from fedqhd.server.app import main as server_main

    class NoGrid:  # any use of the grid would fail differently
        pass

    with pytest.raises(ConfigError, match="'env-id' = 'CartPol-v1' is invalid"):
        server_main(NoGrid(), Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                      run_config={"env-id": "CartPol-v1"}))


def test_the_final_log_line_keeps_a_zero_and_says_nan_only_when_missing():
    from fedqhd.learners.base import greedy_final_line
    assert greedy_final_line({"return-mean": 0.0, "return-std": 0.0, "round": 2}) == (
        "final greedy return 0.0 +- 0.0 after 2 rounds")  # one evaluation episode: std 0
    assert greedy_final_line({"round": 1}) == "final greedy return nan +- nan after 1 rounds"
    ref = {"random-mean": 21.04, "best-constant-action": 1, "best-constant-mean": 9.35}
    assert greedy_final_line({"return-mean": 500.0, "return-std": 0.0, "round": 30,
                              "reference": ref}) == (
        "final greedy return 500.0 +- 0.0 after 30 rounds (references: uniform random 21.0, "
        "best constant action 1 9.3)")
