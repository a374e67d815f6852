"""Checks made before round 1: what would make every client fail is refused at once.

Why: an offline run whose ``data-dir`` holds no shard for a partition used to run all its
rounds with every client failing. In a simulation (Flower's in-memory grid, or the
in-process grid of the bench and tests) the ServerApp sees the same file system as the
clients, and the nodes are partitions ``0 .. N-1``, so it can look for
``shard-<i>.npz`` and read each shard's recorded ``env_id`` before anything is sent. In
a deployment each SuperNode reads its own ``data-dir`` (node config), which the server
cannot see; there the clients' identical errors end the run after round 1
(:class:`fedqhd.server.failures.FailFastGrid`).
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path

from flwr.serverapp import Grid

from fedqhd.config import ConfigError, RunConfig
from fedqhd.data.partition import shard_filename


def _unwrapped(grid: Grid) -> Grid:
    """The grid under fedqhd's wrappers (fail-fast, windowed)."""
    from fedqhd.server.failures import FailFastGrid
    from fedqhd.server.window import WindowedGrid

    while isinstance(grid, FailFastGrid | WindowedGrid):
        grid = grid.grid
    return grid


def simulated_partitions(grid: Grid, wait: float = 30.0) -> int | None:
    """The number of partitions of a simulation whose nodes read the run-config
    ``data-dir`` (``None`` for a deployment, where nodes read their own).

    Flower's simulation registers its nodes while the ServerApp starts: wait until their
    count is non-zero and steady (at most ``wait`` seconds)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    from fedqhd.server.inprocess import InProcessGrid

    grid = _unwrapped(grid)
    if isinstance(grid, InProcessGrid):
        own = [c for c in grid.contexts.values() if c.node_config.get("data-dir")]
        return None if own else len(grid.contexts)
    if not isinstance(grid, InMemoryGrid):
        return None
    end, last = time.monotonic() + wait, -1
    while True:
        count = len(list(grid.get_node_ids()))
        if (count and count == last) or time.monotonic() > end:
            return count or None
        last = count
        time.sleep(0.2)


def _recorded_env(path: Path) -> str | None:
    """The ``env_id`` a shard's metadata records (``None`` if it cannot be read cheaply:
    the client's full validation will say why)."""
    try:
        with zipfile.ZipFile(path) as archive, archive.open("metadata.npy") as member:
            import numpy as np

            meta = json.loads(str(np.lib.format.read_array(member, allow_pickle=False)))
        return str(meta["env_id"])
    except Exception:  # noqa: BLE001 (any unreadable shard is the client's to report)
        return None


def check_shards(data_dir: str, num_partitions: int, env_id: str) -> None:
    """Refuse a ``data-dir`` that is not a folder, lacks ``shard-<i>.npz`` for a partition
    ``i < num_partitions``, or holds a shard recorded for another env than ``env_id``
    (:class:`ConfigError`, one line naming the key and what is missing)."""
    folder = Path(data_dir).expanduser()
    key = f"run-config key 'data-dir' = {data_dir!r}"
    if not folder.is_dir():
        why = "is a file, not a folder" if folder.exists() else "no such folder"
        raise ConfigError(f"{key}: {why}")
    missing = [i for i in range(num_partitions) if not (folder / shard_filename(i)).is_file()]
    if missing:
        which = (f"any of the {num_partitions} partitions" if len(missing) == num_partitions
                 else f"partition(s) {', '.join(map(str, missing))} of {num_partitions}")
        raise ConfigError(f"{key} holds no shard for {which} (expected "
                          f"{shard_filename(missing[0])}, ... as written by `fedqhd data "
                          "generate --num-partitions N --out DIR`)")
    for i in range(num_partitions):
        recorded = _recorded_env(folder / shard_filename(i))
        if recorded is not None and recorded != env_id:
            raise ConfigError(f"{key}: {shard_filename(i)} holds data of {recorded!r}, but "
                              f"'env-id' = {env_id!r}")


def check_node_count(grid: Grid, cfg: RunConfig) -> None:
    """Refuse a federation whose nodes all exist from the start (a grid with
    ``fixed_nodes``: the in-process one) with fewer nodes than ``min-nodes``: its server
    would wait ``node-wait-timeout`` for nodes that never come, then fail."""
    grid = _unwrapped(grid)
    if not getattr(grid, "fixed_nodes", False):
        return
    n = len(list(grid.get_node_ids()))
    if n < cfg.min_nodes:
        raise ConfigError(f"run-config key 'min-nodes' = {cfg.min_nodes}, but this in-process "
                          f"federation has {n} node(s): the server would wait "
                          f"'node-wait-timeout' ({cfg.node_wait_timeout:g} s) for nodes that "
                          f"never come; set min-nodes to at most {n} (fedqhd bench: --set "
                          f"min-nodes={n})")


def preflight(grid: Grid, cfg: RunConfig) -> None:
    """Everything that can be checked before round 1: an in-process federation's node
    count against ``min-nodes``, and an offline fqi run's ``data-dir`` in a
    simulation."""
    check_node_count(grid, cfg)
    if not cfg.data_dir or cfg.protocol != "offline" or cfg.learner != "fqi":
        return
    partitions = simulated_partitions(grid, wait=min(30.0, cfg.node_wait_timeout))
    if partitions:
        check_shards(cfg.data_dir, partitions, cfg.env_id)
