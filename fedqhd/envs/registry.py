"""The environment registry: every task fedqhd can run is an entry here.

The four built-in control tasks (:mod:`fedqhd.envs.classic`) and the POOL
learner's inventory MDP (:mod:`fedqhd.envs.inventory`) are entries like any
other; a user adds a gymnasium env id or a factory with :func:`register_env`::

    from fedqhd.envs import register_env
    register_env("MyEnv-v0", factory=MyEnv, obs_bound="data", max_episode_steps=100)

Everything downstream (:func:`get_spec`, :func:`make_env`,
:func:`heuristic_action`, rollouts, anchors, shard collection and validation,
the run config's ``env-id``) asks this registry; nothing keeps its own list.
Over 600 lines on purpose: registering an env and resolving its spec (bounds, reward
range, fingerprint) check the same entry, and one module keeps the one list.
A module that registers environments is loaded in every process of a run by
the run-config key ``env-module`` (:func:`load_env_modules`).

An id only gymnasium knows (``gym.register`` in an ``env-module``, or a package's own)
needs no :func:`register_env`: its entry is made on first use (:func:`gym_entry`), with
bounds from a finite Box or inferred from random rollouts, the spec's time limit and
its Discrete actions. :func:`register_env` stays for what cannot be inferred (a
heuristic controller, dynamics variants, given bounds, a time limit the spec lacks).
An unknown id names its near matches (:func:`near_ids`).

Observation bounds (the HD encoder's per-coordinate scale) are given, taken
from finite Box bounds (``"space"``), or inferred from data (``"data"``:
observations of uniform-random rollouts, :func:`infer_obs_bound`).
Observations of a Box of rank > 1 are flattened. Actions must be Discrete.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box, Discrete

__all__ = [
    "ENV_IDS",
    "EnvSpec",
    "ObservationError",
    "env_ids",
    "get_entry",
    "get_spec",
    "gym_entry",
    "infer_obs_bound",
    "is_registered",
    "load_env_modules",
    "near_ids",
    "random_episodes",
    "register_env",
    "space_bounds",
    "spec_fingerprint",
    "spec_record",
    "unregister_env",
]

Policy = Callable[[np.ndarray], int]

#: uniform-random episodes (and their seed) from which ``obs_bound="data"`` is inferred
BOUND_EPISODES = 20
BOUND_SEED = 12345
#: percentiles of the robust range of :func:`infer_obs_bound`
BOUND_PERCENTILES = (1.0, 99.0)


class ObservationError(ValueError):
    """Observations that cannot be used (non-finite, wrong shape, not numeric)."""


@dataclass(frozen=True)
class EnvSpec:
    """Static facts about one task.

    Attributes
    ----------
    env_id : str
        Registry id (a gymnasium id for the built-in tasks).
    obs_dim : int
        Length of an observation vector (after flattening).
    n_actions : int
        Number of discrete actions (actions are ``0 .. n_actions - 1``).
    obs_bound : np.ndarray
        Positive per-dimension scale, shape ``(obs_dim,)``: ``obs / obs_bound``
        spans roughly a width of 2 on the states a reasonable policy visits
        (CartPole: the FedQHD paper's bounds). Not a hard clip.
    max_episode_steps : int
        Time limit; reaching it truncates (it does not terminate) an episode.
    dynamics_ranges : dict[str, tuple[float, float]]
        Physical parameters that ``dynamics-skew`` varies, with closed ranges in
        which the heuristic controller still solves the task.
    dynamics_defaults : dict[str, float]
        The stock values of those parameters.
    obs_shape : tuple of int or None
        The environment's own observation shape before flattening (``None``:
        ``(obs_dim,)``).
    obs_center : np.ndarray or None
        Centre of the typical observations (``None``: zero); uniform anchors
        are drawn in ``obs_center +- obs_bound``.
    reward_range : (float, float) or None
        Where one step's reward lies (``None``: not known); shard validation
        refuses rewards far outside it (:mod:`fedqhd.data.shard`, ``value-check``).
    obs_bound_source : str
        Where ``obs_bound`` came from: ``"given"`` (the built-in tasks, or an
        array given to :func:`register_env`), ``"space"`` (the observation Box) or
        ``"data"`` (inferred from random rollouts). Shard validation refuses
        observations far outside given bounds only.
    """

    env_id: str
    obs_dim: int
    n_actions: int
    obs_bound: np.ndarray
    max_episode_steps: int
    dynamics_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    dynamics_defaults: dict[str, float] = field(default_factory=dict)
    obs_shape: tuple[int, ...] | None = None
    obs_center: np.ndarray | None = None
    reward_range: tuple[float, float] | None = None
    obs_bound_source: str = "given"

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """The env's own observation shape (before flattening)."""
        return tuple(self.obs_shape) if self.obs_shape is not None else (self.obs_dim,)

    @property
    def center(self) -> np.ndarray:
        """:attr:`obs_center`, zeros when not set."""
        return self.obs_center if self.obs_center is not None else np.zeros(self.obs_dim)


