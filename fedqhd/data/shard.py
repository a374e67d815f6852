"""Trajectory shards: the in-memory :class:`Shard` and its validated ``.npz`` file.

A shard is one client's private offline data: transitions of one environment,
grouped into episodes. On disk it is a NumPy ``.npz`` archive (written with
``numpy.savez``, read with ``allow_pickle=False``) holding exactly these arrays,
with ``N`` transitions and ``d = obs_dim``:

=====================  =========  =======  ==============================================
key                    shape      dtype    meaning
=====================  =========  =======  ==============================================
``observations``       (N, d)     float32  state s_t, finite
``actions``            (N,)       int64    a_t in ``0 .. n_actions - 1``
``rewards``            (N,)       float32  r_t, finite
``next_observations``  (N, d)     float32  s_{t+1} as returned by ``env.step``, finite
``terminated``         (N,)       bool     s_{t+1} is terminal: do not bootstrap
``truncated``          (N,)       bool     time limit hit at s_{t+1}: DO bootstrap
``episode_ids``        (N,)       int64    >= 0; transitions of one episode share an id
``metadata``           ()         str      a JSON object, see below
=====================  =========  =======  ==============================================

``N >= 1``. Truncation is not termination: a time-limited episode ends with
``truncated=True, terminated=False`` and its last ``next_observations`` row is a
real, non-terminal state. Both flags may be true on the same step.

``metadata`` (JSON object). Required: ``format_version`` (int, currently
:data:`FORMAT_VERSION`) and ``env_id`` (a registered env, :data:`fedqhd.envs.ENV_IDS`;
a user's env is registered by importing the module that registers it, see
``env-module``). Written by :func:`fedqhd.data.collect_shard` and
:func:`fedqhd.data.shards_from_arrays` (and checked when present): ``env_spec``
(object: ``env_id``, ``obs_shape``, ``n_actions``, ``obs_bound`` and their
``fingerprint``, :func:`fedqhd.envs.spec_record`; a shard is refused when the
env it is loaded with has another spec),
``n_episodes`` (int, must equal the number of distinct episode ids),
``behaviour`` (object, e.g. ``{"kind": "epsilon-heuristic", "epsilon": 0.9}``),
``seed`` (int, the collection seed), ``dynamics`` (object, every physical
parameter of the env). Client shards add ``partition``, ``partition_id``,
``num_partitions``, ``base_seed`` (the run seed), ``epsilon_min`` and
``epsilon_max``.

Observations (and next observations) must lie in the env's observation space
where its bounds are finite: data of another environment labelled with this
env's id is refused.

Loading (:func:`load_shard`) validates all of the above; any violation raises
:class:`ShardError` naming the file and the problem. Nothing is dropped, cast
or repaired.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.envs import get_spec, space_bounds, spec_record

__all__ = [
    "FORMAT_VERSION",
    "ARRAY_SCHEMA",
    "Shard",
    "ShardError",
    "load_shard",
    "pooled",
    "save_shard",
]

#: version of the on-disk schema, stored in ``metadata["format_version"]``
FORMAT_VERSION = 1

#: array key -> (ndim, dtype); observation-shaped arrays have ndim 2
ARRAY_SCHEMA: dict[str, tuple[int, np.dtype]] = {
    "observations": (2, np.dtype(np.float32)),
    "actions": (1, np.dtype(np.int64)),
    "rewards": (1, np.dtype(np.float32)),
    "next_observations": (2, np.dtype(np.float32)),
    "terminated": (1, np.dtype(np.bool_)),
    "truncated": (1, np.dtype(np.bool_)),
    "episode_ids": (1, np.dtype(np.int64)),
}

_FLOAT_KEYS = ("observations", "rewards", "next_observations")


class ShardError(ValueError):
    """A shard file or object violates the schema; the message names file and problem."""


@dataclass(eq=False)
class Shard:
    """One client's offline transitions (see the module docstring for the schema).

    Attributes
    ----------
    observations, next_observations : np.ndarray
        ``(N, obs_dim)`` float32.
    actions : np.ndarray
        ``(N,)`` int64.
    rewards : np.ndarray
        ``(N,)`` float32.
    terminated, truncated : np.ndarray
        ``(N,)`` bool; only ``terminated`` stops bootstrapping.
    episode_ids : np.ndarray
        ``(N,)`` int64.
    metadata : dict
        JSON-serialisable; at least ``env_id`` and ``format_version``.
    """

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    next_observations: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_ids: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n_transitions(self) -> int:
        """Number of transitions ``N``."""
        return int(self.actions.shape[0])

    @property
    def n_episodes(self) -> int:
        """Number of distinct episode ids."""
        return int(np.unique(self.episode_ids).size)

    @property
    def env_id(self) -> str:
        """The ``env_id`` recorded in the metadata."""
        return str(self.metadata["env_id"])

    def arrays(self) -> dict[str, np.ndarray]:
        """The schema's arrays by key (no metadata)."""
        return {key: getattr(self, key) for key in ARRAY_SCHEMA}

    def episode_returns(self) -> np.ndarray:
        """Undiscounted return of each episode, in order of first appearance of its id."""
        _, first, inverse = np.unique(self.episode_ids, return_index=True, return_inverse=True)
        sums = np.bincount(inverse, weights=self.rewards.astype(np.float64))
        return sums[np.argsort(first)]

    def validate(self, source: str = "<shard>", expected_env_id: str | None = None) -> None:
        """Check this shard against the schema.

        Parameters
        ----------
        source : str
            Name used in error messages (the file path when loading).
        expected_env_id : str or None
            If given, the shard must be of this environment.

        Raises
        ------
        ShardError
            On the first violation found.
        """
        _validate(self.arrays(), self.metadata, source, expected_env_id)


