"""Shards from a user's own transition arrays (:func:`shards_from_arrays`).

The arrays are converted to the shard schema (:mod:`fedqhd.data.shard`) with a
clear error when a conversion is impossible, episode ids are derived from the
done flags when not given, and the transitions are dealt to clients by whole
episodes: ``"iid"`` (episodes shuffled with the seed, then dealt round-robin)
or by a key array the user gives (one client index per transition).
``fedqhd data import --npz FILE`` is the command-line form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedqhd.data.shard import FORMAT_VERSION, Shard, ShardError
from fedqhd.envs import get_spec, spec_record

__all__ = ["IMPORT_KIND", "episode_ids_from_flags", "shards_from_arrays"]

#: ``metadata["behaviour"]["kind"]`` of imported shards (the behaviour is not known)
IMPORT_KIND = "imported"


def _array(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise ShardError(f"{name}: cannot be read as an array ({exc})") from None
    if arr.dtype == object or arr.dtype.kind in "USVM":
        raise ShardError(f"{name}: expected numbers, got dtype {arr.dtype}")
    return arr


def _floats(name: str, value: Any, shape: tuple[int, ...], n: int | None) -> np.ndarray:
    arr = _array(name, value)
    if arr.dtype.kind == "c":
        raise ShardError(f"{name}: complex values cannot be converted to float32")
    rows = arr.shape[0] if arr.ndim else 0
    if arr.ndim == 0 or (n is not None and rows != n):
        raise ShardError(f"{name}: expected {n if n is not None else 'N'} rows, got shape "
                         f"{arr.shape}")
    if rows == 0:  # before the reshape below, which cannot infer a row length from 0 rows
        raise ShardError(f"{name}: no transitions (shape {arr.shape})")
    if arr.shape[1:] != shape:
        flat = int(np.prod(arr.shape[1:], dtype=np.int64)) if arr.ndim > 1 else 1
        if flat != int(np.prod(shape, dtype=np.int64)):
            raise ShardError(f"{name}: rows of shape {arr.shape[1:]}, expected {shape} "
                             f"({int(np.prod(shape))} numbers per row)")
    out = arr.reshape(rows, -1).astype(np.float32)
    bad = ~np.isfinite(out)
    if bad.any():
        row = int(np.argwhere(bad)[0][0])
        raise ShardError(f"{name}: {int(bad.sum())} non-finite values (first in row {row}), or "
                         "values beyond float32's range")
    return out


def _vector(name: str, value: Any, n: int) -> np.ndarray:
    arr = _array(name, value)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.shape != (n,):
        raise ShardError(f"{name}: expected shape ({n},), got {arr.shape}")
    return arr


def _integers(name: str, value: Any, n: int) -> np.ndarray:
    arr = _vector(name, value, n)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            row = int(np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))[0])
            raise ShardError(f"{name}: not integer-valued (row {row}: {arr[row].item()!r})")
    elif arr.dtype.kind not in "iu":
        raise ShardError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        raise ShardError(f"{name}: values too large for int64")
    return arr.astype(np.int64)


def _flags(name: str, value: Any, n: int) -> np.ndarray:
    arr = _vector(name, value, n)
    if arr.dtype.kind == "b":
        return arr.astype(bool)
    if not np.all(np.isin(arr, (0, 1))):
        row = int(np.flatnonzero(~np.isin(arr, (0, 1)))[0])
        raise ShardError(f"{name}: flags must be booleans or 0/1 "
                         f"(row {row}: {arr[row].item()!r})")
    return arr.astype(bool)


def episode_ids_from_flags(terminated: np.ndarray, truncated: np.ndarray) -> np.ndarray:
    """Episode ids ``0, 1, ...``: a new episode starts after every row whose episode
    ended (terminated or truncated). A last episode without an end flag is kept."""
    done = np.asarray(terminated, dtype=bool) | np.asarray(truncated, dtype=bool)
    ids = np.zeros(done.shape[0], dtype=np.int64)
    ids[1:] = np.cumsum(done[:-1])
    return ids


def _deal(episode_ids: np.ndarray, num_partitions: int, partition: str | Sequence[int] |
          np.ndarray, seed: int) -> tuple[np.ndarray, str]:
    """A client index per transition, and the partition's name for the metadata."""
    n = episode_ids.shape[0]
    if isinstance(partition, str):
        if partition != "iid":
            raise ValueError(f"partition must be 'iid' or a key array, got {partition!r}")
        episodes = np.unique(episode_ids)
        if episodes.size < num_partitions:
            raise ValueError(f"{episodes.size} episodes cannot fill {num_partitions} partitions "
                             "(every shard needs at least one episode)")
        order = np.random.default_rng(seed).permutation(episodes.size)
        client_of = np.empty(episodes.size, dtype=np.int64)
        client_of[order] = np.arange(episodes.size) % num_partitions
        return client_of[np.searchsorted(episodes, episode_ids)], "iid"
    key = _integers("partition key", partition, n)
    out = (key < 0) | (key >= num_partitions)
    if out.any():
        row = int(np.flatnonzero(out)[0])
        raise ValueError(f"partition key: values must be in 0..{num_partitions - 1} (row {row}: "
                         f"{int(key[row])})")
    _, inverse = np.unique(episode_ids, return_inverse=True)
    lo = np.full(inverse.max() + 1, np.iinfo(np.int64).max)
    hi = np.full(inverse.max() + 1, -1)
    np.minimum.at(lo, inverse, key)
    np.maximum.at(hi, inverse, key)
    split = np.flatnonzero(lo != hi)
    if split.size:
        raise ValueError(f"partition key: {split.size} episodes are split across partitions "
                         "(give every transition of an episode the same key)")
    empty = sorted(set(range(num_partitions)) - set(np.unique(key).tolist()))
    if empty:
        raise ValueError(f"partition key: partitions {empty} get no transitions")
    return key, "key"