def _frozen(values: Any) -> np.ndarray:
    arr = np.array(values, dtype=np.float64).reshape(-1)
    arr.setflags(write=False)
    return arr


@dataclass
class EnvEntry:
    """One registry entry (see :func:`register_env` for the meaning of the fields)."""

    env_id: str
    factory: Callable[..., gym.Env] | str
    obs_bound: str | np.ndarray
    heuristic: Policy | None = None
    flatten: bool = True
    n_actions: int | None = None
    max_episode_steps: int | None = None
    dynamics_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    dynamics_defaults: dict[str, float] = field(default_factory=dict)
    apply_dynamics: Callable[[gym.Env, dict[str, float]], None] | None = None
    make_kwargs: Callable[[dict[str, float]], dict[str, Any]] | None = None
    kind: str = "discrete"  #: "discrete" (fqi tasks) or another learner's task ("pool")
    description: str = ""
    spec: EnvSpec | None = None  #: resolved on first :func:`get_spec`
    space: tuple[np.ndarray, np.ndarray] | None = None  #: flattened Box bounds, resolved lazily
    reward_range: tuple[float, float] | None = None


_REGISTRY: dict[str, EnvEntry] = {}


class _EnvIdsView(Sequence[str]):
    """The ids of the registered discrete-action tasks, read live from the registry
    (so that it also lists environments registered after import)."""

    def _ids(self) -> tuple[str, ...]:
        return env_ids()

    def __getitem__(self, index):  # type: ignore[override]
        return self._ids()[index]

    def __len__(self) -> int:
        return len(self._ids())

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids())

    def __contains__(self, value: object) -> bool:
        return value in self._ids()

    def __add__(self, other: Sequence[str]) -> tuple[str, ...]:
        return self._ids() + tuple(other)

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __hash__(self) -> int:
        return hash(self._ids())

    def __repr__(self) -> str:
        return repr(self._ids())


#: the registered discrete-action task ids, a live view of the registry
ENV_IDS: Sequence[str] = _EnvIdsView()


def env_ids(kind: str | None = "discrete") -> tuple[str, ...]:
    """Registered ids in registration order: of one ``kind`` (default: the
    discrete-action tasks fqi runs on), or all with ``kind=None``."""
    return tuple(e.env_id for e in _REGISTRY.values() if kind is None or e.kind == kind)


def is_registered(env_id: str) -> bool:
    """Whether ``env_id`` is fedqhd's, or a usable one of gymnasium's (its entry is then
    made)."""
    if not isinstance(env_id, str):
        return False
    try:
        return gym_entry(env_id) is not None
    except ValueError:  # gymnasium's, but not one fedqhd can run (get_entry says why)
        return False


def _gym_ids() -> list[str]:
    return [str(i) for i in gym.registry]


def near_ids(env_id: Any, n: int = 3) -> list[str]:
    """Up to ``n`` ids of fedqhd's registry and gymnasium's closest to ``env_id``."""
    if not isinstance(env_id, str):
        return []
    known = list(dict.fromkeys([*_REGISTRY, *_gym_ids()]))
    return difflib.get_close_matches(env_id, known, n=n, cutoff=0.75)


