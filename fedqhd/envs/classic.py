"""The four gymnasium control tasks (entries of :mod:`fedqhd.envs.registry`), and
what every registered environment offers: dynamics variants, heuristics, rollouts.

The built-in tasks are registered here with their specs, dynamics setters and
heuristic controllers; a user's environments are added with
:func:`fedqhd.envs.register_env` and go through the same functions:

* :class:`EnvSpec` -- dimensions, observation scale (for the HD encoder), time
  limit, and the physical parameters a ``dynamics-skew`` partition may vary,
  with ranges in which the task stays solvable by the heuristic controller.
* :func:`make_env` -- a gymnasium env with those parameters applied.
* :func:`heuristic_action` -- a simple controller per task; the behaviour
  policy mixes it with uniform random actions.
* :func:`rollout_returns` -- episode returns of any policy, deterministic for a
  seed (greedy-policy evaluation).

Measured with ``rollout_returns(..., n_episodes=20, seed=0)`` at default
dynamics (mean return): heuristic / uniform random policy --
CartPole-v1 500.0 / 21.0, Acrobot-v1 -95.0 / -498.4, MountainCar-v0 -119.6 / -200.0,
LunarLander-v3 245.2 / -169.5. At the worst corner of ``dynamics_ranges`` (5
episodes) the heuristic still gets 500.0, -177.6, -172.8 and 128.4.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np

from fedqhd.envs import registry
from fedqhd.envs.registry import ENV_IDS, EnvSpec, get_spec
from fedqhd.seeding import episode_rng

__all__ = [
    "BUILTIN_ENV_IDS",
    "ENV_IDS",
    "EnvSpec",
    "Transition",
    "episode_seeds",
    "get_spec",
    "has_heuristic",
    "heuristic_action",
    "iter_episode",
    "make_env",
    "rollout_returns",
    "validate_dynamics",
]

#: the four built-in control tasks (:data:`ENV_IDS` also lists the user's)
BUILTIN_ENV_IDS: tuple[str, ...] = (
    "CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3")

Policy = Callable[[np.ndarray], int]


def _bound(*values: float) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    arr.setflags(write=False)
    return arr


_SPECS: dict[str, EnvSpec] = {
    spec.env_id: spec
    for spec in (
        EnvSpec(
            env_id="CartPole-v1",
            obs_dim=4,
            n_actions=2,
            obs_bound=_bound(2.4, 3.0, 0.5, 3.5),
            max_episode_steps=500,
            reward_range=(0.0, 1.0),
            # ``length`` is gymnasium's half pole length
            dynamics_ranges={
                "length": (0.25, 1.0),
                "gravity": (7.0, 13.0),
                "masscart": (0.5, 2.0),
                "masspole": (0.05, 0.3),
            },
            dynamics_defaults={"length": 0.5, "gravity": 9.8, "masscart": 1.0, "masspole": 0.1},
        ),
        EnvSpec(
            env_id="Acrobot-v1",
            obs_dim=6,
            n_actions=3,
            obs_bound=_bound(1.0, 1.0, 1.0, 1.0, 4 * math.pi, 9 * math.pi),
            max_episode_steps=500,
            reward_range=(-1.0, 0.0),
            dynamics_ranges={
                "link_mass_1": (0.8, 1.2),
                "link_mass_2": (0.8, 1.2),
                "link_length_1": (0.8, 1.2),
                "link_length_2": (0.8, 1.2),
            },
            dynamics_defaults={
                "link_mass_1": 1.0,
                "link_mass_2": 1.0,
                "link_length_1": 1.0,
                "link_length_2": 1.0,
            },
        ),
        EnvSpec(
            env_id="MountainCar-v0",
            obs_dim=2,
            n_actions=3,
            obs_bound=_bound(1.2, 0.07),
            max_episode_steps=200,
            reward_range=(-1.0, 0.0),
            dynamics_ranges={"force": (0.0008, 0.0013), "gravity": (0.0020, 0.0030)},
            dynamics_defaults={"force": 0.001, "gravity": 0.0025},
        ),
        EnvSpec(
            env_id="LunarLander-v3",
            obs_dim=8,
            n_actions=4,
            obs_bound=_bound(1.0, 1.6, 2.0, 2.0, 1.5, 2.0, 1.0, 1.0),
            max_episode_steps=1000,
            # crash -100, landing +100; shaping and leg contact: within +-110 measured
            reward_range=(-150.0, 150.0),
            # wind_power > 0 turns gymnasium's wind (and turbulence) on
            dynamics_ranges={"gravity": (-11.0, -8.0), "wind_power": (0.0, 10.0)},
            dynamics_defaults={"gravity": -10.0, "wind_power": 0.0},
        ),
    )
}


def validate_dynamics(env_id: str, dynamics: dict[str, float] | None) -> dict[str, float]:
    """Check a dynamics override and return it complete (defaults filled in).

    Parameters
    ----------
    env_id : str
        Task id.
    dynamics : dict[str, float] or None
        Parameter overrides; ``None`` or ``{}`` means stock dynamics.

    Returns
    -------
    dict[str, float]
        Every parameter of ``dynamics_ranges``, as floats.

    Raises
    ------
    ValueError
        On an unknown parameter name, a non-finite value, or a value outside
        the parameter's range in :attr:`EnvSpec.dynamics_ranges`.
    """
    spec = get_spec(env_id)
    full = dict(spec.dynamics_defaults)
    for name, value in (dynamics or {}).items():
        if name not in spec.dynamics_ranges:
            raise ValueError(
                f"{env_id}: unknown dynamics parameter {name!r}; "
                f"valid: {', '.join(sorted(spec.dynamics_ranges))}"
            )
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{env_id}: dynamics {name}={value!r} is not a number") from None
        lo, hi = spec.dynamics_ranges[name]
        if not (math.isfinite(value) and lo <= value <= hi):
            raise ValueError(f"{env_id}: dynamics {name}={value} outside the range [{lo}, {hi}]")
        full[name] = value
    return full


def _apply_cartpole(env: gym.Env, p: dict[str, float]) -> None:
    # the physics constants are plain attributes of the concrete env class, not of gym.Env
    u: Any = env.unwrapped
    u.length, u.gravity, u.masscart, u.masspole = (
        p["length"],
        p["gravity"],
        p["masscart"],
        p["masspole"],
    )
    # derived quantities the step function reads directly
    u.total_mass = u.masspole + u.masscart
    u.polemass_length = u.masspole * u.length


def _apply_acrobot(env: gym.Env, p: dict[str, float]) -> None:
    u: Any = env.unwrapped
    u.LINK_MASS_1, u.LINK_MASS_2 = p["link_mass_1"], p["link_mass_2"]
    u.LINK_LENGTH_1, u.LINK_LENGTH_2 = p["link_length_1"], p["link_length_2"]
    # uniform rods: centre of mass at mid-length (stock: 1.0 m -> 0.5 m)
    u.LINK_COM_POS_1 = p["link_length_1"] / 2
    u.LINK_COM_POS_2 = p["link_length_2"] / 2


def _apply_mountain_car(env: gym.Env, p: dict[str, float]) -> None:
    u: Any = env.unwrapped
    u.force, u.gravity = p["force"], p["gravity"]


#: post-construction setters; LunarLander takes its parameters in the constructor
_APPLY: dict[str, Callable[[gym.Env, dict[str, float]], None]] = {
    "CartPole-v1": _apply_cartpole,
    "Acrobot-v1": _apply_acrobot,
    "MountainCar-v0": _apply_mountain_car,
}


def make_env(
    env_id: str, dynamics: dict[str, float] | None = None, render_mode: str | None = None
) -> gym.Env:
    """Create a registered env with (optionally) modified physical parameters.

    Parameters
    ----------
    env_id : str
        A registered id (:data:`ENV_IDS`).
    dynamics : dict[str, float] or None
        Overrides of parameters in :attr:`EnvSpec.dynamics_ranges`; missing ones
        keep the stock value.
    render_mode : str or None
        Passed to the env's constructor only when given.

    Returns
    -------
    gymnasium.Env
        With a time limit, and observations flattened to vectors.

    Raises
    ------
    ValueError
        On an unknown env id or an invalid dynamics override.
    """
    params = validate_dynamics(env_id, dynamics)
    return registry.build_env(env_id, params, render_mode)


def _lunar_lander_kwargs(params: dict[str, float]) -> dict[str, Any]:
    # LunarLander takes its parameters in the constructor
    if not params:
        return {}
    return {"gravity": params["gravity"], "enable_wind": params["wind_power"] > 0.0,
            "wind_power": params["wind_power"]}


def _cartpole_heuristic(obs: np.ndarray) -> int:
    # push towards where the pole is falling; the small cart terms keep it centred
    x, x_dot, theta, theta_dot = obs
    return int(theta + 0.3 * theta_dot + 0.01 * x + 0.1 * x_dot > 0.0)


def _acrobot_heuristic(obs: np.ndarray) -> int:
    # energy pumping: torque on joint 2 in the direction it already swings
    return 2 if obs[5] > 0.0 else 0


def _mountain_car_heuristic(obs: np.ndarray) -> int:
    # push along the velocity to build up the swing
    return 2 if obs[1] >= 0.0 else 0


_DISCRETE_LANDER = SimpleNamespace(unwrapped=SimpleNamespace(continuous=False))


def _lunar_lander_heuristic(obs: np.ndarray) -> int:
    # gymnasium's own controller only reads ``env.unwrapped.continuous``; imported here:
    # Box2D's import warns (SWIG types), which every run without LunarLander can skip
    from gymnasium.envs.box2d.lunar_lander import heuristic

    return int(heuristic(_DISCRETE_LANDER, obs))


_HEURISTICS: dict[str, Policy] = {
    "CartPole-v1": _cartpole_heuristic,
    "Acrobot-v1": _acrobot_heuristic,
    "MountainCar-v0": _mountain_car_heuristic,
    "LunarLander-v3": _lunar_lander_heuristic,
}

for _spec in _SPECS.values():
    registry._register_builtin(
        _spec, _HEURISTICS[_spec.env_id], apply_dynamics=_APPLY.get(_spec.env_id),
        make_kwargs=_lunar_lander_kwargs if _spec.env_id == "LunarLander-v3" else None)


def has_heuristic(env_id: str) -> bool:
    """Whether ``env_id`` has a heuristic controller (needed by behaviour epsilon < 1)."""
    return registry.get_entry(env_id).heuristic is not None


def heuristic_action(env_id: str, obs: np.ndarray) -> int:
    """Action of the task's simple controller.

    Parameters
    ----------
    env_id : str
        A registered id with a heuristic.
    obs : np.ndarray
        Observation of shape ``(obs_dim,)``.

    Returns
    -------
    int
        Action in ``0 .. n_actions - 1``.

    Raises
    ------
    ValueError
        If the id is unknown or has no heuristic controller.
    """
    heuristic = registry.get_entry(env_id).heuristic
    if heuristic is None:
        raise ValueError(f"{env_id}: no heuristic controller registered; collect its data "
                         "with random behaviour (epsilon 1.0: run-config epsilon-min=1.0 "
                         "epsilon-max=1.0) or pass heuristic=... to register_env")
    return int(heuristic(np.asarray(obs)))


def episode_seeds(seed: int, n_episodes: int) -> np.ndarray:
    """Reset seeds for ``n_episodes`` episodes, derived from one seed.

    Each episode gets its own reset seed so episodes are independent of how
    many steps earlier ones took.
    """
    rng = episode_rng(seed)
    return rng.integers(0, 2**31 - 1, size=int(n_episodes))


@dataclass(frozen=True)
class Transition:
    """One environment step, as returned by :func:`iter_episode`."""

    observation: np.ndarray
    action: int
    reward: float
    next_observation: np.ndarray
    terminated: bool
    truncated: bool


def iter_episode(env: gym.Env, policy: Policy, reset_seed: int) -> Iterator[Transition]:
    """Run one episode of ``policy`` and yield its transitions.

    The episode ends at termination or at the time limit (truncation); both
    flags are passed on unchanged.
    """
    obs, _ = env.reset(seed=int(reset_seed))
    while True:
        action = int(policy(obs))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        yield Transition(obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
        if terminated or truncated:
            return
        obs = next_obs


def rollout_returns(
    env_id: str,
    policy: Policy,
    n_episodes: int,
    seed: int,
    dynamics: dict[str, float] | None = None,
) -> np.ndarray:
    """Undiscounted episode returns of a policy.

    Parameters
    ----------
    env_id : str
        A registered id (:data:`ENV_IDS`).
    policy : callable
        Maps an observation to an action.
    n_episodes : int
        Number of episodes (>= 1).
    seed : int
        Determines every episode's initial state (see :func:`episode_seeds`);
        a deterministic policy gets the same returns for the same seed.
    dynamics : dict[str, float] or None
        Physical parameters, as for :func:`make_env`.

    Returns
    -------
    np.ndarray
        Shape ``(n_episodes,)``, float64.
    """
    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    env = make_env(env_id, dynamics)
    try:
        returns = [
            sum(t.reward for t in iter_episode(env, policy, reset_seed))
            for reset_seed in episode_seeds(seed, n_episodes)
        ]
        return np.asarray(returns, dtype=np.float64)
    finally:
        env.close()
