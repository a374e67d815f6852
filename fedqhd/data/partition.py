"""Splitting behaviour data across clients, and each client's shard (generated or loaded).

Partitions (what differs between clients ``0 .. num_partitions - 1``):

``iid``
    Nothing: every client runs the same behaviour policy, epsilon =
    ``(epsilon_min + epsilon_max) / 2``, on stock dynamics. Only the random
    streams differ, so shards are identically distributed.
``behaviour-skew``
    Epsilon, spread evenly from ``epsilon_min`` (client 0) to ``epsilon_max``
    (last client); stock dynamics. One client alone gets the midpoint.
``dynamics-skew``
    Physical parameters (:attr:`fedqhd.envs.EnvSpec.dynamics_ranges`); epsilon
    as for ``iid``. Each parameter takes ``num_partitions`` evenly spaced
    values (bin centres of its range), dealt to clients by a permutation drawn
    from the seed, independently per parameter (a Latin hypercube): clients
    always differ, parameters are not correlated across clients, and every
    client can compute its own settings from ``(seed, partition_id)`` alone.

A client's collection seed is :func:`shard_seed` ``(seed, partition_id)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

from fedqhd.data.collect import check_collection, collect_shard
from fedqhd.data.shard import (
    FORMAT_VERSION,
    Shard,
    ShardError,
    ShardLimits,
    load_shard,
    save_shard,
)
from fedqhd.envs import get_spec, spec_fingerprint
from fedqhd.seeding import dynamics_rng, shard_seed

__all__ = [
    "CACHE_ENV_VAR",
    "PARTITIONS",
    "check_client_shards",
    "client_shard",
    "default_cache_dir",
    "generate_client_shard",
    "partition_settings",
    "shard_filename",
    "shard_seed",
]

PARTITIONS: tuple[str, ...] = ("iid", "behaviour-skew", "dynamics-skew")

#: environment variable overriding the default shard cache folder
CACHE_ENV_VAR = "FEDQHD_CACHE_DIR"

#: bump when collection changes so that cached shards of older code are not reused
_GENERATOR_VERSION = 2  # 2: shards record env_spec


def _check_partition(partition: str, partition_id: int, num_partitions: int) -> None:
    if partition not in PARTITIONS:
        raise ValueError(f"unknown partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    if (
        isinstance(num_partitions, bool)
        or int(num_partitions) != num_partitions
        or num_partitions < 1
    ):
        raise ValueError(f"num_partitions must be a positive integer, got {num_partitions!r}")
    if (
        isinstance(partition_id, bool)
        or int(partition_id) != partition_id
        or not 0 <= partition_id < num_partitions
    ):
        raise ValueError(
            f"partition_id must be an integer in 0..{num_partitions - 1}, got {partition_id!r}"
        )


def partition_settings(
    partition: str,
    partition_id: int,
    num_partitions: int,
    seed: int,
    epsilon_min: float = 0.8,
    epsilon_max: float = 1.0,
    env_id: str | None = None,
) -> dict[str, Any]:
    """Behaviour epsilon and dynamics of one client (see the module docstring).

    Parameters
    ----------
    partition : str
        One of :data:`PARTITIONS`.
    partition_id : int
        The client, ``0 <= partition_id < num_partitions``.
    num_partitions : int
        Number of clients (>= 1).
    seed : int
        Run seed (used by ``dynamics-skew`` to deal parameter values).
    epsilon_min, epsilon_max : float
        Range of behaviour epsilons, ``0 <= epsilon_min <= epsilon_max <= 1``.
    env_id : str or None
        Needed by ``dynamics-skew`` (for the parameter ranges); ignored otherwise.

    Returns
    -------
    dict
        ``{"epsilon": float, "dynamics": dict[str, float]}``; ``dynamics`` is
        empty (stock physics) except for ``dynamics-skew``.
    """
    _check_partition(partition, partition_id, num_partitions)
    if not 0.0 <= epsilon_min <= epsilon_max <= 1.0:
        raise ValueError(
            f"need 0 <= epsilon_min <= epsilon_max <= 1, got {epsilon_min!r}, {epsilon_max!r}"
        )
    midpoint = (epsilon_min + epsilon_max) / 2
    if partition == "behaviour-skew":
        epsilon = (
            midpoint
            if num_partitions == 1
            else epsilon_min + (epsilon_max - epsilon_min) * partition_id / (num_partitions - 1)
        )
        return {"epsilon": float(epsilon), "dynamics": {}}
    if partition == "iid":
        return {"epsilon": float(midpoint), "dynamics": {}}
    if env_id is None:
        raise ValueError("partition 'dynamics-skew' needs env_id (for the parameter ranges)")
    ranges = get_spec(env_id).dynamics_ranges
    rng = dynamics_rng(seed)
    dynamics = {}
    for name in sorted(ranges):
        lo, hi = ranges[name]
        slot = rng.permutation(num_partitions)[partition_id]
        dynamics[name] = float(lo + (hi - lo) * (slot + 0.5) / num_partitions)
    return {"epsilon": float(midpoint), "dynamics": dynamics}


def shard_filename(partition_id: int) -> str:
    """File name of a client's shard in a data directory: ``shard-<partition_id>.npz``."""
    return f"shard-{int(partition_id)}.npz"