def did_you_mean(env_id: Any) -> str:
    """`` (did you mean 'A' or 'B'?)`` for an unknown id, or empty."""
    near = near_ids(env_id)
    return f" (did you mean {' or '.join(repr(i) for i in near)}?)" if near else ""


def _unknown(env_id: Any) -> ValueError:
    return ValueError(
        f"unknown env id {env_id!r}{did_you_mean(env_id)}; fedqhd's ids: "
        f"{', '.join(env_ids(None))}, and any id gymnasium knows. Register your own with "
        "gymnasium.register(...) or fedqhd.envs.register_env(...) in a module named by "
        "run-config key 'env-module' (CLI: --env-module)")


def gym_entry(env_id: str) -> EnvEntry | None:
    """The entry of an id that gymnasium knows and fedqhd's registry does not: made now,
    as ``register_env(env_id)`` would (bounds from a finite Box, else from random
    rollouts; the spec's time limit), and resolved at once, so that an env fedqhd cannot
    run (actions not Discrete, no time limit) is refused here, with the reason
    (``ValueError``), and never listed. ``None`` if gymnasium does not know the id."""
    if env_id in _REGISTRY:
        return _REGISTRY[env_id]
    if not isinstance(env_id, str) or env_id not in gym.registry:
        return None
    entry = EnvEntry(env_id=env_id, factory=env_id, obs_bound="auto",
                     description=f"gymnasium's {env_id}")
    try:
        entry.spec = _resolve(entry)
    except ValueError as exc:
        raise ValueError(f"{exc} (gymnasium's {env_id!r}: to run it, register a wrapped "
                         "env with fedqhd.envs.register_env)") from None
    except Exception as exc:  # noqa: BLE001 (making a third-party env may fail any way)
        raise ValueError(f"{env_id}: gymnasium could not make it ({type(exc).__name__}: "
                         f"{exc})") from None
    _REGISTRY[env_id] = entry
    return entry


def get_entry(env_id: str) -> EnvEntry:
    """The registry entry of ``env_id`` (``ValueError`` naming the id and its near matches
    if neither fedqhd nor gymnasium knows it)."""
    entry = gym_entry(env_id) if isinstance(env_id, str) else None
    if entry is None:
        raise _unknown(env_id)
    return entry


