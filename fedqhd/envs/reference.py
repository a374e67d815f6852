"""Reference returns of trivial policies, to tell whether a result on an env is any good.

A return means little without a scale: -95 on Acrobot is good, 20 on CartPole is
what random actions get. For any registered discrete-action env (built-in or added
with :func:`fedqhd.envs.register_env`) :func:`reference_returns` measures two
trivial baselines on the *same* episode seeds (common random numbers, so that
their difference is not start-state noise):

* the uniform-random policy (its action draws are seeded from ``seed``: one
  generator per episode, so episode ``i``'s return depends only on
  ``(seed, i)``, not on how many episodes are run or how long earlier ones took);
* each constant policy "always take action ``a``".

A learned policy is worth something only if it :func:`beats` both.

Measured with ``reference_returns(env_id, 20, seed=0)`` (random mean +- std | best
constant action: mean): CartPole-v1 23.0 +- 13.8 | 1: 9.3; Acrobot-v1 -500.0 +- 0.0 |
0: -500.0 (every action ties); MountainCar-v0 -200.0 +- 0.0 | 0: -200.0 (every action
ties); LunarLander-v3 -169.4 +- 115.4 | 0: -110.4. On Acrobot and MountainCar every
trivial policy runs into the time limit: a policy that ever reaches the goal beats them.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedqhd.envs.batch import batch_rollout_returns
from fedqhd.envs.classic import episode_seeds, iter_episode, make_env, validate_dynamics
from fedqhd.envs.registry import get_spec

__all__ = [
    "ReferenceReturns",
    "beats",
    "constant_action_returns",
    "random_policy_returns",
    "reference_returns",
]

#: stream tag of the random policy's action draws (frozen: the reference numbers depend on
#: it); distinct from the tags of :mod:`fedqhd.seeding`, so that the draws never coincide
#: with the episode seeds or any stream of a run
_RANDOM_ACTIONS = 0x4A2D


@dataclass(frozen=True)
class ReferenceReturns:
    """Mean returns of the trivial policies on one env, over the same episode seeds.

    Attributes
    ----------
    random_mean, random_std : float
        Mean and (population) standard deviation of the uniform-random policy's returns.
    constant_means : tuple of float
        Mean return of "always take action ``a``", for ``a = 0 .. n_actions - 1``.
    best_constant_action : int
        The action with the highest constant mean (the lowest such action on a tie).
    best_constant_mean : float
        Its mean return.
    n_episodes, seed : int
        What the numbers were measured with (:func:`fedqhd.envs.episode_seeds`).
    """

    random_mean: float
    random_std: float
    constant_means: tuple[float, ...]
    best_constant_action: int
    best_constant_mean: float
    n_episodes: int
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values under kebab-case keys, as results.json spells its keys."""
        return {
            "random-mean": float(self.random_mean),
            "random-std": float(self.random_std),
            "constant-means": [float(m) for m in self.constant_means],
            "best-constant-action": int(self.best_constant_action),
            "best-constant-mean": float(self.best_constant_mean),
            "n-episodes": int(self.n_episodes),
            "seed": int(self.seed),
        }

    def line(self) -> str:
        """One line for a log or a report: the two numbers a result must beat."""
        return (f"random {self.random_mean:.1f} +- {self.random_std:.1f} | best constant "
                f"action {self.best_constant_action}: {self.best_constant_mean:.1f} "
                f"({self.n_episodes} episodes)")


def _count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int >= ``minimum``; bools and floats are refused, not truncated
    (``n_episodes=2.5`` would silently run 2 episodes)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def _checked(env_id: str, n_episodes: Any, seed: Any,
             dynamics: dict[str, float] | None) -> tuple[int, int, int]:
    """Refuse bad arguments before any episode runs; returns (n_actions, n_episodes, seed).

    :func:`get_spec` refuses unknown ids (naming the id), tasks without discrete actions
    and envs whose action space is not ``Discrete``."""
    n = _count("n_episodes", n_episodes, 1)
    s = _count("seed", seed, 0)  # numpy's SeedSequence needs a non-negative seed
    spec = get_spec(env_id)
    validate_dynamics(env_id, dynamics)
    return spec.n_actions, n, s


