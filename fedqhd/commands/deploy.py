"""``fedqhd deploy``: credentials, the compose file, and the deployment as local processes.

``fedqhd deploy certs --out DIR`` makes the CA, the SuperLink certificate, SuperNode
keys and SuperExec secrets (what the compose ``certs`` service runs);
``fedqhd deploy compose -n N`` writes ``docker-compose.yml`` for N SuperNodes;
``fedqhd deploy local`` starts SuperLink, SuperExecs and SuperNodes on loopback,
runs ``flwr run`` once (or serves until Ctrl-C with ``--serve``) and stops them all.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedqhd.files import atomic_write

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``deploy`` command (``certs``, ``compose``, ``local``) to ``fedqhd``."""
    deploy = subparsers.add_parser(
        "deploy", help="deployment: credentials, docker-compose.yml, local multi-process run")
    sub = deploy.add_subparsers(dest="deploy_command", required=True)

    certs = sub.add_parser("certs", help="CA + SuperLink TLS cert, SuperNode keys, secrets")
    certs.add_argument("--out", required=True, type=Path)
    certs.add_argument("-n", "--num-supernodes", type=int, default=3)
    certs.add_argument("--san", action="append", default=[],
                       help="extra host names or IPs of the SuperLink, comma-separated "
                            "(repeatable; compose: SUPERLINK_HOST takes the same list)")
    certs.add_argument("--days", type=int, default=365)
    certs.add_argument("--owner", type=int, default=None,
                       help="chown everything to this uid/gid (compose: Flower's app user)")
    certs.add_argument("--chown", action="append", type=Path, default=[],
                       help="with --owner: also chown this folder and what is in it "
                            "(compose: volumes the services write to)")
    certs.set_defaults(func=cmd_certs)

    compose = sub.add_parser("compose", help="write docker-compose.yml for N SuperNodes")
    compose.add_argument("-n", "--num-supernodes", type=int, default=3)
    compose.add_argument("--out", type=Path, default=Path("docker-compose.yml"),
                         help="output file ('-' for stdout)")
    compose.set_defaults(func=cmd_compose)

    local = sub.add_parser(
        "local", help="SuperLink + SuperExecs + SuperNodes as local processes, then flwr run")
    local.add_argument("-n", "--num-supernodes", type=int, default=3)
    local.add_argument("--workdir", type=Path, default=None,
                       help="credentials, logs, state, results (default: a temp folder)")
    local.add_argument("--shards", type=Path, default=None,
                       help="folder of shard-<i>.npz (default: generated into the workdir)")
    local.add_argument("--env", default=None,
                       help="environment of generated shards and of the run (default: the "
                       "run config's env-id, else CartPole-v1)")
    local.add_argument("--env-module", default="",
                       help="module(s) registering your environments, importable from the app "
                       "folder: imported to generate shards, and the run's env-module")
    local.add_argument("--episodes", type=int, default=5, help="episodes per generated shard")
    local.add_argument("--rounds", type=int, default=None, help="num-server-rounds")
    local.add_argument("--run-config", default="",
                       help="extra run config as 'k1=v1 k2=v2' (TOML values)")
    local.add_argument("--app", type=Path, default=None, help="Flower app folder")
    local.add_argument("--serve", action="store_true",
                       help="start, print how to connect, and run until Ctrl-C")
    local.add_argument("--timeout", type=float, default=1800.0, help="seconds for the run")
    local.set_defaults(func=cmd_local)


def cmd_certs(args: argparse.Namespace) -> int:
    from fedqhd.deploy.certs import make_credentials

    sans = split_sans(args.san)
    made = not (args.out / "superlink" / "server.pem").is_file()
    make_credentials(args.out, args.num_supernodes, sans, args.days, args.owner)
    if not made and sans:
        print(f"note: {args.out}/superlink/server.pem existed and was kept: --san applies "
              "to a new certificate only (delete the folder superlink/ to remake it)",
              file=sys.stderr)
    if args.owner is not None:
        for folder in args.chown:
            for path in [folder, *folder.rglob("*")]:
                os.chown(path, args.owner, args.owner)
    print(f"credentials for a SuperLink and {args.num_supernodes} SuperNodes in {args.out} "
          "(existing files kept)")
    return 0


def split_sans(values: list[str]) -> list[str]:
    """``--san a,b --san c`` -> ``[a, b, c]`` (one environment variable can carry them all
    in compose)."""
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def cmd_compose(args: argparse.Namespace) -> int:
    from fedqhd.deploy.compose import render_compose

    text = render_compose(args.num_supernodes)
    if str(args.out) == "-":
        sys.stdout.write(text)
    else:
        atomic_write(args.out, text)
        print(f"wrote {args.out} with {args.num_supernodes} SuperNodes")
    return 0