def _fail(source: str, problem: str) -> ShardError:
    return ShardError(f"{source}: {problem}")


def _validate_metadata(meta: Any, source: str, expected_env_id: str | None) -> int:
    """Check metadata; return the env's number of actions."""
    if not isinstance(meta, dict):
        raise _fail(source, f"metadata must be a JSON object, got {type(meta).__name__}")
    for key in ("format_version", "env_id"):
        if key not in meta:
            raise _fail(source, f"metadata lacks required key {key!r}")
    if meta["format_version"] != FORMAT_VERSION:
        raise _fail(
            source,
            f"unsupported format_version {meta['format_version']!r} (this code reads "
            f"{FORMAT_VERSION})",
        )
    env_id = meta["env_id"]
    try:
        spec = get_spec(env_id)
    except ValueError as exc:
        raise _fail(source, f"metadata env_id: {exc}") from None
    if expected_env_id is not None and env_id != expected_env_id:
        raise _fail(source, f"env mismatch: shard is {env_id!r}, expected {expected_env_id!r}")
    for key, kind in (("behaviour", dict), ("dynamics", dict), ("n_episodes", int),
                      ("env_spec", dict)):
        if key in meta and (not isinstance(meta[key], kind) or isinstance(meta[key], bool)):
            raise _fail(source, f"metadata {key!r} must be a JSON {kind.__name__}")
    if "env_spec" in meta:
        _check_env_spec(meta["env_spec"], env_id, source)
    return spec.n_actions


def _check_env_spec(recorded: dict[str, Any], env_id: str, source: str) -> None:
    """Refuse a shard made for another spec than the one ``env_id`` has here."""
    current = spec_record(env_id)
    if recorded.get("fingerprint") == current["fingerprint"]:
        return
    differ = [k for k in ("env_id", "obs_shape", "n_actions", "obs_bound")
              if recorded.get(k) != current[k]]
    detail = "; ".join(f"{k}: shard {recorded.get(k)!r}, env {current[k]!r}" for k in differ)
    raise _fail(source, f"env spec mismatch: the shard was made for env spec "
                        f"{recorded.get('fingerprint')!r}, but {env_id} here has "
                        f"{current['fingerprint']!r} ({detail or 'fingerprint differs'})")


