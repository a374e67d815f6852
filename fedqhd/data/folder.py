"""Shard folders: the ``shard-<i>.npz`` files and ``manifest.json`` of one partitioning,
written as a whole and checked as a whole.

``fedqhd data generate`` and ``fedqhd data import`` write through a
:class:`ShardSetWriter`: the new files go to a hidden staging folder inside the output
folder and replace the old set only once all of them are written, so an interrupted or
failed run leaves the folder as it was (and removes a folder it created) instead of a
partial set that looks complete, and a forced rewrite leaves exactly the new set (the
``shard-<i>.npz`` of an old, larger set are removed; no other file is touched).
:func:`folder_problems` lists what makes a folder not one complete, consistent set
(``fedqhd data inspect``): missing or surplus shards, a shard under another
partition's name, shards of different settings, and a manifest that disagrees with
the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from fedqhd.data.shard import FORMAT_VERSION
from fedqhd.files import atomic_write, fsync_dir

__all__ = ["MANIFEST_NAME", "SET_KEYS", "ShardSetWriter", "folder_problems", "name_list",
           "sha256", "shard_files", "shard_index", "would_replace"]

MANIFEST_NAME = "manifest.json"

#: metadata keys every shard of one set shares (where recorded): generated shards record
#: the run's settings, imported ones their source
SET_KEYS = ("env_id", "partition", "num_partitions", "base_seed", "epsilon_min",
            "epsilon_max", "source")

_SHARD_NAME = re.compile(r"shard-(\d+)\.npz")
#: how many file names a problem lists before "and N more"
_SHOWN = 5


def shard_index(path: Path) -> int | None:
    """The partition a file's name gives it (``shard-<i>.npz``), else None."""
    match = _SHARD_NAME.fullmatch(path.name)
    return int(match.group(1)) if match else None


def shard_files(path: Path) -> list[Path]:
    """``path`` itself, or the ``shard-*.npz`` files in the folder ``path``, in order."""
    if not path.is_dir():
        return [path]
    return sorted(path.glob("shard-*.npz"), key=lambda p: (len(p.name), p.name))


def sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes (what the manifest records)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _set_files(folder: Path) -> list[Path]:
    """The ``shard-<i>.npz`` files in ``folder``: the set a new one replaces."""
    if not folder.is_dir():
        return []
    return [p for p in shard_files(folder) if shard_index(p) is not None]


def name_list(paths: Iterable[Path | str]) -> str:
    """File names for a one-line message: the first few, then how many more."""
    names = [Path(p).name for p in paths]
    more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return ", ".join(names[:_SHOWN]) + more