def _parse_run_config(text: str) -> dict[str, object]:
    """'k1=v1 k2="a b"' -> dict, values parsed as TOML (as ``flwr run --run-config``)."""
    import shlex
    import tomllib

    out: dict[str, object] = {}
    for item in shlex.split(text, posix=False):
        key, _, value = item.partition("=")
        out[key] = tomllib.loads(f"v = {value}")["v"]
    return out


def generate_shards(out: Path, num_partitions: int, env: str, episodes: int,
                    env_module: str = "", epsilon: tuple[float, float] = (0.8, 1.0),
                    cwd: Path | None = None) -> Path:
    """``fedqhd data generate`` into ``out`` (the compose ``data`` service's command), run in
    ``cwd`` (the app folder, where ``env_module`` is importable)."""
    out = out.resolve()
    if not (out / "shard-0.npz").exists():
        subprocess.run([sys.executable, "-m", "fedqhd.commands", "data", "generate", "--env", env,
                        "--env-module", env_module, "--epsilon-min", str(epsilon[0]),
                        "--epsilon-max", str(epsilon[1]),
                        "--num-partitions", str(num_partitions), "--episodes", str(episodes),
                        "--seed", "0", "--out", str(out)], check=True, cwd=cwd)
    return out


def format_round(row: dict[str, object], total: object = "?") -> str:
    """One progress line per round of a deployment run (from ``results.json``)."""
    parts = [f"round {row.get('round')}/{total}"]
    if isinstance(row.get("return-mean"), int | float):
        parts.append(f"return {row['return-mean']:.1f} +- {row.get('return-std', 0.0):.1f}")
    parts.append(f"replies ok {row.get('replies-ok', '?')} failed {row.get('replies-failed', '?')}")
    if isinstance(row.get("wall-time-s"), int | float):
        parts.append(f"{row['wall-time-s']:.1f}s")
    return " | ".join(parts)


def cmd_local(args: argparse.Namespace) -> int:
    from fedqhd.deploy.launcher import (
        CONNECTION,
        DeploymentError,
        LocalDeployment,
        interrupts_as_exceptions,
    )

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedqhd-deploy-"))
    workdir.mkdir(parents=True, exist_ok=True)
    run_config = _parse_run_config(args.run_config)
    if args.rounds is not None:
        run_config["num-server-rounds"] = args.rounds
    if args.env_module:
        run_config.setdefault("env-module", args.env_module)
    env_id = str(args.env or run_config.get("env-id", "CartPole-v1"))
    if args.shards is None:  # generated shards: the run is of their env
        run_config["env-id"] = env_id
    epsilon = (float(run_config.get("epsilon-min", 0.8)),  # type: ignore[arg-type]
               float(run_config.get("epsilon-max", 1.0)))  # type: ignore[arg-type]
    started = time.monotonic()
    with interrupts_as_exceptions():
        try:
            shards = args.shards or generate_shards(
                workdir / "shards", args.num_supernodes, env_id, args.episodes,
                args.env_module, epsilon, cwd=args.app)
            with LocalDeployment(workdir, args.num_supernodes, shards_dir=shards,
                                 app_dir=args.app) as dep:
                print(f"up in {time.monotonic() - started:.1f}s: SuperLink {dep.address} "
                      f"(TLS, SuperNode auth), {args.num_supernodes} SuperNodes; "
                      f"logs in {dep.logs}", flush=True)
                if args.serve:
                    print("connect with:\n"
                          f"  FLWR_HOME={dep.flwr_home} "
                          f"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 "
                          f"{Path(sys.executable).parent / 'flwr'} run {dep.app_dir} "
                          f"{CONNECTION} --stream\n"
                          f"results of such runs: {dep.workdir / 'serverapp' / 'outputs'} "
                          "(output-dir is relative to the ServerApp's folder)\n"
                          "Ctrl-C stops every process.", flush=True)
                    while True:  # a process that dies ends the deployment, loudly
                        dep.check_alive()
                        time.sleep(2)
                total = run_config.get("num-server-rounds", "?")
                results = dep.wait_run(
                    dep.submit(run_config), timeout_s=args.timeout,
                    on_round=lambda row: print(format_round(row, total), flush=True))
                final = json.loads(results.read_text())["final"]
                print(f"results: {results}\nfinal: {json.dumps(final)}\n"
                      f"total {time.monotonic() - started:.1f}s", flush=True)
        except KeyboardInterrupt:
            print("interrupted: every process stopped", file=sys.stderr)
            return 130
        except DeploymentError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
