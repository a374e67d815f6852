"""``fedqhd data``: pre-generate client shards for a deployment, and check shard files.

``fedqhd data generate --env CartPole-v1 --num-partitions 10 --out shards/`` writes
``shards/shard-<i>.npz`` (what ``client_shard(data_dir=...)`` loads) and
``shards/manifest.json`` (the settings and a summary and sha256 of every file).
``fedqhd data inspect PATH`` validates a shard file, or every shard in a folder and
that the folder is one complete, consistent set (:func:`fedqhd.data.folder.folder_problems`:
no shard missing or doubled, one env and one setting, the manifest's sha256 values),
and prints a summary; it exits with 1 if a file is invalid or the folder inconsistent.
``fedqhd data import --npz FILE --env ID --num-partitions N --out DIR`` turns a
user's own transitions (arrays named as in the shard schema; ``episode_ids``
optional) into the same shard folder (:func:`fedqhd.data.shards_from_arrays`);
``--minari DATASET_ID`` instead of ``--npz`` reads a local Minari dataset, and
``fedqhd data export DIR --minari DATASET_ID`` writes shards back as one
(:mod:`fedqhd.data.minari_io`, extra ``minari``).
``--env-module MODULE`` imports a module that registers the user's environments
first (as the run-config key ``env-module`` does in a run).

Every setting, the output folder and a Minari id are checked before any work; a run
that fails or is interrupted leaves no partial shard set (:class:`ShardSetWriter`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fedqhd.commands.args import at_least, number_in, path_arg, writable_folder
from fedqhd.data.folder import (
    MANIFEST_NAME,
    ShardSetWriter,
    folder_problems,
    name_list,
    sha256,
    shard_files,
    would_replace,
)
from fedqhd.data.partition import (
    PARTITIONS,
    check_client_shards,
    generate_client_shard,
    shard_filename,
)
from fedqhd.data.shard import (
    FORMAT_VERSION,
    VALUE_CHECKS,
    Shard,
    ShardError,
    ShardLimits,
    load_shard,
    read_npz,
    save_shard,
)
from fedqhd.envs import get_spec, is_registered, load_env_modules

__all__ = ["MANIFEST_NAME", "register"]

#: what ``import --npz`` reads: a user's arrays, of any number of rows (the shards made
#: from them are checked as shards), still refused when a zip bomb or a forged header
IMPORT_LIMITS = ShardLimits(max_transitions=sys.maxsize)


ENV_HELP = "a registered env id (the four tasks, or one registered by --env-module)"
MINARI_ROOT_HELP = ("Minari's dataset folder (default: $MINARI_DATASETS_PATH, else "
                    "~/.minari/datasets)")
ENV_MODULE_HELP = ("module(s) to import first, comma-separated; importing registers your "
                   "environments (as run-config key env-module)")
VALUE_CHECK_HELP = ("values far outside the env's bounds: refuse (default), warn (flag and "
                    "keep) or off (as run-config key value-check; docs/data.md)")


def _open_out(out: Path, force: bool) -> ShardSetWriter:
    """The writer of a new shard set in ``--out``, after refusing
    (:class:`~fedqhd.config.ConfigError`, naming ``--out``) a folder that is a file or
    cannot be made, and, without ``--force``, one that holds a shard set already."""
    from fedqhd.config import ConfigError

    writable_folder("--out", out)
    replaced = would_replace(out)
    if replaced and not force:
        raise ConfigError(f"--out {out}: would overwrite {name_list(replaced)} (use --force, "
                          "or another --out folder)")
    try:
        return ShardSetWriter.open(out)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` command (``generate``, ``inspect``, ``import``, ``export``)."""
    data = subparsers.add_parser("data", help="generate, import and inspect trajectory shards")
    sub = data.add_subparsers(dest="data_command", required=True)

    gen = sub.add_parser("generate", help="write shard-<i>.npz for every client + manifest.json")
    gen.add_argument("--env", default="CartPole-v1", help=ENV_HELP)
    gen.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    gen.add_argument("--partition", default="behaviour-skew", choices=PARTITIONS)
    gen.add_argument("--num-partitions", type=at_least(1), default=5, help="number of clients")
    gen.add_argument("--episodes", type=at_least(1), default=5, help="episodes per client")
    gen.add_argument("--seed", type=at_least(0), default=0)
    gen.add_argument("--epsilon-min", type=number_in(0, 1), default=0.8)
    gen.add_argument("--epsilon-max", type=number_in(0, 1), default=1.0)
    gen.add_argument("--out", required=True, type=path_arg, help="output folder")
    gen.add_argument("--force", action="store_true",
                     help="replace the shard set in --out (its shard-<i>.npz and manifest)")
    gen.set_defaults(func=cmd_generate)

    ins = sub.add_parser("inspect", help="validate shard file(s), and that a folder is one "
                         "complete set, and print a summary")
    ins.add_argument("path", type=path_arg, help="a shard .npz, or a folder of shard-<i>.npz")
    ins.add_argument("--env", default=None, help="require this environment")
    ins.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    ins.add_argument("--value-check", default="refuse", choices=VALUE_CHECKS,
                     help=VALUE_CHECK_HELP)
    ins.set_defaults(func=cmd_inspect)

    imp = sub.add_parser("import", help="shards from your own transitions (.npz of arrays "
                         "or a local Minari dataset)")
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument("--npz", type=path_arg,
                        help="arrays observations, actions, rewards, next_observations, "
                        "terminated, truncated (episode_ids optional: else from the done flags)")
    source.add_argument("--minari", metavar="DATASET_ID",
                        help="a local Minari dataset (extra: fedqhd[minari]; nothing is "
                        "downloaded)")
    imp.add_argument("--minari-root", default=None, help=MINARI_ROOT_HELP)
    imp.add_argument("--env", default=None,
                     help=ENV_HELP + "; required with --npz, with --minari the dataset's env")
    imp.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    imp.add_argument("--num-partitions", type=at_least(1), default=1, help="number of clients")
    imp.add_argument("--partition-key", default=None, metavar="ARRAY",
                     help="name of an array in the .npz giving each transition's client "
                     "(default: whole episodes dealt iid with --seed)")
    imp.add_argument("--seed", type=at_least(0), default=0)
    imp.add_argument("--value-check", default="refuse", choices=VALUE_CHECKS,
                     help=VALUE_CHECK_HELP)
    imp.add_argument("--out", required=True, type=path_arg, help="output folder")
    imp.add_argument("--force", action="store_true",
                     help="replace the shard set in --out (its shard-<i>.npz and manifest)")
    imp.set_defaults(func=cmd_import)

    exp = sub.add_parser("export", help="write a shard folder as a local Minari dataset")
    exp.add_argument("path", type=path_arg, help="a folder of shard-<i>.npz (or one shard file)")
    exp.add_argument("--minari", required=True, metavar="DATASET_ID",
                     help="id of the new dataset, e.g. cartpole/fedqhd-v0")
    exp.add_argument("--minari-root", default=None, help=MINARI_ROOT_HELP)
    exp.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    exp.set_defaults(func=cmd_export)