def register_env(
    env_id: str,
    factory: Callable[..., gym.Env] | str | None = None,
    obs_bound: str | Sequence[float] | np.ndarray | None = None,
    heuristic: Policy | None = None,
    flatten: bool = True,
    n_actions: int | None = None,
    max_episode_steps: int | None = None,
    dynamics_ranges: dict[str, tuple[float, float]] | None = None,
    dynamics_defaults: dict[str, float] | None = None,
    apply_dynamics: Callable[[gym.Env, dict[str, float]], None] | None = None,
    overwrite: bool = False,
    reward_range: tuple[float, float] | None = None,
) -> None:
    """Add an environment to the registry.

    Parameters
    ----------
    env_id : str
        The id runs use (run-config ``env-id``, shard metadata).
    factory : callable, str or None
        ``factory(**kwargs) -> gymnasium.Env``, or a gymnasium id for
        :func:`gymnasium.make`; ``None``: ``env_id`` is a gymnasium id.
        ``render_mode`` is passed only when one is asked for.
    obs_bound : array-like, "space", "data" or None
        The encoder's per-coordinate scale: given (positive, finite, one per
        flattened coordinate); ``"space"``: half the width of the observation
        Box (all bounds must be finite); ``"data"``: a robust range of the
        observations of :data:`BOUND_EPISODES` uniform-random episodes
        (:func:`infer_obs_bound`). ``None``: ``"space"`` when the Box is
        bounded, else ``"data"``.
    heuristic : callable or None
        ``obs -> action``, mixed with random actions by the behaviour policy
        (``epsilon < 1``). Without one, data can be collected with random
        behaviour only (``epsilon = 1``).
    flatten : bool
        Flatten observations of any rank (and other space types) into vectors;
        ``False`` requires a rank-1 Box.
    n_actions : int or None
        Checked against the env's ``Discrete`` action space when given.
    max_episode_steps : int or None
        Time limit (a ``TimeLimit`` wrapper is added); needed when the env has
        none of its own.
    dynamics_ranges, dynamics_defaults, apply_dynamics :
        Parameters a ``dynamics-skew`` partition may vary, their stock values,
        and ``apply_dynamics(env, params)`` that sets them on a new env.
    overwrite : bool
        Replace an existing entry (otherwise registering a known id is an error).
    reward_range : (lo, hi) or None
        Where one step's reward lies; shards with rewards far outside it are
        refused (``value-check``). ``None``: only non-finite rewards are refused.

    Raises
    ------
    ValueError
        On a bad argument; the message names the id and the problem. Problems
        only visible on a live env (non-Discrete actions, no time limit,
        unbounded Box with ``"space"``) are reported by :func:`get_spec`.
    """
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"env id must be a non-empty string, got {env_id!r}")
    if env_id in _REGISTRY and not overwrite:
        raise ValueError(f"env id {env_id!r} is already registered (pass overwrite=True)")
    if factory is None:
        factory = env_id
    if not (callable(factory) or isinstance(factory, str)):
        raise ValueError(f"{env_id}: factory must be callable or a gymnasium id, got {factory!r}")
    if isinstance(factory, str) and ":" not in factory and factory not in gym.registry:
        # ("module:Id-v0" imports its module in gym.make: checked there)
        near = [i for i in near_ids(factory) if i in gym.registry]
        raise ValueError(f"{env_id}: gymnasium knows no env id {factory!r}"
                         + (f" (did you mean {' or '.join(repr(i) for i in near)}?)"
                            if near else "")
                         + "; register it with gymnasium.register(...) first, or pass a "
                         "factory")
    if obs_bound is None:
        bound: str | np.ndarray = "auto"
    elif isinstance(obs_bound, str):
        if obs_bound not in ("space", "data"):
            raise ValueError(f"{env_id}: obs_bound must be 'space', 'data' or an array, "
                             f"got {obs_bound!r}")
        bound = obs_bound
    else:
        bound = _frozen(obs_bound)
        if bound.size == 0 or not np.all(np.isfinite(bound)) or not np.all(bound > 0):
            raise ValueError(f"{env_id}: obs_bound must be positive finite numbers, "
                             f"got {obs_bound!r}")
    if heuristic is not None and not callable(heuristic):
        raise ValueError(f"{env_id}: heuristic must be callable (obs -> action)")
    if n_actions is not None and (int(n_actions) != n_actions or n_actions < 1):
        raise ValueError(f"{env_id}: n_actions must be a positive integer, got {n_actions!r}")
    if max_episode_steps is not None and (int(max_episode_steps) != max_episode_steps
                                          or max_episode_steps < 1):
        raise ValueError(f"{env_id}: max_episode_steps must be a positive integer, "
                         f"got {max_episode_steps!r}")
    ranges = {k: (float(lo), float(hi)) for k, (lo, hi) in (dynamics_ranges or {}).items()}
    defaults = {k: float(v) for k, v in (dynamics_defaults or {}).items()}
    if set(ranges) != set(defaults):
        raise ValueError(f"{env_id}: dynamics_ranges and dynamics_defaults must name the same "
                         f"parameters, got {sorted(ranges)} and {sorted(defaults)}")
    if ranges and apply_dynamics is None:
        raise ValueError(f"{env_id}: dynamics_ranges need apply_dynamics(env, params)")
    rewards = None if reward_range is None else _reward_range(env_id, reward_range)
    _REGISTRY[env_id] = EnvEntry(
        env_id=env_id, factory=factory, obs_bound=bound, heuristic=heuristic,
        flatten=bool(flatten), n_actions=None if n_actions is None else int(n_actions),
        max_episode_steps=None if max_episode_steps is None else int(max_episode_steps),
        dynamics_ranges=ranges, dynamics_defaults=defaults, apply_dynamics=apply_dynamics,
        reward_range=rewards)


