"""Behaviour data: epsilon-mixes of the heuristic controller and uniform random actions.

An epsilon near 1 gives mostly random, poorly performing trajectories (the
hard offline setting of the benchmark); epsilon 0 replays the heuristic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedqhd.data.shard import FORMAT_VERSION, Shard
from fedqhd.envs import (
    EnvSpec,
    episode_seeds,
    get_spec,
    has_heuristic,
    heuristic_action,
    iter_episode,
    make_env,
    spec_record,
)
from fedqhd.envs.classic import validate_dynamics
from fedqhd.seeding import behaviour_rng

__all__ = ["BEHAVIOUR_KIND", "check_collection", "collect_shard"]

#: ``metadata["behaviour"]["kind"]`` of shards written by :func:`collect_shard`
BEHAVIOUR_KIND = "epsilon-heuristic"
#: ... and of those collected around a given policy (``policy=``)
POLICY_BEHAVIOUR_KIND = "epsilon-policy"


def check_collection(
    env_id: str,
    n_episodes: int,
    epsilon: float | Sequence[float] | np.ndarray,
    dynamics: dict[str, float] | None = None,
    has_policy: bool = False,
) -> tuple[EnvSpec, np.ndarray, dict[str, float]]:
    """Raise the ``ValueError`` :func:`collect_shard` would for these arguments, without
    collecting anything (so a command refuses bad settings before a long run starts);
    returns the env's spec, each episode's epsilon and the complete dynamics."""
    spec = get_spec(env_id)
    if int(n_episodes) != n_episodes or n_episodes < 1:
        raise ValueError(f"n_episodes must be a positive integer, got {n_episodes!r}")
    per_episode = np.broadcast_to(np.asarray(epsilon, dtype=float), (int(n_episodes),))
    if not np.all((per_episode >= 0.0) & (per_episode <= 1.0)):
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
    if not has_policy and per_episode.min() < 1.0 and not has_heuristic(env_id):
        raise ValueError(f"{env_id}: no heuristic controller registered, so epsilon must be "
                         f"1.0 (uniform random behaviour), got {epsilon!r}")
    return spec, per_episode, validate_dynamics(env_id, dynamics)


def collect_shard(
    env_id: str,
    n_episodes: int,
    epsilon: float | Sequence[float] | np.ndarray,
    seed: int,
    dynamics: dict[str, float] | None = None,
    metadata_extra: dict[str, Any] | None = None,
    policy: Callable[[np.ndarray], int] | None = None,
) -> Shard:
    """Roll out the epsilon-heuristic behaviour policy and record every transition.

    At each step the behaviour takes a uniformly random action with probability
    ``epsilon`` and the heuristic controller's action otherwise (or ``policy``'s).

    Parameters
    ----------
    env_id : str
        A registered env (:data:`fedqhd.envs.ENV_IDS`).
    n_episodes : int
        Number of complete episodes (>= 1).
    epsilon : float or sequence of float
        Probability of a random action, in ``[0, 1]`` (one per episode, or one for all);
        must be 1 for an env registered without a heuristic controller (unless ``policy``).
    seed : int
        Determines initial states (via :func:`fedqhd.envs.episode_seeds`) and the
        behaviour's coin flips: the same arguments give identical shards.
    dynamics : dict[str, float] or None
        Physical parameters (see :func:`fedqhd.envs.make_env`).
    metadata_extra : dict or None
        JSON-serialisable keys added to the metadata (e.g. partition info); may
        not override the keys set here.
    policy : callable or None
        ``observation -> action``: the behaviour's non-random action instead of the
        heuristic's (private online FedQHD collects around a released readout's greedy
        policy).

    Returns
    -------
    Shard
        With metadata ``format_version``, ``env_id``, ``behaviour``, ``seed``,
        ``dynamics`` (complete, defaults filled in), ``n_episodes`` and ``env_spec``.
    """
    spec, per_episode, params = check_collection(env_id, n_episodes, epsilon, dynamics,
                                                 policy is not None)
    metadata: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "env_id": env_id,
        "behaviour": {"kind": BEHAVIOUR_KIND if policy is None else POLICY_BEHAVIOUR_KIND,
                      "epsilon": float(per_episode.mean())},
        "seed": int(seed),
        "dynamics": params,
        "n_episodes": int(n_episodes),
        "env_spec": spec_record(env_id),
    }
    clash = sorted(set(metadata) & set(metadata_extra or {}))
    if clash:
        raise ValueError(f"metadata_extra may not override {', '.join(clash)}")
    metadata.update(metadata_extra or {})

    # a stream for the behaviour's coin flips, independent of the reset seeds
    rng = behaviour_rng(seed)

    greedy = policy or (lambda obs: heuristic_action(env_id, obs))
    current = [0.0]  # the running episode's epsilon

    def behaviour(obs: np.ndarray) -> int:
        if rng.random() < current[0]:
            return int(rng.integers(spec.n_actions))
        return int(greedy(obs))

    rows: list[tuple] = []
    env = make_env(env_id, params)
    try:
        for episode, reset_seed in enumerate(episode_seeds(seed, n_episodes)):
            current[0] = float(per_episode[episode])
            rows.extend(
                (
                    t.observation,
                    t.action,
                    t.reward,
                    t.next_observation,
                    t.terminated,
                    t.truncated,
                    episode,
                )
                for t in iter_episode(env, behaviour, reset_seed)
            )
    finally:
        env.close()
    obs, act, rew, next_obs, term, trunc, ep = zip(*rows, strict=True)
    return Shard(
        observations=np.asarray(obs, dtype=np.float32).reshape(-1, spec.obs_dim),
        actions=np.asarray(act, dtype=np.int64),
        rewards=np.asarray(rew, dtype=np.float32),
        next_observations=np.asarray(next_obs, dtype=np.float32).reshape(-1, spec.obs_dim),
        terminated=np.asarray(term, dtype=bool),
        truncated=np.asarray(trunc, dtype=bool),
        episode_ids=np.asarray(ep, dtype=np.int64),
        metadata=metadata,
    )
