"""Settings for an environment nobody tuned: derived from its spec and from uniform-random
rollouts, so a user's own env gets a sensible preset without turning knobs.

What is derived, and why (BENCHMARKS.md, "Settings for an environment nobody tuned"):

* the encoder's length scale per coordinate: a robust half-range (1st-99th percentile
  about the median) of the observations random rollouts visit, never wider than a finite
  observation Box (an unbounded Box says nothing; a wide bounded one, that the kernel
  would see every visited state as one);
* the discount from the horizon ``H`` (the time limit): ``1 - 4 / H`` in [0.9, 0.99], so
  values look about a quarter of an episode ahead;
* offline: behaviour data from a uniform-random policy when the env has no heuristic
  controller (a noisy heuristic needs one), and enough of it, ``max(5, ceil(1000 / H))``
  episodes per client;
* online: D = 1000, ridge 1, proximal 0.01, half of each target from the realised return of
  the last 100 episodes (``mc-mix`` 0.5: early values are otherwise the fit's own
  guesses), and exploration that decays to 5 % over the first third of the episodes.

An env whose random rollouts have no step or no finite reward cannot be derived from:
:class:`DeriveError` says which settings to give by hand (a preset file).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from fedqhd.envs import get_spec, has_heuristic, make_env, space_bounds
from fedqhd.envs.registry import BOUND_EPISODES, BOUND_SEED, infer_obs_bound, random_episodes

__all__ = ["DeriveError", "derived_preset", "random_rollouts"]

#: the horizon a derived discount looks ahead, as a fraction of the time limit
HORIZON_FRACTION = 0.25
#: derived discounts stay in [lo, hi]
DISCOUNT_RANGE = (0.9, 0.99)
#: offline: transitions a client's shard holds at least (episodes of H steps)
OFFLINE_TRANSITIONS = 1000
#: online: epsilon has decayed to this after the first third of a client's episodes
EPSILON_AFTER_A_THIRD = 0.05


class DeriveError(ValueError):
    """No settings can be derived for an env; the message names what to give by hand."""


def random_rollouts(env_id: str, n_episodes: int = BOUND_EPISODES, seed: int = BOUND_SEED
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Observations (rows), rewards and episode lengths of ``n_episodes`` uniform-random
    episodes of ``env_id`` (the rollouts ``obs_bound="data"`` is inferred from)."""
    env = make_env(env_id)
    try:
        return random_episodes(env, n_episodes, seed)
    finally:
        env.close()


@functools.lru_cache(maxsize=32)
def _derived(env_id: str, protocol: str, episodes: int) -> tuple[tuple[str, Any], ...]:
    spec = get_spec(env_id)
    horizon = int(spec.max_episode_steps)
    by_hand = ("give the settings by hand: a preset file (run config preset = "
               "'my-preset.toml') with gamma, and obs-scale"
               + (", episodes-per-client" if protocol == "offline" else ", epsilon"))
    observations, rewards, lengths = random_rollouts(env_id)
    if not len(lengths) or lengths.max() == 0:
        raise DeriveError(f"{env_id}: uniform-random episodes have zero length, so no "
                          f"settings can be derived; {by_hand}")
    finite = rewards[np.isfinite(rewards)]
    if not finite.size:
        raise DeriveError(f"{env_id}: no finite reward in {len(lengths)} uniform-random "
                          f"episodes, so no settings can be derived; {by_hand}")
    if not np.all(np.isfinite(observations)):
        raise DeriveError(f"{env_id}: uniform-random episodes visit non-finite observations; "
                          f"{by_hand}")
    scale = infer_obs_bound(observations)
    low, high = space_bounds(env_id)
    box = np.where(np.isfinite(low) & np.isfinite(high) & (high > low), (high - low) / 2,
                   np.inf)
    scale = np.minimum(scale, box)
    gamma = float(np.clip(1.0 - 1.0 / (HORIZON_FRACTION * horizon), *DISCOUNT_RANGE))
    preset: dict[str, Any] = {
        "gamma": round(gamma, 6),
        "obs-scale": [float(v) for v in scale / np.asarray(spec.obs_bound, dtype=float)],
    }
    if protocol == "offline":
        if not has_heuristic(env_id):
            preset.update({"epsilon-min": 1.0, "epsilon-max": 1.0})
        preset["episodes-per-client"] = max(5, math.ceil(OFFLINE_TRANSITIONS / horizon))
    else:
        decay = EPSILON_AFTER_A_THIRD ** (1.0 / max(episodes / 3.0, 1.0))
        preset.update({"hd-dim": 1000, "ridge": 1.0, "proximal": 0.01, "mc-mix": 0.5,
                       "episodes-per-round": 20, "epsilon": [1.0, round(decay, 6), 0.01]})
    return tuple(preset.items())


def derived_preset(env_id: str, protocol: str, episodes: int = 600) -> dict[str, Any]:
    """A preset (as a preset file's top-level keys) for ``env_id`` under ``protocol``,
    derived from its spec and 20 uniform-random episodes; ``episodes``: each online
    client's episodes (the exploration schedule spans them). Cached per process."""
    return dict(_derived(env_id, protocol, int(episodes)))
