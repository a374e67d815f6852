"""``fedqhd data``: pre-generate client shards for a deployment, and check shard files.

``fedqhd data generate --env CartPole-v1 --num-partitions 10 --out shards/`` writes
``shards/shard-<i>.npz`` (what ``client_shard(data_dir=...)`` loads) and
``shards/manifest.json`` (the settings and a summary and sha256 of every file).
``fedqhd data inspect PATH`` validates a shard file, or every shard in a folder,
and prints a summary; it exits with 1 on the first invalid file.
``fedqhd data import --npz FILE --env ID --num-partitions N --out DIR`` turns a
user's own transitions (arrays named as in the shard schema; ``episode_ids``
optional) into the same shard folder (:func:`fedqhd.data.shards_from_arrays`);
``--minari DATASET_ID`` instead of ``--npz`` reads a local Minari dataset, and
``fedqhd data export DIR --minari DATASET_ID`` writes shards back as one
(:mod:`fedqhd.data.minari_io`, extra ``minari``).
``--env-module MODULE`` imports a module that registers the user's environments
first (as the run-config key ``env-module`` does in a run).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from fedqhd.data.partition import PARTITIONS, generate_client_shard, shard_filename
from fedqhd.data.shard import (
    FORMAT_VERSION,
    VALUE_CHECKS,
    Shard,
    ShardError,
    ShardLimits,
    load_shard,
    save_shard,
)
from fedqhd.envs import get_spec, is_registered, load_env_modules
from fedqhd.files import atomic_write

__all__ = ["MANIFEST_NAME", "register"]

MANIFEST_NAME = "manifest.json"


ENV_HELP = "a registered env id (the four tasks, or one registered by --env-module)"
MINARI_ROOT_HELP = ("Minari's dataset folder (default: $MINARI_DATASETS_PATH, else "
                    "~/.minari/datasets)")
ENV_MODULE_HELP = ("module(s) to import first, comma-separated; importing registers your "
                   "environments (as run-config key env-module)")
VALUE_CHECK_HELP = ("values far outside the env's bounds: refuse (default), warn (flag and "
                    "keep) or off (as run-config key value-check; docs/data.md)")


def _would_overwrite(out: Path, targets: list[Path], force: bool) -> bool:
    """Whether writing the shard files ``targets`` and the manifest to ``out`` would
    replace files (and ``force`` is off); says which on stderr."""
    existing = [str(p) for p in [*targets, out / MANIFEST_NAME] if p.exists()]
    if existing and not force:
        print(f"error: would overwrite {', '.join(existing)} (use --force, or another "
              "--out folder)", file=sys.stderr)
        return True
    return False


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` command (``generate``, ``inspect``, ``import``, ``export``)."""
    data = subparsers.add_parser("data", help="generate, import and inspect trajectory shards")
    sub = data.add_subparsers(dest="data_command", required=True)

    gen = sub.add_parser("generate", help="write shard-<i>.npz for every client + manifest.json")
    gen.add_argument("--env", default="CartPole-v1", help=ENV_HELP)
    gen.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    gen.add_argument("--partition", default="behaviour-skew", choices=PARTITIONS)
    gen.add_argument("--num-partitions", type=int, default=5, help="number of clients")
    gen.add_argument("--episodes", type=int, default=5, help="episodes per client")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--epsilon-min", type=float, default=0.8)
    gen.add_argument("--epsilon-max", type=float, default=1.0)
    gen.add_argument("--out", required=True, type=Path, help="output folder")
    gen.add_argument("--force", action="store_true", help="overwrite existing shard files")
    gen.set_defaults(func=cmd_generate)

    ins = sub.add_parser("inspect", help="validate shard file(s) and print a summary")
    ins.add_argument("path", type=Path, help="a shard .npz, or a folder of shard-<i>.npz")
    ins.add_argument("--env", default=None, help="require this environment")
    ins.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    ins.add_argument("--value-check", default="refuse", choices=VALUE_CHECKS,
                     help=VALUE_CHECK_HELP)
    ins.set_defaults(func=cmd_inspect)

    imp = sub.add_parser("import", help="shards from your own transitions (.npz of arrays "
                         "or a local Minari dataset)")
    source = imp.add_mutually_exclusive_group(required=True)
    source.add_argument("--npz", type=Path,
                        help="arrays observations, actions, rewards, next_observations, "
                        "terminated, truncated (episode_ids optional: else from the done flags)")
    source.add_argument("--minari", metavar="DATASET_ID",
                        help="a local Minari dataset (extra: fedqhd[minari]; nothing is "
                        "downloaded)")
    imp.add_argument("--minari-root", default=None, help=MINARI_ROOT_HELP)
    imp.add_argument("--env", default=None,
                     help=ENV_HELP + "; required with --npz, with --minari the dataset's env")
    imp.add_argument("--env-module", default="", help=ENV_MODULE_HELP)
    imp.add_argument("--num-partitions", type=int, default=1, help="number of clients")
    imp.add_argument("--partition-key", default=None, metavar="ARRAY",
                     help="name of an array in the .npz giving each transition's client "
                     "(default: whole episodes dealt iid with --seed)")
    imp.add_argument("--seed", type=int, default=0)
    imp.add_argument("--value-check", default="refuse", choices=VALUE_CHECKS,
                     help=VALUE_CHECK_HELP)
    imp.add_argument("--out", required=True, type=Path, help="output folder")
    imp.add_argument("--force", action="store_true", help="overwrite existing shard files")
    imp.set_defaults(func=cmd_import)

    exp = sub.add_parser("export", help="write a shard folder as a local Minari dataset")
    exp.add_argument("path", type=Path, help="a folder of shard-<i>.npz (or one shard file)")
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate every client's shard into ``args.out``; return the exit code."""
    if args.num_partitions < 1 or args.episodes < 1:
        print("error: --num-partitions and --episodes must be >= 1", file=sys.stderr)
        return 2
    problem = _load_env(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    out: Path = args.out
    targets = [out / shard_filename(i) for i in range(args.num_partitions)]
    if _would_overwrite(out, targets, args.force):
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
    entries = []
    try:
        for i, path in enumerate(tqdm(targets, desc=f"{args.env} shards", unit="shard")):
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
            save_shard(shard, path)
            entries.append(
                {
                    "file": path.name,
                    "partition_id": i,
                    "n_transitions": shard.n_transitions,
                    "n_episodes": shard.n_episodes,
                    "epsilon": shard.metadata["behaviour"]["epsilon"],
                    "dynamics": shard.metadata["dynamics"],
                    "sha256": _sha256(path),
                }
            )
    except ValueError as exc:  # invalid settings
        print(f"error: {exc}", file=sys.stderr)
        return 2
    manifest = {"format_version": FORMAT_VERSION, "settings": settings, "shards": entries}
    atomic_write(out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    total = sum(e["n_transitions"] for e in entries)
    print(f"wrote {len(entries)} shards ({total} transitions) and {MANIFEST_NAME} to {out}")
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


def _shard_files(path: Path) -> list[Path]:
    """``path`` itself, or the ``shard-<i>.npz`` files in the folder ``path``, in order."""
    if not path.is_dir():
        return [path]
    return sorted(path.glob("shard-*.npz"), key=lambda p: (len(p.name), p.name))


def _env_and_shard_files(args: argparse.Namespace) -> list[Path] | int:
    """Import ``--env-module``, check ``--env`` and list the shard files at ``args.path``;
    an exit code (after saying why) when one of those fails."""
    problem = _load_env(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    files = _shard_files(args.path)
    if not files:
        print(f"error: {args.path}: no shard-*.npz files", file=sys.stderr)
        return 1
    return files


def cmd_inspect(args: argparse.Namespace) -> int:
    """Validate and summarise ``args.path`` (file or folder); return the exit code."""
    files = _env_and_shard_files(args)
    if isinstance(files, int):
        return files
    for file in files:
        try:
            shard = load_shard(file, expected_env_id=args.env,
                               limits=ShardLimits(value_check=args.value_check))
        except ShardError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            return 1
        print(f"{file}: ok" + "".join(f"\n  flagged: {flag}" for flag in shard.value_flags))
        print(summarize(shard))
    return 0


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError) as exc:
        raise ShardError(f"{path}: cannot read a .npz archive ({exc})") from exc


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


def cmd_import(args: argparse.Namespace) -> int:
    """Turn ``args.npz``'s arrays (or the Minari dataset ``args.minari``) into shards in
    ``args.out``; return the exit code."""
    from fedqhd.data.arrays import shards_from_arrays

    problem = _load_env(args)
    if args.npz is not None and args.env is None:
        problem = problem or "--env is required with --npz"
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.num_partitions < 1:
        print("error: --num-partitions must be >= 1", file=sys.stderr)
        return 2
    out: Path = args.out
    targets = [out / shard_filename(i) for i in range(args.num_partitions)]
    if _would_overwrite(out, targets, args.force):
        return 2
    source = str(args.npz) if args.npz is not None else f"minari:{args.minari}"
    try:
        arrays = _read_npz(args.npz) if args.npz is not None else _read_minari(args)
    except (ImportError, ShardError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = ("observations", "actions", "rewards", "next_observations", "terminated",
             "truncated")
    missing = [k for k in names if k not in arrays]
    if args.partition_key and args.partition_key not in arrays:
        missing.append(args.partition_key)
    if missing:
        print(f"error: {source} lacks arrays: {', '.join(missing)} (has: "
              f"{', '.join(sorted(arrays))})", file=sys.stderr)
        return 2
    partition = arrays[args.partition_key] if args.partition_key else "iid"
    try:
        shards = shards_from_arrays(**{k: arrays[k] for k in names},
                                    episode_ids=arrays.get("episode_ids"), env_id=args.env,
                                    num_partitions=args.num_partitions,
                                    partition=partition, seed=args.seed,
                                    metadata={"source": source},
                                    value_check=args.value_check)
        entries: list[dict[str, Any]] = []
        for i, (shard, path) in enumerate(zip(shards, targets, strict=True)):
            save_shard(shard, path, value_check=args.value_check)
            entries.append({"file": path.name, "partition_id": i,
                            "n_transitions": shard.n_transitions,
                            "n_episodes": shard.n_episodes, "sha256": _sha256(path)})
    except ValueError as exc:  # ShardError included
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = {"env_id": args.env, "source": source, "num_partitions": args.num_partitions,
                "partition": args.partition_key or "iid", "seed": args.seed}
    manifest = {"format_version": FORMAT_VERSION, "settings": settings, "shards": entries}
    atomic_write(out / MANIFEST_NAME, json.dumps(manifest, indent=2) + "\n")
    total = sum(e["n_transitions"] for e in entries)
    print(f"wrote {len(entries)} shards ({total} transitions of {len(arrays['actions'])}) and "
          f"{MANIFEST_NAME} to {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write the shards at ``args.path`` as the Minari dataset ``args.minari``."""
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