def _check_in_space(arrays: dict[str, np.ndarray], env_id: str, source: str) -> None:
    """Observations outside the env's finite Box bounds are not of this env."""
    low, high = space_bounds(env_id)
    if low.shape != (arrays["observations"].shape[1],):
        return
    tol_low = low - 1e-5 * (1.0 + np.abs(low))
    tol_high = high + 1e-5 * (1.0 + np.abs(high))
    for key in ("observations", "next_observations"):
        out = (arrays[key] < tol_low) | (arrays[key] > tol_high)
        if out.any():
            row, col = (int(i) for i in np.argwhere(out)[0])
            raise _fail(source, f"{key} outside {env_id}'s observation space: "
                                f"{int(out.sum())} values (first: row {row}, coordinate {col}: "
                                f"{float(arrays[key][row, col]):.6g} not in "
                                f"[{low[col]:.6g}, {high[col]:.6g}]); is this data of "
                                f"another environment?")


def _validate(
    arrays: dict[str, np.ndarray], meta: Any, source: str, expected_env_id: str | None
) -> None:
    n_actions = _validate_metadata(meta, source, expected_env_id)
    obs_dim = get_spec(meta["env_id"]).obs_dim
    missing = [k for k in ARRAY_SCHEMA if k not in arrays]
    if missing:
        raise _fail(source, f"missing arrays: {', '.join(missing)}")
    unexpected = sorted(set(arrays) - set(ARRAY_SCHEMA))
    if unexpected:
        raise _fail(source, f"unexpected arrays: {', '.join(unexpected)}")
    n = None
    for key, (ndim, dtype) in ARRAY_SCHEMA.items():
        arr = arrays[key]
        if not isinstance(arr, np.ndarray):
            raise _fail(source, f"{key} is a {type(arr).__name__}, not a numpy array")
        if arr.ndim != ndim:
            raise _fail(source, f"{key} has shape {arr.shape}, expected {ndim} dimensions")
        if arr.dtype != dtype:
            raise _fail(source, f"{key} has dtype {arr.dtype}, expected {dtype}")
        if n is None:
            n = arr.shape[0]
        elif arr.shape[0] != n:
            raise _fail(
                source, f"inconsistent lengths: {key} has {arr.shape[0]} rows, observations {n}"
            )
        if ndim == 2 and arr.shape[1] != obs_dim:
            raise _fail(
                source,
                f"{key} has obs_dim {arr.shape[1]}, but {meta['env_id']} observations have "
                f"{obs_dim}",
            )
    if n == 0:
        raise _fail(source, "shard has no transitions")
    for key in _FLOAT_KEYS:
        bad = ~np.isfinite(arrays[key])
        if bad.any():
            row = int(np.argwhere(bad)[0][0])
            raise _fail(
                source, f"{key} has {int(bad.sum())} non-finite values (first in row {row})"
            )
    _check_in_space(arrays, meta["env_id"], source)
    actions = arrays["actions"]
    out = (actions < 0) | (actions >= n_actions)
    if out.any():
        row = int(np.flatnonzero(out)[0])
        raise _fail(
            source,
            f"actions out of range: {int(out.sum())} outside 0..{n_actions - 1} "
            f"(first: {int(actions[row])} in row {row})",
        )
    if (arrays["episode_ids"] < 0).any():
        raise _fail(source, "episode_ids must be >= 0")
    if "n_episodes" in meta:
        found = int(np.unique(arrays["episode_ids"]).size)
        if meta["n_episodes"] != found:
            raise _fail(
                source, f"metadata n_episodes={meta['n_episodes']} but episode_ids hold {found}"
            )


