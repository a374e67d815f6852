"""Reference returns (random and constant-action policies) of registered envs."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from fedqhd.envs import (
    episode_seeds,
    heuristic_action,
    rollout_returns,
    unregister_env,
)
from fedqhd.envs.reference import (
    ReferenceReturns,
    beats,
    random_policy_returns,
    reference_returns,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_env"


class Steps(gym.Env):
    """Episodes of a length ``L`` in 1..49 drawn at reset; each step pays ``rewards[action]``.

    So "always ``a``" gets exactly ``rewards[a] * L`` per episode, and the mean over a set
    of episode seeds is known without running a policy."""

    observation_space = gym.spaces.Box(0.0, 100.0, shape=(2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, rewards: tuple[float, float, float] = (1.0, 10.0, 0.0)) -> None:
        self.rewards = rewards
        self.t = self.length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(1, 50))
        return np.array([0.0, self.length], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.t, self.length], dtype=np.float32)
        return obs, self.rewards[int(action)], self.t >= self.length, False, {}


class FixedSteps(Steps):
    """Every episode 30 steps long whatever the reset seed: returns differ only by actions."""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        self.length = 30
        return obs, info


class ContinuousSteps(Steps):
    action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)


def lengths(seed: int, n_episodes: int) -> np.ndarray:
    """The episode lengths of :class:`Steps` on ``episode_seeds(seed, n_episodes)``,
    read from the env itself (no policy involved)."""
    env = Steps()
    return np.array([env.reset(seed=int(s))[0][1] for s in episode_seeds(seed, n_episodes)])


@pytest.fixture
def example_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """examples/custom_env's MyEnv-v0, registered by importing the user's module."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    unregister_env("MyEnv-v0")
    sys.modules.pop("my_env", None)
    try:
        import my_env  # noqa: F401 (registers MyEnv-v0)

        yield "MyEnv-v0"
    finally:
        unregister_env("MyEnv-v0")
        sys.modules.pop("my_env", None)


# ------------------------------------------------------------ built-in envs
def test_cartpole_numbers_are_plausible_and_the_heuristic_beats_them() -> None:
    ref = reference_returns("CartPole-v1", n_episodes=20, seed=0)
    assert len(ref.constant_means) == 2
    # either constant push drops the pole in about 9-10 steps; random actions last ~20
    assert all(8.0 <= m <= 11.0 for m in ref.constant_means), ref
    assert 15.0 <= ref.random_mean <= 35.0 and 3.0 <= ref.random_std <= 25.0, ref
    assert ref.best_constant_mean == max(ref.constant_means)
    assert ref.constant_means[ref.best_constant_action] == ref.best_constant_mean
    assert (ref.n_episodes, ref.seed) == (20, 0)
    heuristic = rollout_returns("CartPole-v1", lambda o: heuristic_action("CartPole-v1", o),
                                20, seed=0).mean()
    assert heuristic == 500.0 and beats(heuristic, ref)
    # neither trivial policy beats the references it is one of
    assert not beats(ref.random_mean, ref) and not beats(ref.best_constant_mean, ref)


def test_mountain_car_ties_go_to_action_0_and_the_heuristic_beats_them() -> None:
    ref = reference_returns("MountainCar-v0", n_episodes=5, seed=0)
    # no trivial policy reaches the flag in 200 steps
    assert ref.constant_means == (-200.0, -200.0, -200.0)
    assert (ref.random_mean, ref.random_std) == (-200.0, 0.0)
    assert (ref.best_constant_action, ref.best_constant_mean) == (0, -200.0)
    heuristic = rollout_returns(
        "MountainCar-v0", lambda o: heuristic_action("MountainCar-v0", o), 5, seed=0).mean()
    assert beats(heuristic, ref)


def test_the_same_seed_gives_the_same_numbers_another_seed_others() -> None:
    a = reference_returns("CartPole-v1", n_episodes=10, seed=3)
    assert reference_returns("CartPole-v1", n_episodes=10, seed=3) == a
    b = reference_returns("CartPole-v1", n_episodes=10, seed=4)
    assert b.random_mean != a.random_mean and b.constant_means != a.constant_means
    assert b.seed == 4


def test_the_random_actions_follow_the_seed(temp_envs) -> None:
    # episodes that are the same for every seed: only the action draws can differ
    env_id = temp_envs("test/Fixed-v0", factory=FixedSteps, max_episode_steps=100)
    a = random_policy_returns(env_id, n_episodes=4, seed=3)
    np.testing.assert_array_equal(random_policy_returns(env_id, n_episodes=4, seed=3), a)
    b = random_policy_returns(env_id, n_episodes=4, seed=4)
    assert not np.array_equal(a, b)
    assert len(set(a.tolist())) == 4  # and each episode draws its own actions


def test_a_random_episode_does_not_depend_on_how_many_are_run() -> None:
    few = random_policy_returns("CartPole-v1", n_episodes=5, seed=7)
    many = random_policy_returns("CartPole-v1", n_episodes=12, seed=7)
    np.testing.assert_array_equal(few, many[:5])
    assert len(set(many.tolist())) > 3  # really random actions: the episodes differ