class ShardSetWriter:
    """Writes one shard set into ``out`` all at once.

    :meth:`open` creates ``out`` (where missing) and a hidden staging folder in it;
    write the files to :meth:`path`, then :meth:`commit`. Leaving the ``with`` block
    without committing (an error, Ctrl-C, a refusal) removes the staged files, and
    ``out`` too where this writer created it.
    """

    def __init__(self, out: Path, staging: Path, created: Path | None) -> None:
        self.out = out
        self._staging = staging
        self._created = created
        self._committed = False

    @classmethod
    def open(cls, out: Path) -> ShardSetWriter:
        """Create ``out`` and the staging folder; an ``OSError`` leaves nothing made."""
        created = next((p for p in (*reversed(out.parents), out) if not p.exists()), None)
        try:
            out.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=out, prefix=".staging-"))
        except BaseException:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            raise
        return cls(out, staging, created)

    def path(self, name: str) -> Path:
        """Where to write the new set's file ``name`` (moved into ``out`` on commit)."""
        return self._staging / name

    def commit(self, manifest: dict[str, Any]) -> None:
        """Replace the set in ``out`` by the staged shards and write ``manifest``.

        The old manifest goes first and the new one comes last, so a folder caught
        halfway has none; in between, the old set's ``shard-<i>.npz`` that the new set
        does not have are removed, and the new shards moved in."""
        new = {p.name for p in self._staging.glob("shard-*.npz")}
        (self.out / MANIFEST_NAME).unlink(missing_ok=True)
        for old in _set_files(self.out):
            if old.name not in new:
                old.unlink()
        for name in sorted(new):
            os.replace(self._staging / name, self.out / name)
        atomic_write(self.out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
        fsync_dir(self.out)
        self._committed = True

    def __enter__(self) -> ShardSetWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        shutil.rmtree(self._staging, ignore_errors=True)
        if not self._committed and self._created is not None:
            shutil.rmtree(self._created, ignore_errors=True)


def would_replace(out: Path) -> list[Path]:
    """The files in ``out`` that writing a new shard set there overwrites or removes:
    every ``shard-<i>.npz`` (of whichever size of set) and the manifest."""
    manifest = out / MANIFEST_NAME
    return _set_files(out) + ([manifest] if manifest.exists() else [])


def _manifest(folder: Path, problems: list[str]) -> dict[str, Any] | None:
    """``folder``'s manifest as a JSON object (None if absent or unreadable: then said
    in ``problems``)."""
    path = folder / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        problems.append(f"{MANIFEST_NAME}: cannot be read as JSON ({exc})")
        return None
    if not (isinstance(manifest, dict) and isinstance(manifest.get("settings"), dict)
            and isinstance(manifest.get("shards"), list)
            and all(isinstance(e, dict) for e in manifest["shards"])):
        problems.append(f"{MANIFEST_NAME}: not a manifest (an object with 'settings' and a "
                        "list of 'shards')")
        return None
    return manifest


def _disagreements(metadata: dict[Path, dict[str, Any]]) -> list[str]:
    """A line per :data:`SET_KEYS` key the shards record differently."""
    problems = []
    for key in SET_KEYS:
        files_of: dict[str, list[Path]] = {}
        for path, meta in metadata.items():
            if key in meta:
                files_of.setdefault(json.dumps(meta[key]), []).append(path)
        if len(files_of) > 1:
            problems.append(f"the shards disagree on {key}: " + "; ".join(
                f"{value} ({name_list(paths)})" for value, paths in files_of.items()))
    return problems


def _partition_ids(metadata: dict[Path, dict[str, Any]]) -> list[str]:
    """A line per shard filed under another partition's name, and per partition held
    twice (by the ``partition_id`` its metadata records)."""
    problems = []
    holders: dict[int, list[Path]] = {}
    for path, meta in metadata.items():
        pid = meta.get("partition_id")
        if not isinstance(pid, int) or isinstance(pid, bool):
            continue
        holders.setdefault(pid, []).append(path)
        if shard_index(path) != pid:
            problems.append(f"{path.name} holds partition {pid} (its metadata's partition_id),"
                            f" which clients load from shard-{pid}.npz")
    problems += [f"partition {pid} is in {len(paths)} files: {name_list(paths)}"
                 for pid, paths in sorted(holders.items()) if len(paths) > 1]
    return problems


def _expected_count(manifest: dict[str, Any] | None, metadata: dict[Path, dict[str, Any]],
                    problems: list[str]) -> int | None:
    """How many shards the set should have: the manifest's ``num_partitions``, else the
    shards' own (None where neither records one)."""
    recorded = {meta["num_partitions"] for meta in metadata.values()
                if isinstance(meta.get("num_partitions"), int)}
    if manifest is not None:
        count = manifest["settings"].get("num_partitions")
        if isinstance(count, int) and not isinstance(count, bool):
            if len(recorded) == 1 and count not in recorded:  # several: said already
                problems.append(f"{MANIFEST_NAME} says num_partitions = {count}, the shards "
                                f"{next(iter(recorded))}")
            return count
        problems.append(f"{MANIFEST_NAME}: settings lack num_partitions")
    return recorded.pop() if len(recorded) == 1 else None


def _recorded_seed(meta: dict[str, Any]) -> Any:
    """The run seed a shard records (a generated shard's ``base_seed``, an imported one's
    ``seed``: its ``seed`` is otherwise the shard's own), else None."""
    if "base_seed" in meta:
        return meta["base_seed"]
    return meta.get("seed") if "source" in meta else None


def _settings_problems(manifest: dict[str, Any],
                       metadata: dict[Path, dict[str, Any]]) -> list[str]:
    """A line per manifest setting the shards record otherwise (its format_version, seed
    and episodes; only where the shards record one)."""
    problems = []
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        problems.append(f"{MANIFEST_NAME}: unsupported format_version {version!r} (this code "
                        f"reads {FORMAT_VERSION})")
    settings = manifest["settings"]
    for key, recorded in (("seed", _recorded_seed),
                          ("episodes", lambda meta: meta.get("n_episodes"))):
        if key not in settings:
            continue
        other = [path for path, meta in metadata.items()
                 if (value := recorded(meta)) is not None and value != settings[key]]
        if other:
            problems.append(f"{MANIFEST_NAME} says {key} = {json.dumps(settings[key])}, "
                            f"not so in {name_list(other)}")
    return problems


def _manifest_problems(folder: Path, manifest: dict[str, Any],
                       metadata: dict[Path, dict[str, Any]], present: list[Path],
                       transitions: dict[Path, int]) -> list[str]:
    """A line per disagreement of the manifest with the files: its format_version, env,
    seed and episodes, a file it does not list, a listed file outside the folder, a
    sha256 or n_transitions that differs."""
    problems = _settings_problems(manifest, metadata)
    env = manifest["settings"].get("env_id")
    other = sorted({str(m["env_id"]) for m in metadata.values() if m.get("env_id") != env})
    if env is not None and other:
        problems.append(f"{MANIFEST_NAME} says env {env!r}, shards hold {', '.join(other)}")
    listed: dict[str, Any] = {}
    counts: list[Path] = []
    for entry in manifest["shards"]:
        name = str(entry.get("file", ""))
        if Path(name).name != name or shard_index(Path(name)) is None:
            problems.append(f"{MANIFEST_NAME} lists {name!r}, not a shard-<i>.npz name")
            continue
        listed[name] = entry.get("sha256")
        found = transitions.get(folder / name)
        if found is not None and entry.get("n_transitions") != found:
            counts.append(folder / name)
    unlisted = [p for p in present if p.name not in listed]
    if unlisted:
        problems.append(f"not in {MANIFEST_NAME}: {name_list(unlisted)}")
    changed = [folder / name for name, digest in listed.items()
               if (folder / name).is_file() and sha256(folder / name) != digest]
    if changed:
        problems.append(f"sha256 differs from {MANIFEST_NAME}'s (changed since it was "
                        f"written): {name_list(changed)}")
    counts = [path for path in counts if path not in changed]  # a changed file: said
    if counts:
        problems.append(f"n_transitions differs from {MANIFEST_NAME}'s: {name_list(counts)}")
    return problems


def folder_problems(folder: Path, metadata: dict[Path, dict[str, Any] | None],
                    transitions: dict[Path, int] | None = None) -> list[str]:
    """What makes ``folder`` not one complete, consistent shard set, a line each.

    ``metadata``: each shard file found in it (:func:`shard_files`) and its metadata
    (None for an invalid file, which counts as present but records nothing). Checks
    that the shards agree on :data:`SET_KEYS`, that each partition is in its own
    ``shard-<i>.npz`` and only there, that ``shard-0 .. shard-<n-1>`` are all there and
    nothing beyond (``n``: the manifest's ``num_partitions``, else the shards'), and, if
    there is a ``manifest.json``, that it lists exactly these files with their sha256
    (and ``n_transitions``, given ``transitions``: each valid file's row count), a known
    ``format_version`` and the settings the shards record.
    """
    problems: list[str] = []
    valid = {path: meta for path, meta in metadata.items() if meta is not None}
    manifest = _manifest(folder, problems)
    problems += _disagreements(valid) + _partition_ids(valid)
    index = {path: i for path in metadata if (i := shard_index(path)) is not None}
    named = [path for path in metadata if path not in index]
    if named:
        problems.append(f"not named shard-<i>.npz, so no client loads them: {name_list(named)}")
    count = _expected_count(manifest, valid, problems)
    if count is not None:
        missing = sorted(set(range(count)) - set(index.values()))
        if missing:
            problems.append(f"missing {len(missing)} of {count} shards: "
                            f"{name_list(f'shard-{i}.npz' for i in missing)}")
        beyond = [path for path, i in index.items() if i >= count]
        if beyond:
            problems.append(f"beyond num_partitions = {count}: {name_list(beyond)}")
    if manifest is not None:
        problems += _manifest_problems(folder, manifest, valid, list(index),
                                       transitions or {})
    return problems
