"""Tests of fedqhd.envs.classic: specs, dynamics variants, heuristics, rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from fedqhd.envs import (
    ENV_IDS,
    get_spec,
    heuristic_action,
    iter_episode,
    make_env,
    rollout_returns,
    validate_dynamics,
)

#: heuristic mean return must beat the uniform random policy by at least this much
MARGIN = {
    "CartPole-v1": 300.0,
    "Acrobot-v1": 200.0,
    "MountainCar-v0": 40.0,
    "LunarLander-v3": 200.0,
}


def _random_policy(n_actions: int, seed: int):
    rng = np.random.default_rng(seed)
    return lambda obs: int(rng.integers(n_actions))


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_spec_matches_gymnasium(env_id: str) -> None:
    spec = get_spec(env_id)
    env = make_env(env_id)
    assert env.observation_space.shape == (spec.obs_dim,)
    assert env.action_space.n == spec.n_actions
    assert env.spec.max_episode_steps == spec.max_episode_steps
    assert spec.obs_bound.shape == (spec.obs_dim,) and np.all(spec.obs_bound > 0)
    assert set(spec.dynamics_ranges) == set(spec.dynamics_defaults)
    for name, (lo, hi) in spec.dynamics_ranges.items():
        assert lo <= spec.dynamics_defaults[name] <= hi
    env.close()


def test_cartpole_bounds_are_the_papers() -> None:
    np.testing.assert_array_equal(get_spec("CartPole-v1").obs_bound, [2.4, 3.0, 0.5, 3.5])


def test_unknown_env_lists_valid_ids() -> None:
    with pytest.raises(ValueError, match="CartPole-v1.*Acrobot-v1.*MountainCar-v0.*LunarLander-v3"):
        get_spec("Nope-v0")
    # gymnasium knows it, but its actions are continuous: the reason, not "unknown"
    with pytest.raises(ValueError, match="Pendulum-v1: fedqhd needs Discrete actions"):
        get_spec("Pendulum-v1")
    with pytest.raises(ValueError, match="unknown env id"):
        make_env("Nope-v0")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_heuristic_beats_random(env_id: str) -> None:
    spec = get_spec(env_id)
    heur = rollout_returns(env_id, lambda o: heuristic_action(env_id, o), 5, seed=0)
    rand = rollout_returns(env_id, _random_policy(spec.n_actions, 0), 5, seed=0)
    assert heur.shape == rand.shape == (5,)
    assert heur.mean() > rand.mean() + MARGIN[env_id], (heur.mean(), rand.mean())


def test_heuristics_solve_the_easy_tasks() -> None:
    assert (
        rollout_returns("CartPole-v1", lambda o: heuristic_action("CartPole-v1", o), 3, 1).min()
        == 500
    )
    mc = rollout_returns("MountainCar-v0", lambda o: heuristic_action("MountainCar-v0", o), 5, 1)
    assert mc.max() > -200 and mc.mean() > -150


def test_rollout_returns_deterministic_for_a_seed() -> None:
    env_id = "LunarLander-v3"
    pol = lambda o: heuristic_action(env_id, o)  # noqa: E731
    a = rollout_returns(env_id, pol, 3, seed=5)
    np.testing.assert_array_equal(a, rollout_returns(env_id, pol, 3, seed=5))
    assert not np.array_equal(a, rollout_returns(env_id, pol, 3, seed=6))


def _first_steps(env_id: str, dynamics: dict[str, float] | None, n: int = 30) -> np.ndarray:
    env = make_env(env_id, dynamics)
    steps = []
    for t in iter_episode(env, lambda o: heuristic_action(env_id, o), reset_seed=3):
        steps.append(t.next_observation)
        if len(steps) == n:
            break
    env.close()
    return np.asarray(steps)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_each_dynamics_parameter_changes_the_physics(env_id: str) -> None:
    base = _first_steps(env_id, None)
    np.testing.assert_array_equal(base, _first_steps(env_id, validate_dynamics(env_id, None)))
    for name, (lo, hi) in get_spec(env_id).dynamics_ranges.items():
        default = get_spec(env_id).dynamics_defaults[name]
        value = hi if default != hi else lo
        changed = _first_steps(env_id, {name: value})
        assert not np.allclose(base, changed), f"{env_id}: {name}={value} had no effect"


def test_cartpole_derived_attributes_recomputed() -> None:
    u = make_env("CartPole-v1", {"length": 1.0, "masspole": 0.2, "masscart": 2.0}).unwrapped
    assert u.polemass_length == pytest.approx(0.2)
    assert u.total_mass == pytest.approx(2.2)
    # a fresh stock env is untouched (attributes set on the instance, not the class)
    assert make_env("CartPole-v1").unwrapped.polemass_length == pytest.approx(0.05)


def test_acrobot_dynamics_do_not_leak_into_the_class() -> None:
    make_env("Acrobot-v1", {"link_length_2": 1.2})
    u = make_env("Acrobot-v1").unwrapped
    assert u.LINK_LENGTH_2 == 1.0 and u.LINK_COM_POS_2 == 0.5


def test_lunar_lander_wind_via_constructor() -> None:
    u = make_env("LunarLander-v3", {"wind_power": 5.0, "gravity": -9.0}).unwrapped
    assert u.enable_wind and u.wind_power == 5.0 and u.gravity == -9.0
    assert not make_env("LunarLander-v3").unwrapped.enable_wind


@pytest.mark.parametrize(
    ("dynamics", "message"),
    [
        ({"pole_length": 0.5}, "unknown dynamics parameter 'pole_length'.*valid: gravity"),
        ({"length": 5.0}, r"length=5.0 outside the range \[0.25, 1.0\]"),
        ({"gravity": float("nan")}, "gravity=nan outside"),
        ({"gravity": "heavy"}, "not a number"),
    ],
)
def test_invalid_dynamics_rejected(dynamics: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_env("CartPole-v1", dynamics)


def test_time_limit_truncates_without_terminating() -> None:
    steps = list(
        iter_episode(make_env("CartPole-v1"), lambda o: heuristic_action("CartPole-v1", o), 0)
    )
    assert len(steps) == 500
    assert steps[-1].truncated and not steps[-1].terminated
    assert not any(t.truncated or t.terminated for t in steps[:-1])


def test_rollout_rejects_zero_episodes() -> None:
    with pytest.raises(ValueError, match="n_episodes"):
        rollout_returns("CartPole-v1", lambda o: 0, 0, seed=0)


@pytest.mark.parametrize("env_id,dynamics", [("CartPole-v1", None),
                                              ("CartPole-v1", {"length": 0.8}),
                                              ("Acrobot-v1", None),
                                              ("MountainCar-v0", {"force": 0.0012}),
                                              ("LunarLander-v3", None)])
def test_batched_rollouts_equal_one_at_a_time_rollouts(env_id, dynamics):
    """The numpy steppers (CartPole, Acrobot, MountainCar) and the gymnasium fallback
    (LunarLander) give the returns of gymnasium's envs stepped one episode at a time."""
    from fedqhd.encoders import HDEncoder
    from fedqhd.envs import batch_rollout_returns, get_spec, rollout_returns

    spec = get_spec(env_id)
    enc = HDEncoder(200, 1.0, scale=spec.obs_bound, random_state=0).fit(
        np.zeros((1, spec.obs_dim)))
    readout = np.random.default_rng(1).normal(size=(200, spec.n_actions))
    one = rollout_returns(env_id, lambda s: int(np.argmax(enc.encode(s[None])[0] @ readout)),
                          6, seed=3, dynamics=dynamics)
    batch = batch_rollout_returns(env_id, lambda s: np.argmax(enc.encode(s) @ readout, axis=1),
                                  6, seed=3, dynamics=dynamics)
    np.testing.assert_array_equal(one, batch)
    if env_id == "CartPole-v1":
        assert np.ptp(one) > 0  # different start states, different returns