def generate_client_shard(
    env_id: str,
    partition: str,
    partition_id: int,
    num_partitions: int,
    episodes: int,
    seed: int,
    epsilon_min: float = 0.8,
    epsilon_max: float = 1.0,
) -> Shard:
    """Collect one client's shard (no files involved); deterministic in its arguments.

    Parameters are as for :func:`client_shard`. The metadata records the
    partition, ``base_seed`` (the run seed) and the epsilon range besides what
    :func:`fedqhd.data.collect_shard` writes.
    """
    get_spec(env_id)
    settings = partition_settings(
        partition, partition_id, num_partitions, seed, epsilon_min, epsilon_max, env_id=env_id
    )
    return collect_shard(
        env_id,
        episodes,
        settings["epsilon"],
        shard_seed(seed, partition_id),
        settings["dynamics"],
        metadata_extra={
            "partition": partition,
            "partition_id": int(partition_id),
            "num_partitions": int(num_partitions),
            "base_seed": int(seed),
            "epsilon_min": float(epsilon_min),
            "epsilon_max": float(epsilon_max),
        },
    )


def check_client_shards(
    env_id: str,
    partition: str,
    num_partitions: int,
    episodes: int,
    seed: int,
    epsilon_min: float = 0.8,
    epsilon_max: float = 1.0,
) -> None:
    """Raise the ``ValueError`` :func:`generate_client_shard` would raise for any client
    of these settings, without collecting anything (``fedqhd data generate`` refuses bad
    settings before its first shard, not after)."""
    for partition_id in range(max(num_partitions, 1)):  # 0 partitions: refused by the first
        settings = partition_settings(partition, partition_id, num_partitions, seed,
                                      epsilon_min, epsilon_max, env_id=env_id)
        check_collection(env_id, episodes, settings["epsilon"], settings["dynamics"])


def default_cache_dir() -> Path:
    """``$FEDQHD_CACHE_DIR`` if set, else ``~/.cache/fedqhd/shards``."""
    env = os.environ.get(CACHE_ENV_VAR)
    return Path(env) if env else Path.home() / ".cache" / "fedqhd" / "shards"


def _cache_path(cache_dir: Path, settings: dict[str, Any]) -> Path:
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]
    s = settings
    name = f"{s['env_id']}-{s['partition']}-{s['partition_id']}of{s['num_partitions']}-{key}.npz"
    return cache_dir / name


def client_shard(
    env_id: str,
    partition: str,
    partition_id: int,
    num_partitions: int,
    episodes: int,
    seed: int,
    data_dir: str | os.PathLike[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    epsilon_min: float = 0.8,
    epsilon_max: float = 1.0,
    limits: ShardLimits | None = None,
) -> Shard:
    """The shard a client trains on: loaded from ``data_dir`` or generated and cached.

    Parameters
    ----------
    env_id : str
        Environment; a loaded shard must match it.
    partition : str
        One of :data:`PARTITIONS`.
    partition_id, num_partitions : int
        This client and the number of clients.
    episodes : int
        Episodes per client (generation only).
    seed : int
        Run seed; the client's data depend on ``(seed, partition_id)`` and the
        other settings (generation only).
    data_dir : str, PathLike or None
        If given (and not empty), load ``<data_dir>/shard-<partition_id>.npz``
        (e.g. written by ``fedqhd data generate``); ``partition``, ``episodes``,
        ``seed`` and the epsilon range are then not used, but a
        ``partition_id`` recorded in the file must match.
    cache_dir : str, PathLike or None
        Where generated shards are cached, keyed by a hash of every setting;
        default :func:`default_cache_dir`. A cached file that fails validation
        is regenerated with a warning.
    epsilon_min, epsilon_max : float
        Behaviour epsilon range (see :func:`partition_settings`).
    limits : ShardLimits or None
        Value check and size caps of a loaded file (default: refuse, default caps).

    Returns
    -------
    Shard

    Raises
    ------
    ShardError
        If the file in ``data_dir`` is missing or invalid.
    ValueError
        On invalid settings.
    """
    _check_partition(partition, partition_id, num_partitions)
    if data_dir:
        path = Path(data_dir) / shard_filename(partition_id)
        if not path.is_file():
            raise ShardError(
                f"{path}: no shard for partition {partition_id} in data dir {data_dir} "
                "(expected shard-<partition-id>.npz, as written by `fedqhd data generate`)"
            )
        shard = load_shard(path, expected_env_id=env_id, limits=limits)
        recorded = shard.metadata.get("partition_id", partition_id)
        if recorded != partition_id:
            raise ShardError(
                f"{path}: metadata partition_id is {recorded!r}, but loaded for partition "
                f"{partition_id}"
            )
        return shard

    settings = {
        "generator_version": _GENERATOR_VERSION,
        "format_version": FORMAT_VERSION,
        "env_id": env_id,
        "partition": partition,
        "partition_id": int(partition_id),
        "num_partitions": int(num_partitions),
        "episodes": int(episodes),
        "seed": int(seed),
        "epsilon_min": float(epsilon_min),
        "epsilon_max": float(epsilon_max),
        "env_spec": spec_fingerprint(env_id),  # a re-registered env gets fresh shards
    }
    path = _cache_path(Path(cache_dir) if cache_dir else default_cache_dir(), settings)
    if path.is_file():
        try:
            return load_shard(path, expected_env_id=env_id, limits=limits)
        except ShardError as exc:
            warnings.warn(f"regenerating invalid cached shard: {exc}", stacklevel=2)
    shard = generate_client_shard(
        env_id, partition, partition_id, num_partitions, episodes, seed, epsilon_min, epsilon_max
    )
    save_shard(shard, path)
    return shard
