"""Environments: the four gymnasium control tasks with specs, dynamics variants and
heuristic controllers (:mod:`fedqhd.envs.classic`)."""

from fedqhd.envs.classic import (
    ENV_IDS,
    EnvSpec,
    Transition,
    episode_seeds,
    get_spec,
    heuristic_action,
    iter_episode,
    make_env,
    rollout_returns,
    validate_dynamics,
)

__all__ = [
    "ENV_IDS",
    "EnvSpec",
    "Transition",
    "episode_seeds",
    "get_spec",
    "heuristic_action",
    "iter_episode",
    "make_env",
    "rollout_returns",
    "validate_dynamics",
]
