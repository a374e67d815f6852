"""Shards to and from Minari datasets, the offline-RL standard format (extra ``minari``).

:func:`arrays_from_minari` reads a *local* Minari dataset (nothing is downloaded:
``minari download ID`` is the user's own step) into the transition arrays that
:func:`fedqhd.data.shards_from_arrays` takes: each episode's ``T + 1`` observations
become ``T`` (observation, next observation) rows, its episode id is kept, and
Minari's ``terminations`` / ``truncations`` map to ``terminated`` / ``truncated``.
:func:`export_to_minari` writes shards back as one Minari dataset, one episode per
episode id, after checking that each episode's rows are a chain (every next
observation is the following row's observation), which is what Minari stores.

``MINARI_DATASETS_PATH`` (or ``root`` here, ``--minari-root`` in the CLI) chooses
the dataset folder, as in Minari itself.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.data.shard import Shard, ShardError
from fedqhd.envs import get_spec

__all__ = ["INSTALL_HINT", "arrays_from_minari", "check_dataset_id", "datasets_folder",
           "export_to_minari", "minari_env_id"]

INSTALL_HINT = 'Minari support needs the extra: pip install "fedqhd[minari]"'

#: the transition arrays :func:`fedqhd.data.shards_from_arrays` takes, plus episode ids
TRANSITION_KEYS = ("observations", "actions", "rewards", "next_observations", "terminated",
                   "truncated", "episode_ids")


def _minari() -> Any:
    try:
        import minari
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(INSTALL_HINT) from exc
    return minari


def check_dataset_id(dataset_id: str) -> str:
    """Refuse an id that is not ``(namespace/)name-vN`` before Minari sees it: Minari
    would raise a traceback, and on export first create a folder named after the id,
    whose presence breaks every later listing of that datasets folder."""
    _minari()  # the install hint, where the extra is missing
    from minari.dataset.minari_dataset import parse_dataset_id

    try:
        version = parse_dataset_id(dataset_id)[2]
    except (TypeError, ValueError):  # minari 0.5 raises TypeError for a missing -vN
        version = None
    if version is None:
        raise ShardError(f"{dataset_id!r} is not a Minari dataset id: ids are "
                         "(namespace/)name-v<version>, e.g. cartpole/fedqhd-v0")
    return dataset_id


def datasets_folder(root: str | os.PathLike[str] | None = None) -> Path:
    """The folder Minari keeps its datasets in: ``root``, else ``$MINARI_DATASETS_PATH``,
    else ``~/.minari/datasets`` (as Minari decides it)."""
    if root is not None:
        return Path(root).expanduser().resolve()
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env is not None else Path.home() / ".minari" / "datasets"


@contextmanager
def _datasets_root(root: str | os.PathLike[str] | None) -> Iterator[None]:
    """Point Minari at ``root`` for the duration (it reads ``MINARI_DATASETS_PATH``)."""
    if root is None:
        yield
        return
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = str(datasets_folder(root))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = old


def _local_datasets(minari: Any) -> dict[str, Any]:
    """Minari's local datasets (of ``MINARI_DATASETS_PATH``, which Minari creates if
    missing); a folder there that Minari cannot parse is one error, not a traceback."""
    try:
        return dict(minari.list_local_datasets())
    except (TypeError, ValueError) as exc:
        raise ShardError(f"minari cannot list the datasets in {datasets_folder()} ({exc}); "
                         "is there a folder that is not a dataset?") from None


def _load(dataset_id: str, root: str | os.PathLike[str] | None) -> Any:
    """The local dataset ``dataset_id``; the datasets folder is never created."""
    minari = _minari()
    check_dataset_id(dataset_id)
    folder = datasets_folder(root)
    with _datasets_root(root):
        local = _local_datasets(minari) if folder.is_dir() else {}
        if dataset_id not in local:
            found = (f"local: {', '.join(sorted(local)) or 'none'}" if folder.is_dir() else
                     "not a folder" if folder.exists() else "no such folder")
            raise ShardError(
                f"minari dataset {dataset_id!r} is not in {folder} ({found}); nothing is "
                f"downloaded at run time: run `minari download {dataset_id}` first, or give "
                "--minari-root")
        return minari.load_dataset(dataset_id, download=False)


def minari_env_id(dataset_id: str, root: str | os.PathLike[str] | None = None) -> str | None:
    """The gymnasium env id recorded in a local Minari dataset (None if it has none)."""
    spec = _load(dataset_id, root).spec.env_spec
    return None if spec is None else str(spec.id)


def arrays_from_minari(dataset_id: str, root: str | os.PathLike[str] | None = None
                       ) -> dict[str, np.ndarray]:
    """The transitions of a local Minari dataset as flat arrays (``TRANSITION_KEYS``).

    Raises :class:`~fedqhd.data.ShardError` for a dataset that is not local, is
    empty, or has dict/tuple observations or actions (fedqhd's shards hold one
    array of observations and one discrete action per transition).
    """
    dataset = _load(dataset_id, root)
    parts: dict[str, list[np.ndarray]] = {key: [] for key in TRANSITION_KEYS}
    for episode in dataset.iterate_episodes():
        obs, actions = episode.observations, episode.actions
        if not isinstance(obs, np.ndarray) or not isinstance(actions, np.ndarray):
            raise ShardError(f"minari dataset {dataset_id!r}, episode {episode.id}: dict or "
                             "tuple observations/actions are not supported (flatten them first)")
        steps = int(actions.shape[0])
        if obs.shape[0] != steps + 1:
            raise ShardError(f"minari dataset {dataset_id!r}, episode {episode.id}: "
                             f"{obs.shape[0]} observations for {steps} actions (need steps + 1)")
        parts["observations"].append(obs[:-1])
        parts["next_observations"].append(obs[1:])
        parts["actions"].append(actions.reshape(steps, -1)[:, 0] if actions.ndim > 1
                                else actions)
        parts["rewards"].append(np.asarray(episode.rewards))
        parts["terminated"].append(np.asarray(episode.terminations, dtype=bool))
        parts["truncated"].append(np.asarray(episode.truncations, dtype=bool))
        parts["episode_ids"].append(np.full(steps, int(episode.id), dtype=np.int64))
    if not parts["actions"]:
        raise ShardError(f"minari dataset {dataset_id!r} has no episodes")
    return {key: np.concatenate(value) for key, value in parts.items()}


def _episode_buffers(shards: Sequence[Shard], env_id: str) -> list[Any]:
    """One Minari ``EpisodeBuffer`` per (shard, episode id), rows in shard order."""
    from minari.data_collector import EpisodeBuffer

    shape = get_spec(env_id).observation_shape
    buffers: list[Any] = []
    for index, shard in enumerate(shards):
        if shard.env_id != env_id:
            raise ShardError(f"shard {index} is of {shard.env_id!r}, not {env_id!r}")
        ids, first = np.unique(shard.episode_ids, return_index=True)
        for episode in ids[np.argsort(first)]:
            rows = np.flatnonzero(shard.episode_ids == episode)
            obs, nxt = shard.observations[rows], shard.next_observations[rows]
            if rows.size > 1 and not np.array_equal(nxt[:-1], obs[1:]):
                raise ShardError(
                    f"shard {index}, episode {int(episode)}: its transitions are not one chain "
                    "(a next observation differs from the following observation), which a "
                    "Minari episode needs")
            observations = np.concatenate([obs, nxt[-1:]]).reshape(rows.size + 1, *shape)
            buffers.append(EpisodeBuffer(
                id=len(buffers), observations=list(observations),
                actions=list(shard.actions[rows]), rewards=list(shard.rewards[rows]),
                terminations=list(shard.terminated[rows]),
                truncations=list(shard.truncated[rows])))
    if not buffers:
        raise ShardError("no transitions to export")
    return buffers


def export_to_minari(shards: Sequence[Shard], dataset_id: str,
                     root: str | os.PathLike[str] | None = None, *,
                     env_id: str | None = None, description: str = "") -> Any:
    """Write ``shards`` as the local Minari dataset ``dataset_id`` (refused if it exists).

    The env id defaults to the shards' own; the dataset records it (the gymnasium id, so
    ``minari`` can rebuild the env where gymnasium knows it).
    """
    minari = _minari()
    check_dataset_id(dataset_id)
    if not shards:
        raise ShardError("no shards to export")
    env_id = env_id or shards[0].env_id
    buffers = _episode_buffers(shards, env_id)
    target = datasets_folder(root) / dataset_id
    # the first folder on the way to the dataset's that this export makes: removed again
    # if it fails, so no half-written dataset is left to break later listings
    created = next((p for p in (*reversed(target.parents), target) if not p.exists()), None)
    with _datasets_root(root), warnings.catch_warnings():
        # minari asks for author, e-mail, eval env "for longevity": not ours to invent
        warnings.filterwarnings("ignore", message=".*is set to None.*", category=UserWarning)
        try:
            if created is None or dataset_id in _local_datasets(minari):
                raise ShardError(f"minari dataset {dataset_id!r} exists ({target}); choose "
                                 "another id or delete it first (`minari delete ID`)")
            return _create_dataset(minari, dataset_id, buffers, env_id, description or
                                   f"fedqhd shards of {env_id} ({len(shards)} clients)")
        except BaseException:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise


def _create_dataset(minari: Any, dataset_id: str, buffers: list[Any], env_id: str,
                    description: str) -> Any:
    """Minari's ``create_dataset_from_buffers``, with the spaces from the env where
    gymnasium knows it, else from fedqhd's spec."""
    import gymnasium as gym

    if env_id in gym.registry:  # minari takes the spaces from the env itself
        return minari.create_dataset_from_buffers(
            dataset_id=dataset_id, buffer=buffers, env=env_id,
            algorithm_name="fedqhd export", description=description)
    spec = get_spec(env_id)
    low = np.full(spec.observation_shape, -np.inf, dtype=np.float32)
    return minari.create_dataset_from_buffers(
        dataset_id=dataset_id, buffer=buffers, algorithm_name="fedqhd export",
        observation_space=gym.spaces.Box(low, -low, dtype=np.float32),
        action_space=gym.spaces.Discrete(spec.n_actions), description=description)