# ------------------------------------------------------------ common random numbers
def test_every_policy_runs_on_the_same_episode_seeds(temp_envs) -> None:
    rewards = (1.0, 10.0, 0.0)
    env_id = temp_envs("test/Steps-v0", factory=functools.partial(Steps, rewards),
                       max_episode_steps=100)
    length = lengths(5, 20)
    assert length.std() > 5  # episodes differ a lot: other seeds would show
    ref = reference_returns(env_id, n_episodes=20, seed=5)
    expected = tuple(r * length.mean() for r in rewards)
    assert ref.constant_means == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert (ref.best_constant_action, ref.best_constant_mean) == (
        1, pytest.approx(10.0 * length.mean(), rel=1e-12))
    # uniform random actions: on average 11/3 per step (every action drawn)
    assert ref.random_mean / length.mean() == pytest.approx(11.0 / 3.0, abs=0.8)

    # action-independent rewards: a random episode's return is its length, exactly
    flat = temp_envs("test/Flat-v0", factory=functools.partial(Steps, (1.0, 1.0, 1.0)),
                     max_episode_steps=100)
    ref = reference_returns(flat, n_episodes=20, seed=5)
    assert ref.random_mean == pytest.approx(length.mean(), rel=1e-12)
    assert ref.random_std == pytest.approx(length.std(), rel=1e-12)
    assert ref.constant_means == pytest.approx((length.mean(),) * 3, rel=1e-12)
    assert ref.best_constant_action == 0  # a tie goes to the lowest action


def test_a_user_registered_env_gets_references(example_env: str) -> None:
    ref = reference_returns(example_env, n_episodes=10, seed=0)
    assert len(ref.constant_means) == 2
    # pushing one way leaves the interval within ~10 steps; random pushes last longer
    assert all(m < 20.0 for m in ref.constant_means), ref
    assert ref.best_constant_mean < ref.random_mean < 100.0, ref
    # the linear rule of the example's docstring (observations flattened: x, v first)
    rule = rollout_returns(example_env, lambda o: int(o[0] + 5.0 * o[1] < 0.0), 10, seed=0)
    assert rule.mean() == 100.0 and beats(float(rule.mean()), ref)


# ------------------------------------------------------------ reporting
def test_line_and_dict() -> None:
    ref = ReferenceReturns(random_mean=-95.34, random_std=12.06, constant_means=(-80.2, -99.0),
                           best_constant_action=0, best_constant_mean=-80.2, n_episodes=20,
                           seed=0)
    assert ref.line() == "random -95.3 +- 12.1 | best constant action 0: -80.2 (20 episodes)"
    assert json.loads(json.dumps(ref.to_dict())) == {
        "random-mean": -95.34, "random-std": 12.06, "constant-means": [-80.2, -99.0],
        "best-constant-action": 0, "best-constant-mean": -80.2, "n-episodes": 20, "seed": 0}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.random_mean = 0.0  # type: ignore[misc]


def test_beats_needs_both_strictly() -> None:
    ref = ReferenceReturns(random_mean=20.0, random_std=1.0, constant_means=(9.0, 9.5),
                           best_constant_action=1, best_constant_mean=9.5, n_episodes=5, seed=0)
    assert beats(20.5, ref)
    assert not beats(20.0, ref)  # a tie with random
    assert not beats(15.0, ref)  # above the constants only
    assert not beats(math.nan, ref)
    high_constant = dataclasses.replace(ref, best_constant_mean=30.0)
    assert not beats(25.0, high_constant)  # above random only


# ------------------------------------------------------------ refusals
@pytest.mark.parametrize("n_episodes", [0, -3, 2.5, True, "5", None])
def test_bad_episode_counts_are_refused(n_episodes) -> None:
    with pytest.raises(ValueError, match=r"n_episodes must be an integer >= 1, got"):
        reference_returns("CartPole-v1", n_episodes=n_episodes)


def test_bad_envs_and_arguments_are_refused(temp_envs) -> None:
    with pytest.raises(ValueError, match="unknown env id 'Nope-v9'"):
        reference_returns("Nope-v9")
    cont = temp_envs("test/ContSteps-v0", factory=ContinuousSteps, max_episode_steps=100)
    with pytest.raises(ValueError, match="test/ContSteps-v0: fedqhd needs Discrete actions"):
        reference_returns(cont, n_episodes=2)
    with pytest.raises(ValueError, match="fedqhd/Inventory-v0.* has no EnvSpec"):
        reference_returns("fedqhd/Inventory-v0", n_episodes=2)  # the pool learner's task
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got -1"):
        reference_returns("CartPole-v1", n_episodes=2, seed=-1)
    with pytest.raises(ValueError, match="CartPole-v1: unknown dynamics parameter 'mass'"):
        reference_returns("CartPole-v1", n_episodes=2, dynamics={"mass": 1.0})
    # dynamics in range are used
    short = reference_returns("CartPole-v1", n_episodes=5, dynamics={"length": 0.25})
    assert short.constant_means != reference_returns("CartPole-v1", n_episodes=5).constant_means


def test_a_run_records_and_prints_its_references(tmp_path, caplog):
    """Every run's ``final`` entry holds the task's references (on the server's evaluation
    episode seeds) and the last log line names them."""
    import json
    import logging

    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.envs.reference import reference_returns
    from fedqhd.seeding import SERVER, evaluation_seed
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig(hd_dim=64, num_server_rounds=2, eval_episodes=2, episodes_per_client=2,
                    seed=3, output_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="flwr"):
        final, out = run_federation(
            InProcessGrid([client_app] * 2, run_config=cfg.to_run_config()), cfg)
    want = reference_returns("CartPole-v1", 20, seed=evaluation_seed(3, SERVER)).to_dict()
    assert final["reference"] == want
    assert json.loads((out / "results.json").read_text())["final"]["reference"] == want
    assert f"uniform random {want['random-mean']:.1f}" in caplog.text