def shards_from_arrays(
    observations: Any,
    actions: Any,
    rewards: Any,
    next_observations: Any,
    terminated: Any,
    truncated: Any,
    episode_ids: Any = None,
    *,
    env_id: str,
    num_partitions: int = 1,
    partition: str | Sequence[int] | np.ndarray = "iid",
    seed: int = 0,
    metadata: dict[str, Any] | None = None,
    value_check: str = "refuse",
) -> list[Shard]:
    """Turn transition arrays into ``num_partitions`` validated shards of ``env_id``.

    Parameters
    ----------
    observations, next_observations : array-like
        ``(N, *obs_shape)`` or ``(N, obs_dim)`` numbers (converted to float32 and
        flattened to ``(N, obs_dim)``), finite.
    actions : array-like
        ``(N,)`` integers (integer-valued floats are accepted) in ``0 .. n_actions - 1``.
    rewards : array-like
        ``(N,)`` numbers.
    terminated, truncated : array-like
        ``(N,)`` booleans or 0/1: ``terminated`` stops bootstrapping, ``truncated``
        (a time limit) does not.
    episode_ids : array-like or None
        ``(N,)`` integers >= 0; ``None``: derived from the done flags
        (:func:`episode_ids_from_flags`; rows must then be in episode order).
    env_id : str
        A registered env (its module imported); sets the expected shapes.
    num_partitions : int
        Number of shards (clients).
    partition : "iid" or array-like
        ``"iid"``: whole episodes shuffled with ``seed`` and dealt round-robin;
        or a client index in ``0 .. num_partitions - 1`` per transition (all
        transitions of an episode must share it).
    seed : int
        Seed of the ``"iid"`` deal (recorded in the metadata).
    metadata : dict or None
        JSON-serialisable keys added to every shard's metadata (may not
        override the keys set here).
    value_check : {"refuse", "warn", "off"}
        Values far outside the env's bounds: refused, flagged (a warning and
        :attr:`Shard.value_flags`) or not checked (:mod:`fedqhd.data.shard`).

    Returns
    -------
    list of Shard
        Shard ``i`` is client ``i``'s (save as ``shard-<i>.npz`` for ``data-dir``);
        together they hold every transition exactly once, rows in input order.

    Raises
    ------
    ShardError
        When an array cannot be converted (naming it and the problem) or a
        shard fails validation (e.g. actions out of range, observations outside
        the env's observation space).
    ValueError
        On a bad ``num_partitions`` or ``partition``.
    """
    spec = get_spec(env_id)
    if isinstance(num_partitions, bool) or int(num_partitions) != num_partitions \
            or num_partitions < 1:
        raise ValueError(f"num_partitions must be a positive integer, got {num_partitions!r}")
    num_partitions = int(num_partitions)
    obs = _floats("observations", observations, spec.observation_shape, None)
    n = obs.shape[0]
    arrays = {
        "observations": obs,
        "actions": _integers("actions", actions, n),
        "rewards": _floats("rewards", _vector("rewards", rewards, n)[:, None], (1,), n)[:, 0],
        "next_observations": _floats("next_observations", next_observations,
                                     spec.observation_shape, n),
        "terminated": _flags("terminated", terminated, n),
        "truncated": _flags("truncated", truncated, n),
    }
    if episode_ids is None:
        ids = episode_ids_from_flags(arrays["terminated"], arrays["truncated"])
        derived = True
    else:
        ids = _integers("episode_ids", episode_ids, n)
        derived = False
    if (ids < 0).any():
        raise ShardError("episode_ids: must be >= 0")
    client, how = _deal(ids, num_partitions, partition, int(seed))
    base: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "env_id": env_id,
        "env_spec": spec_record(env_id),
        "behaviour": {"kind": IMPORT_KIND},
        "partition": how,
        "num_partitions": num_partitions,
        "seed": int(seed),
        "episode_ids_derived": derived,
    }
    clash = sorted(set(base) & set(metadata or {}) | ({"partition_id", "n_episodes"}
                                                      & set(metadata or {})))
    if clash:
        raise ValueError(f"metadata may not override {', '.join(clash)}")
    shards = []
    for i in range(num_partitions):
        rows = client == i
        episode = ids[rows]
        shard = Shard(**{k: v[rows] for k, v in arrays.items()}, episode_ids=episode,
                      metadata={**base, **(metadata or {}), "partition_id": i,
                                "n_episodes": int(np.unique(episode).size)})
        shard.validate(f"shard {i} of {env_id}", expected_env_id=env_id, value_check=value_check)
        shards.append(shard)
    return shards
