"""``fedqhd data``: pre-generate client shards for a deployment, and check shard files.

``fedqhd data generate --env CartPole-v1 --num-partitions 10 --out shards/`` writes
``shards/shard-<i>.npz`` (what ``client_shard(data_dir=...)`` loads) and
``shards/manifest.json`` (the settings and a summary and sha256 of every file).
``fedqhd data inspect PATH`` validates a shard file, or every shard in a folder,
and prints a summary; it exits with 1 on the first invalid file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from fedqhd.data.partition import PARTITIONS, generate_client_shard, shard_filename
from fedqhd.data.shard import FORMAT_VERSION, Shard, ShardError, load_shard, save_shard
from fedqhd.envs import ENV_IDS, get_spec

__all__ = ["MANIFEST_NAME", "register"]

MANIFEST_NAME = "manifest.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``data`` command (``generate``, ``inspect``) to the ``fedqhd`` parser."""
    data = subparsers.add_parser("data", help="generate and inspect private trajectory shards")
    sub = data.add_subparsers(dest="data_command", required=True)

    gen = sub.add_parser("generate", help="write shard-<i>.npz for every client + manifest.json")
    gen.add_argument("--env", default="CartPole-v1", choices=ENV_IDS)
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
    ins.add_argument("--env", default=None, choices=ENV_IDS, help="require this environment")
    ins.set_defaults(func=cmd_inspect)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate every client's shard into ``args.out``; return the exit code."""
    if args.num_partitions < 1 or args.episodes < 1:
        print("error: --num-partitions and --episodes must be >= 1", file=sys.stderr)
        return 2
    out: Path = args.out
    targets = [out / shard_filename(i) for i in range(args.num_partitions)]
    existing = [str(p) for p in [*targets, out / MANIFEST_NAME] if p.exists()]
    if existing and not args.force:
        print(f"error: would overwrite {', '.join(existing)} (use --force)", file=sys.stderr)
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
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
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
    for key in ("behaviour", "dynamics", "partition", "partition_id", "num_partitions", "seed"):
        if key in meta:
            lines.append(f"  {key}: {json.dumps(meta[key])}")
    return "\n".join(lines)


def cmd_inspect(args: argparse.Namespace) -> int:
    """Validate and summarise ``args.path`` (file or folder); return the exit code."""
    path: Path = args.path
    if path.is_dir():
        files = sorted(path.glob("shard-*.npz"), key=lambda p: (len(p.name), p.name))
        if not files:
            print(f"error: {path}: no shard-*.npz files", file=sys.stderr)
            return 1
    else:
        files = [path]
    for file in files:
        try:
            shard = load_shard(file, expected_env_id=args.env)
        except ShardError as exc:
            print(f"invalid: {exc}", file=sys.stderr)
            return 1
        print(f"{file}: ok")
        print(summarize(shard))
    return 0