def save_shard(shard: Shard, path: str | os.PathLike[str]) -> Path:
    """Validate a shard and write it to ``path`` atomically.

    The file appears complete or not at all (written to a temporary file in the
    same directory, then renamed), so concurrent clients sharing a cache never
    read a half-written shard.

    Parameters
    ----------
    shard : Shard
        Data to write; must pass :meth:`Shard.validate`.
    path : str or PathLike
        Destination, used verbatim (no ``.npz`` is appended); parent folders
        are created.

    Returns
    -------
    Path
        The written path.
    """
    path = Path(path)
    shard.validate(str(path))
    try:
        meta_json = json.dumps(shard.metadata, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(str(path), f"metadata is not JSON-serialisable ({exc})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            # typed as Any: numpy's stub would match ** of arrays against allow_pickle: bool
            arrays: dict[str, Any] = shard.arrays()
            np.savez(fh, **arrays, metadata=np.array(meta_json))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_shard(path: str | os.PathLike[str], expected_env_id: str | None = None) -> Shard:
    """Read and validate a shard file.

    Parameters
    ----------
    path : str or PathLike
        A ``.npz`` written by :func:`save_shard` (or by hand, to the schema).
    expected_env_id : str or None
        If given, a shard of another environment is an error.

    Returns
    -------
    Shard

    Raises
    ------
    ShardError
        If the file is missing or unreadable, the metadata is not a JSON object
        of the schema, or any array is missing, unexpected, of the wrong shape,
        dtype or length, non-finite, or out of range. The message starts with
        the path.
    """
    source = str(path)
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise _fail(source, "not a .npz archive (a single .npy array?)")
        with npz:
            contents = {key: npz[key] for key in npz.files}
    except FileNotFoundError:
        raise _fail(source, "no such file") from None
    except IsADirectoryError:
        raise _fail(source, "is a directory, not a shard file") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, ShardError):
            raise
        raise _fail(source, f"cannot read as a .npz archive ({exc})") from None
    raw = contents.pop("metadata", None)
    if raw is None:
        raise _fail(source, "missing arrays: metadata")
    if raw.ndim != 0 or raw.dtype.kind != "U":
        raise _fail(source, f"metadata must be a 0-d string array, got {raw.dtype} {raw.shape}")
    try:
        meta = json.loads(str(raw), parse_constant=_reject_constant)
    except ValueError as exc:
        raise _fail(source, f"metadata is not valid JSON ({exc})") from None
    _validate(contents, meta, source, expected_env_id)
    return Shard(**contents, metadata=meta)


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-standard JSON constant {name}")


def pooled(shards: list[Shard]) -> Shard:
    """Concatenate shards of one environment into one (the centralised baseline).

    Episode ids are renumbered ``0 .. total - 1`` in order (shard by shard,
    episode by first appearance), so episodes of different shards never merge.

    Parameters
    ----------
    shards : list of Shard
        At least one; all of the same ``env_id``.

    Returns
    -------
    Shard
        Metadata: ``env_id``, ``format_version``, ``n_episodes``,
        ``behaviour = {"kind": "pooled"}`` and ``pooled_from`` (the sources'
        metadata, in order).
    """
    if not shards:
        raise ValueError("pooled() needs at least one shard")
    env_ids = sorted({s.env_id for s in shards})
    if len(env_ids) > 1:
        raise ValueError(f"cannot pool shards of different environments: {', '.join(env_ids)}")
    episode_ids, offset = [], 0
    for shard in shards:
        _, first, inverse = np.unique(shard.episode_ids, return_index=True, return_inverse=True)
        rank = np.empty_like(first)
        rank[np.argsort(first)] = np.arange(first.size)  # number episodes by appearance
        episode_ids.append(rank[inverse].astype(np.int64) + offset)
        offset += first.size
    arrays = {
        key: np.concatenate([getattr(s, key) for s in shards])
        for key in ARRAY_SCHEMA
        if key != "episode_ids"
    }
    metadata: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "env_id": env_ids[0],
        "n_episodes": offset,
        "behaviour": {"kind": "pooled"},
        "pooled_from": [s.metadata for s in shards],
    }
    return Shard(**arrays, episode_ids=np.concatenate(episode_ids), metadata=metadata)