def random_policy_returns(env_id: str, n_episodes: int = 20, seed: int = 0,
                          dynamics: dict[str, float] | None = None) -> np.ndarray:
    """Returns of the uniform-random policy on the episodes of ``episode_seeds(seed,
    n_episodes)``, shape ``(n_episodes,)``.

    Episode ``i`` draws its actions from its own generator (spawned from ``seed``), so its
    return is the same whatever ``n_episodes`` is; the env's own ``action_space.sample`` is
    not used (its seeding is the env's business, not ours)."""
    n_actions, n, s = _checked(env_id, n_episodes, seed, dynamics)
    streams = np.random.SeedSequence([s, _RANDOM_ACTIONS]).spawn(n)
    env = make_env(env_id, dynamics)
    try:
        returns = []
        for reset_seed, stream in zip(episode_seeds(s, n), streams, strict=True):
            rng = np.random.default_rng(stream)

            def policy(obs: np.ndarray, rng: np.random.Generator = rng) -> int:
                return int(rng.integers(n_actions))

            returns.append(sum(t.reward for t in iter_episode(env, policy, int(reset_seed))))
        return np.asarray(returns, dtype=np.float64)
    finally:
        env.close()


def constant_action_returns(env_id: str, n_episodes: int = 20, seed: int = 0,
                            dynamics: dict[str, float] | None = None) -> np.ndarray:
    """Returns of "always take action ``a``" for every action, shape ``(n_actions,
    n_episodes)``: row ``a``, on the same episode seeds for every ``a``."""
    n_actions, n, s = _checked(env_id, n_episodes, seed, dynamics)
    rows = []
    for action in range(n_actions):
        def policy(obs: np.ndarray, action: int = action) -> np.ndarray:
            return np.full(len(obs), action, dtype=np.int64)

        rows.append(batch_rollout_returns(env_id, policy, n, s, dynamics))
    return np.asarray(rows, dtype=np.float64).reshape(n_actions, n)


def reference_returns(env_id: str, n_episodes: int = 20, seed: int = 0,
                      dynamics: dict[str, float] | None = None) -> ReferenceReturns:
    """The random and constant-action baselines of a registered discrete-action env.

    Parameters
    ----------
    env_id : str
        A registered id (built-in, or added with :func:`fedqhd.envs.register_env`).
    n_episodes : int
        Episodes per policy (>= 1); every policy runs on ``episode_seeds(seed, n_episodes)``.
    seed : int
        Non-negative; fixes the episodes and the random policy's actions, so the
        numbers are the same on every call.
    dynamics : dict[str, float] or None
        Physical parameters, as for :func:`fedqhd.envs.make_env`.

    Raises
    ------
    ValueError
        On ``n_episodes < 1`` (or not an integer), a negative seed, an unknown env id
        (the message names it), an env without ``Discrete`` actions, or bad dynamics;
        before any episode runs.
    """
    _checked(env_id, n_episodes, seed, dynamics)
    random = random_policy_returns(env_id, n_episodes, seed, dynamics)
    means = constant_action_returns(env_id, n_episodes, seed, dynamics).mean(axis=1)
    best = int(np.argmax(means))  # the first maximum: ties go to the lowest action
    return ReferenceReturns(
        random_mean=float(random.mean()), random_std=float(random.std()),
        constant_means=tuple(float(m) for m in means), best_constant_action=best,
        best_constant_mean=float(means[best]), n_episodes=operator.index(n_episodes),
        seed=operator.index(seed))


def beats(returns_mean: float, ref: ReferenceReturns) -> bool:
    """Whether a policy's mean return is strictly above both the random policy's and the
    best constant action's (a tie, or NaN, is not a win)."""
    value = float(returns_mean)
    return value > ref.random_mean and value > ref.best_constant_mean