def _load_env(args: argparse.Namespace) -> str | None:
    """Import --env-module and check --env; an error message, or None."""
    try:
        load_env_modules(getattr(args, "env_module", ""))
    except ImportError as exc:
        return f"--env-module: {exc}"
    env = getattr(args, "env", None)
    if env is not None and not is_registered(env):
        try:
            get_spec(env)
        except ValueError as exc:
            return f"--env: {exc}"
    return None


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate every client's shard into ``args.out``; return the exit code."""
    problem = _load_env(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:  # every client's settings, before the progress bar starts
        check_client_shards(args.env, args.partition, args.num_partitions, args.episodes,
                            args.seed, args.epsilon_min, args.epsilon_max)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = {
        "env_id": args.env,
        "partition": args.partition,
        "num_partitions": args.num_partitions,
        "episodes": args.episodes,
        "seed": args.seed,
        "epsilon_min": args.epsilon_min,
        "epsilon_max": args.epsilon_max,
    }
    entries: list[dict[str, Any]] = []
    with _open_out(args.out, args.force) as writer:
        try:
            names = [shard_filename(i) for i in range(args.num_partitions)]
            for i, name in enumerate(tqdm(names, desc=f"{args.env} shards", unit="shard")):
                shard = generate_client_shard(
                    args.env,
                    args.partition,
                    i,
                    args.num_partitions,
                    args.episodes,
                    args.seed,
                    args.epsilon_min,
                    args.epsilon_max,
                )
                entries.append({**_entry(i, shard, save_shard(shard, writer.path(name))),
                                "epsilon": shard.metadata["behaviour"]["epsilon"],
                                "dynamics": shard.metadata["dynamics"]})
        except ValueError as exc:  # a shard the env's bounds refuse (a user's env)
            print(f"error: {exc}", file=sys.stderr)
            return 2
        writer.commit({"format_version": FORMAT_VERSION, "settings": settings,
                       "shards": entries})
    total = sum(e["n_transitions"] for e in entries)
    print(f"wrote {len(entries)} shards ({total} transitions) and {MANIFEST_NAME} to "
          f"{args.out}")
    return 0


def summarize(shard: Shard) -> str:
    """A few lines describing a shard (what ``fedqhd data inspect`` prints)."""
    meta = shard.metadata
    returns = shard.episode_returns()
    n_actions = get_spec(shard.env_id).n_actions
    lines = [
        f"  env {meta['env_id']}, {shard.n_transitions} transitions, {shard.n_episodes} episodes"
        f" ({int(shard.terminated.sum())} terminated, {int(shard.truncated.sum())} truncated)",
        f"  episode return mean {returns.mean():.2f}, min {returns.min():.2f},"
        f" max {returns.max():.2f}",
        f"  actions {np.bincount(shard.actions, minlength=n_actions).tolist()} (counts per action)",
    ]
    for key in ("behaviour", "dynamics", "partition", "partition_id", "num_partitions", "seed",
                "env_spec"):
        if key in meta:
            lines.append(f"  {key}: {json.dumps(meta[key])}")
    return "\n".join(lines)


def _special(path: Path) -> str | None:
    """Why ``path`` may not be read, if it exists but is neither a folder nor a regular
    file (a device reads without end, a pipe blocks): said before opening it."""
    if path.exists() and not (path.is_dir() or path.is_file()):
        return (f"{path}: not a folder or a regular file (a device, pipe or socket?); "
                "not read")
    return None


def _env_and_shard_files(args: argparse.Namespace) -> list[Path] | int:
    """Import ``--env-module``, check ``--env`` and list the shard files at ``args.path``;
    an exit code (after saying why) when one of those fails."""
    problem = _load_env(args) or _special(args.path)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    files = shard_files(args.path)
    if not files:
        print(f"error: {args.path}: no shard-*.npz files", file=sys.stderr)
        return 1
    return files


def cmd_inspect(args: argparse.Namespace) -> int:
    """Validate and summarise ``args.path`` (file or folder), and check a folder is one
    consistent set; return the exit code (1: a file invalid or the set inconsistent)."""
    files = _env_and_shard_files(args)
    if isinstance(files, int):
        return files
    metadata: dict[Path, dict[str, Any] | None] = {}
    transitions: dict[Path, int] = {}
    for file in files:
        try:
            shard = load_shard(file, expected_env_id=args.env,
                               limits=ShardLimits(value_check=args.value_check))
        except ShardError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            metadata[file] = None
            continue
        metadata[file], transitions[file] = shard.metadata, shard.n_transitions
        print(f"{file}: ok" + "".join(f"\n  flagged: {flag}" for flag in shard.value_flags))
        print(summarize(shard))
    problems = (folder_problems(args.path, metadata, transitions) if args.path.is_dir()
                else [])
    for problem in problems:
        print(f"inconsistent: {args.path}: {problem}", file=sys.stderr)
    if args.path.is_dir() and not (args.path / MANIFEST_NAME).exists():
        print(f"note: {args.path} has no {MANIFEST_NAME}, so the files' sha256 are not checked")
    return 1 if problems or None in metadata.values() else 0


def _check_minari(args: argparse.Namespace) -> str | None:
    """Check ``--minari``'s id (and that the extra is installed); an error message, or
    None. Before anything is made: Minari makes a folder named after a malformed id."""
    if args.minari is None:
        return None
    try:
        from fedqhd.data.minari_io import check_dataset_id

        check_dataset_id(args.minari)
    except (ImportError, ShardError) as exc:
        return f"--minari: {exc}"
    return None


def _read_minari(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """The Minari dataset's transitions; sets ``args.env`` from it when not given."""
    from fedqhd.data.minari_io import arrays_from_minari, minari_env_id

    if args.env is None:
        args.env = minari_env_id(args.minari, args.minari_root)
        if args.env is None:
            raise ShardError(f"minari dataset {args.minari!r} records no env; give --env")
        if not is_registered(args.env):
            raise ShardError(f"minari dataset {args.minari!r} is of {args.env!r}, which fedqhd "
                             "does not know: register it in a module given by --env-module")
    return arrays_from_minari(args.minari, args.minari_root)


def _imported_shards(args: argparse.Namespace, source: str) -> tuple[list[Shard], int]:
    """The shards of ``--npz`` or ``--minari`` and how many transitions the source has;
    raises ``ShardError`` / ``ValueError`` / ``ImportError`` saying what is wrong."""
    from fedqhd.data.arrays import shards_from_arrays

    arrays = read_npz(args.npz, IMPORT_LIMITS) if args.npz is not None else _read_minari(args)
    names = ("observations", "actions", "rewards", "next_observations", "terminated",
             "truncated")
    missing = [k for k in names if k not in arrays]
    if args.partition_key and args.partition_key not in arrays:
        missing.append(args.partition_key)
    if missing:
        raise ShardError(f"{source} lacks arrays: {', '.join(missing)} (has: "
                         f"{', '.join(sorted(arrays))})")
    shards = shards_from_arrays(**{k: arrays[k] for k in names},
                                episode_ids=arrays.get("episode_ids"), env_id=args.env,
                                num_partitions=args.num_partitions,
                                partition=arrays[args.partition_key] if args.partition_key
                                else "iid", seed=args.seed, metadata={"source": source},
                                value_check=args.value_check)
    return shards, len(arrays["actions"])


def _entry(partition_id: int, shard: Shard, path: Path) -> dict[str, Any]:
    """A shard's entry in the manifest."""
    return {"file": path.name, "partition_id": partition_id,
            "n_transitions": shard.n_transitions, "n_episodes": shard.n_episodes,
            "sha256": sha256(path)}


def cmd_import(args: argparse.Namespace) -> int:
    """Turn ``args.npz``'s arrays (or the Minari dataset ``args.minari``) into shards in
    ``args.out``; return the exit code."""
    problem = _load_env(args)
    if args.npz is not None and args.env is None:
        problem = problem or "--env is required with --npz"
    problem = problem or _check_minari(args)
    if problem is None and args.npz is not None and (special := _special(args.npz)):
        problem = f"--npz {special}"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    source = str(args.npz) if args.npz is not None else f"minari:{args.minari}"
    with _open_out(args.out, args.force) as writer:
        try:
            shards, available = _imported_shards(args, source)
            entries = [_entry(i, shard, save_shard(shard, writer.path(shard_filename(i)),
                                                   value_check=args.value_check))
                       for i, shard in enumerate(shards)]
        except (ImportError, ValueError) as exc:  # ShardError included
            print(f"error: {exc}", file=sys.stderr)
            return 2
        settings = {"env_id": args.env, "source": source,
                    "num_partitions": args.num_partitions,
                    "partition": args.partition_key or "iid", "seed": args.seed}
        writer.commit({"format_version": FORMAT_VERSION, "settings": settings,
                       "shards": entries})
    total = sum(e["n_transitions"] for e in entries)
    print(f"wrote {len(entries)} shards ({total} transitions of {available}) and "
          f"{MANIFEST_NAME} to {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the shards at ``args.path`` as the Minari dataset ``args.minari``."""
    problem = _check_minari(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.minari_root is not None:
        writable_folder("--minari-root", Path(args.minari_root))
    files = _env_and_shard_files(args)
    if isinstance(files, int):
        return files
    try:
        from fedqhd.data.minari_io import export_to_minari

        shards = [load_shard(file) for file in files]
        dataset = export_to_minari(shards, args.minari, args.minari_root)
    except (ImportError, ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote minari dataset {args.minari}: {dataset.total_episodes} episodes, "
          f"{dataset.total_steps} transitions from {len(files)} shard file(s)")
    return 0
