"""Settings derived for an environment nobody tuned (fedqhd.presets.derive)."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from fedqhd.config import ConfigError, RunConfig
from fedqhd.envs import get_spec, register_env, unregister_env
from fedqhd.presets.derive import derived_preset, random_rollouts


class Drift(gym.Env):
    """A 1-D walk on an unbounded line: x += a - 1 + noise; reward -|x| per step."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float64)
    action_space = gym.spaces.Discrete(3)
    reward = None  #: a fixed reward instead of -|x| (the bad-input cases)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1.0, 1.0))
        return np.array([self.x]), {}

    def step(self, action):
        self.x += int(action) - 1 + float(self.np_random.normal(0.0, 0.1))
        reward = -abs(self.x) if self.reward is None else self.reward
        return np.array([self.x]), reward, False, False, {}


class Box10(Drift):
    """The same walk, observed through a Box of [-10, 10] it rarely leaves."""

    observation_space = gym.spaces.Box(-10.0, 10.0, shape=(1,), dtype=np.float64)

    def step(self, action):
        obs, reward, *rest = super().step(action)
        return np.clip(obs, -10.0, 10.0), reward, *rest


class NaNReward(Drift):
    reward = math.nan


class Edge(Drift):
    """Observations in a Box of [-1, 1], almost always at -1: the robust range about the
    median (2) is wider than the Box's half-width (1)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float64)

    def step(self, action):
        _, reward, *rest = super().step(action)
        return np.array([1.0 if self.np_random.random() < 0.05 else -1.0]), reward, *rest


@pytest.fixture
def envs():
    ids = {"test/Drift-v0": (Drift, 40), "test/Box10-v0": (Box10, 8),
           "test/NaNReward-v0": (NaNReward, 10), "test/Edge-v0": (Edge, 50)}
    for env_id, (factory, horizon) in ids.items():
        register_env(env_id, factory=factory, max_episode_steps=horizon)
    yield ids
    for env_id in ids:
        unregister_env(env_id)


def test_the_derived_discount_scale_and_data_follow_the_spec_and_the_rollouts(envs):
    # horizon 40: values look a quarter of it ahead, 1 - 4 / 40; at least 0.9
    drift = derived_preset("test/Drift-v0", "offline")
    assert drift["gamma"] == pytest.approx(0.9)
    assert derived_preset("test/Box10-v0", "offline")["gamma"] == pytest.approx(0.9)
    long = "test/Long-v0"
    register_env(long, factory=Drift, max_episode_steps=1000)
    try:
        assert derived_preset(long, "offline")["gamma"] == pytest.approx(0.99)  # capped
    finally:
        unregister_env(long)
    # no heuristic controller: uniform-random behaviour; enough episodes for 1000 rows
    assert (drift["epsilon-min"], drift["epsilon-max"]) == (1.0, 1.0)
    assert drift["episodes-per-client"] == 25  # ceil(1000 / 40)
    assert derived_preset("test/Box10-v0", "offline")["episodes-per-client"] == 125
    # the length scale is a robust range of the visited states: an unbounded Box's bound is
    # already inferred from them (multiplier 1); a wide bounded Box is narrowed to them
    assert drift["obs-scale"] == pytest.approx([1.0])
    obs, rewards, lengths = random_rollouts("test/Box10-v0")
    visited = np.percentile(obs[:, 0], 99) - np.median(obs[:, 0])
    box = derived_preset("test/Box10-v0", "offline")["obs-scale"][0]
    assert get_spec("test/Box10-v0").obs_bound[0] == 10.0
    assert 0.1 < box < 0.6 and box * 10.0 >= 0.9 * visited
    assert lengths.tolist() == [8] * len(lengths) and np.all(rewards <= 0)
    # never wider than a finite Box
    assert derived_preset("test/Edge-v0", "offline")["obs-scale"] == pytest.approx([1.0])


def test_online_settings_explore_for_a_third_of_the_episodes(envs):
    online = derived_preset("test/Drift-v0", "online", episodes=300)
    start, decay, floor = online["epsilon"]
    assert (start, floor) == (1.0, 0.01)
    assert start * decay ** 100 == pytest.approx(0.05, rel=1e-4)
    assert (online["hd-dim"], online["mc-mix"], online["episodes-per-round"]) == (1000, 0.5, 20)


def test_the_run_config_takes_them_under_auto_only(envs):
    cfg = RunConfig.from_run_config({"env-id": "test/Drift-v0"})
    assert (cfg.gamma, cfg.epsilon_min, cfg.episodes_per_client) == (0.9, 1.0, 25)
    assert cfg.online.obs_scale == pytest.approx((1.0,))
    online = RunConfig.from_run_config({"env-id": "test/Drift-v0", "protocol": "online",
                                        "online-episodes": 300})
    assert (online.hd_dim, online.online.mc_mix, online.num_server_rounds) == (1000, 0.5, 15)
    manual = RunConfig.from_run_config({"env-id": "test/Drift-v0", "preset": "manual"})
    assert (manual.gamma, manual.episodes_per_client) == (0.99, 5)  # the keys' defaults
    # the built-in tasks keep their offline defaults (their presets are online settings)
    cartpole = RunConfig.from_run_config({})
    assert (cartpole.gamma, cartpole.episodes_per_client, cartpole.epsilon_min) == (
        0.99, 5, 0.8)
    # a key the derivation sets, given with another value, is refused, naming both
    with pytest.raises(ConfigError, match=r"'gamma' = 0.95 \(preset: 0.9\).*derived"):
        RunConfig.from_run_config({"env-id": "test/Drift-v0", "gamma": 0.95})


def test_an_env_without_a_finite_reward_says_what_to_give_by_hand(envs):
    with pytest.raises(ConfigError, match=r"test/NaNReward-v0: no finite reward in 20 "
                                          r"uniform-random episodes.*by hand.*gamma"):
        RunConfig.from_run_config({"env-id": "test/NaNReward-v0"})
    # by hand, it runs
    cfg = RunConfig.from_run_config({"env-id": "test/NaNReward-v0", "preset": "manual",
                                     "epsilon-min": 1.0})
    assert cfg.gamma == 0.99