def _reward_range(env_id: str, value: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        lo = hi = math.nan
    if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise ValueError(f"{env_id}: reward_range must be (lo, hi), finite, lo <= hi; "
                         f"got {value!r}")
    return lo, hi


def _register_builtin(spec: EnvSpec, heuristic: Policy,
                      apply_dynamics: Callable[[gym.Env, dict[str, float]], None] | None = None,
                      make_kwargs: Callable[[dict[str, float]], dict[str, Any]] | None = None
                      ) -> None:
    """A built-in task: its spec is given (not resolved from a live env)."""
    _REGISTRY[spec.env_id] = EnvEntry(
        env_id=spec.env_id, factory=spec.env_id, obs_bound=spec.obs_bound, heuristic=heuristic,
        flatten=False, n_actions=spec.n_actions, max_episode_steps=spec.max_episode_steps,
        dynamics_ranges=dict(spec.dynamics_ranges),
        dynamics_defaults=dict(spec.dynamics_defaults), apply_dynamics=apply_dynamics,
        make_kwargs=make_kwargs, spec=spec, reward_range=spec.reward_range)


def _register_task(env_id: str, kind: str, description: str) -> None:
    """A task of another learner (not a discrete-action env): known to the run config,
    without an :class:`EnvSpec`."""
    _REGISTRY[env_id] = EnvEntry(env_id=env_id, factory=env_id, obs_bound="space", kind=kind,
                                 description=description)


def unregister_env(env_id: str) -> None:
    """Remove an entry (tests; a user replacing an entry passes ``overwrite=True``)."""
    _REGISTRY.pop(env_id, None)


# ------------------------------------------------------------------ construction
def _accepts(factory: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _construct(entry: EnvEntry, params: dict[str, float], render_mode: str | None) -> gym.Env:
    kwargs: dict[str, Any] = entry.make_kwargs(params) if entry.make_kwargs else {}
    if isinstance(entry.factory, str):
        if render_mode is not None:
            kwargs["render_mode"] = render_mode
        return gym.make(entry.factory, **kwargs)
    if render_mode is not None:
        if not _accepts(entry.factory, "render_mode"):
            raise ValueError(f"{entry.env_id}: its factory takes no render_mode argument")
        kwargs["render_mode"] = render_mode
    env = entry.factory(**kwargs)
    if not isinstance(env, gym.Env):
        raise ValueError(f"{entry.env_id}: factory returned {type(env).__name__}, "
                         "not a gymnasium.Env")
    return env


def _time_limit(env: gym.Env) -> int | None:
    """The env's time limit: of its spec, or of a ``TimeLimit`` wrapper around it."""
    spec = getattr(env, "spec", None)
    steps = getattr(spec, "max_episode_steps", None) if spec is not None else None
    if steps:
        return int(steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def _wrapped(entry: EnvEntry, env: gym.Env) -> gym.Env:
    """Flatten observations and add the time limit, as the entry asks."""
    space = env.observation_space
    if not (isinstance(space, Box) and len(space.shape) == 1):
        if not entry.flatten:
            raise ValueError(f"{entry.env_id}: observation space {space} is not a rank-1 Box "
                             "(register it with flatten=True)")
        env = gym.wrappers.FlattenObservation(env)
    if entry.max_episode_steps is not None and _time_limit(env) is None:
        env = gym.wrappers.TimeLimit(env, max_episode_steps=entry.max_episode_steps)
    return env


def build_env(env_id: str, params: dict[str, float], render_mode: str | None = None) -> gym.Env:
    """A new env of ``env_id`` with dynamics ``params`` (already validated) applied."""
    entry = get_entry(env_id)
    env = _wrapped(entry, _construct(entry, params, render_mode))
    if entry.apply_dynamics is not None and (params or entry.spec is not None):
        entry.apply_dynamics(env, params)
    return env


# ------------------------------------------------------------------ specs
def get_spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of a registered discrete-action task.

    Raises
    ------
    ValueError
        If ``env_id`` is not registered (the message lists the registered ids),
        is not a discrete-action task, or its env cannot be used (the message
        names the id and what is missing).
    """
    entry = get_entry(env_id)
    if entry.kind != "discrete":
        raise ValueError(f"{env_id!r} is {entry.description or 'not a discrete-action env'}: "
                         "it has no EnvSpec")
    if entry.spec is None:
        entry.spec = _resolve(entry)
    return entry.spec


def _resolve(entry: EnvEntry) -> EnvSpec:
    env_id = entry.env_id
    raw = _construct(entry, dict(entry.dynamics_defaults), None)
    try:
        raw_space = raw.observation_space
        obs_shape = tuple(int(s) for s in raw_space.shape) if raw_space.shape else None
        env = _wrapped(entry, raw)
        space = env.observation_space
        if not isinstance(space, Box) or len(space.shape) != 1:
            raise ValueError(f"{env_id}: observations must flatten to a vector, got {space}")
        action_space = env.action_space
        if not isinstance(action_space, Discrete):
            raise ValueError(f"{env_id}: fedqhd needs Discrete actions, the env has "
                             f"{action_space} (wrap it to discretise its actions)")
        if int(action_space.start) != 0:
            raise ValueError(f"{env_id}: Discrete actions must start at 0, got start="
                             f"{int(action_space.start)}")
        n_actions = int(action_space.n)
        if entry.n_actions is not None and entry.n_actions != n_actions:
            raise ValueError(f"{env_id}: registered with n_actions={entry.n_actions}, but the "
                             f"env has {n_actions} actions")
        max_steps = _time_limit(env)
        if max_steps is None:
            raise ValueError(f"{env_id}: the env has no time limit; register it with "
                             "max_episode_steps=...")
        obs_dim = int(space.shape[0])
        low, high = (np.asarray(space.low, dtype=np.float64),
                     np.asarray(space.high, dtype=np.float64))
        entry.space = (low, high)
        center = None
        how = entry.obs_bound
        if isinstance(how, str) and how == "auto":
            how = "space" if np.all(np.isfinite(low) & np.isfinite(high)) else "data"
        if isinstance(how, np.ndarray):
            bound = how
            if bound.shape != (obs_dim,):
                raise ValueError(f"{env_id}: obs_bound has {bound.size} values, observations "
                                 f"have {obs_dim} coordinates (flattened)")
        elif how == "space":
            if not np.all(np.isfinite(low) & np.isfinite(high)):
                raise ValueError(f"{env_id}: obs_bound='space' needs finite observation bounds, "
                                 f"the Box has infinite ones; use obs_bound='data' or an array")
            bound = np.where(high > low, (high - low) / 2, 1.0)
            center = (high + low) / 2
        else:  # "data"
            observations = random_episodes(env, BOUND_EPISODES, BOUND_SEED)[0]
            bound, center = _robust_range(observations, env_id)
    finally:
        raw.close()
    return EnvSpec(env_id=env_id, obs_dim=obs_dim, n_actions=n_actions,
                   obs_bound=_frozen(bound), max_episode_steps=max_steps,
                   dynamics_ranges=dict(entry.dynamics_ranges),
                   dynamics_defaults=dict(entry.dynamics_defaults),
                   obs_shape=obs_shape if obs_shape != (obs_dim,) else None,
                   obs_center=None if center is None or not np.any(center) else _frozen(center),
                   reward_range=entry.reward_range,
                   obs_bound_source="given" if isinstance(how, np.ndarray) else str(how))


def random_episodes(env: gym.Env, n_episodes: int, seed: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Observations (rows, flattened), rewards and lengths of ``n_episodes`` episodes of
    uniform-random actions of ``env``: what ``obs_bound="data"`` is inferred from, and
    what settings for an untuned env are derived from (:mod:`fedqhd.presets.derive`)."""
    rng = np.random.default_rng(seed)
    action_space: Any = env.action_space
    n = int(action_space.n)
    rows, rewards, lengths = [], [], []
    for _ in range(n_episodes):
        obs, _ = env.reset(seed=int(rng.integers(2**31 - 1)))
        rows.append(np.asarray(obs, dtype=np.float64).reshape(-1))
        steps = 0
        while True:
            obs, reward, terminated, truncated, _ = env.step(int(rng.integers(n)))
            rows.append(np.asarray(obs, dtype=np.float64).reshape(-1))
            rewards.append(float(reward))
            steps += 1
            if terminated or truncated:
                break
        lengths.append(steps)
    return np.asarray(rows), np.asarray(rewards), np.asarray(lengths)


def _robust_range(observations: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        X = np.asarray(observations, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ObservationError(f"{what}: observations are not numeric ({exc})") from None
    if X.ndim == 1:
        X = X[:, None]
    elif X.ndim > 2:
        X = X.reshape(len(X), -1)
    if X.shape[0] == 0:
        raise ObservationError(f"{what}: no observations to infer a scale from")
    if not np.all(np.isfinite(X)):
        raise ObservationError(f"{what}: observations contain non-finite values")
    lo, med, hi = np.percentile(X, (BOUND_PERCENTILES[0], 50.0, BOUND_PERCENTILES[1]), axis=0)
    half = np.maximum(hi - med, med - lo)
    # a (nearly) constant coordinate carries no information: unit scale, not a division by 0
    tiny = half <= 1e-12 * np.maximum(1.0, np.abs(med))
    return np.where(tiny, 1.0, half), med


def infer_obs_bound(observations: Any) -> np.ndarray:
    """A robust per-coordinate scale of ``observations`` (rows; any trailing shape is
    flattened): the larger distance from the median to the 1st or 99th percentile.
    Constant coordinates get scale 1. Non-finite values are an error."""
    return _robust_range(observations, "infer_obs_bound")[0]


def space_bounds(env_id: str) -> tuple[np.ndarray, np.ndarray]:
    """The flattened observation Box of ``env_id``: (low, high), possibly infinite."""
    entry = get_entry(env_id)
    get_spec(env_id)
    if entry.space is None:
        env = build_env(env_id, dict(entry.dynamics_defaults))
        try:
            space: Any = env.observation_space
            entry.space = (np.asarray(space.low, dtype=np.float64).reshape(-1),
                           np.asarray(space.high, dtype=np.float64).reshape(-1))
        finally:
            env.close()
    return entry.space


# ------------------------------------------------------------------ fingerprints
def _num(x: float) -> str:
    return format(float(x), ".6g")


def spec_record(env_id: str) -> dict[str, Any]:
    """What a shard records of the env it was made for (:func:`spec_fingerprint` included)."""
    spec = get_spec(env_id)
    record: dict[str, Any] = {
        "env_id": spec.env_id,
        "obs_shape": list(spec.observation_shape),
        "n_actions": int(spec.n_actions),
        "obs_bound": [_num(b) for b in spec.obs_bound],
    }
    record["fingerprint"] = _fingerprint(record)
    return record


def _fingerprint(record: dict[str, Any]) -> str:
    body = {k: record[k] for k in ("env_id", "obs_shape", "n_actions", "obs_bound")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def spec_fingerprint(env_id: str) -> str:
    """A short hash of the env's id, observation shape, action count and bounds."""
    return str(spec_record(env_id)["fingerprint"])


# ------------------------------------------------------------------ plug-in modules
def load_env_modules(names: str) -> list[str]:
    """Import the modules named in ``names`` (comma-separated; empty: none), so that
    they register their environments; returns the names imported.

    Raises
    ------
    ImportError
        Naming the module and why it could not be imported.
    """
    loaded = []
    for name in (n.strip() for n in str(names or "").split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ImportError(f"env module {name!r} could not be imported "
                              f"({type(exc).__name__}: {exc}); it must be importable in "
                              "every process of the run (installed, on PYTHONPATH, or a "
                              "module in the Flower app's folder)") from exc
        loaded.append(name)
    return loaded
