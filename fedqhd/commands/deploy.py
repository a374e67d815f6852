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

from fedqhd.commands.args import (
    at_least,
    at_most,
    list_of,
    number_in,
    path_arg,
    writable_file,
    writable_folder,
)
from fedqhd.files import atomic_write

__all__ = ["register"]

MAX_DAYS = 36_500  #: a century: ``--days`` beyond it is a typo (dates end at year 9999)
MAX_UID = 2**32 - 2  #: the largest uid/gid (``2**32 - 1`` is chown's "leave unchanged")
#: most SuperNodes a deployment takes: the run config's bound on min-nodes (a larger -n is a
#: typo that would write keys or start processes until stopped)
MAX_SUPERNODES = 100_000


def san(text: str) -> str:
    """An argparse type: an IP address or DNS name for the SuperLink's certificate (the
    check of :func:`fedqhd.deploy.certs.check_san`, imported only when used)."""
    from fedqhd.deploy.certs import check_san

    try:
        return check_san(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``deploy`` command (``certs``, ``compose``, ``local``) to ``fedqhd``."""
    deploy = subparsers.add_parser(
        "deploy", help="deployment: credentials, docker-compose.yml, local multi-process run")
    sub = deploy.add_subparsers(dest="deploy_command", required=True)

    certs = sub.add_parser("certs", help="CA + SuperLink TLS cert, SuperNode keys, secrets")
    certs.add_argument("--out", required=True, type=path_arg)
    certs.add_argument("-n", "--num-supernodes",
                       type=at_most(MAX_SUPERNODES, at_least(1)), default=3,
                       help="SuperNodes 1..N get keys (default 3); those of SuperNodes above "
                            "N, left by an earlier run, are removed")
    certs.add_argument("--san", action="append", type=list_of(san), default=[],
                       help="extra host names or IPs of the SuperLink, comma-separated "
                            "(repeatable; compose: SUPERLINK_HOST takes the same list)")
    certs.add_argument("--days", type=at_most(MAX_DAYS, at_least(1)), default=365,
                       help="validity of a new CA and SuperLink certificate (default 365)")
    certs.add_argument("--owner", type=at_most(MAX_UID, at_least(0)), default=None,
                       help="chown everything to this uid, and the gid of the same number "
                       "(compose: Flower's app user, 49999)")
    certs.add_argument("--chown", action="append", type=Path, default=[],
                       help="with --owner: also chown this folder and what is in it "
                            "(compose: volumes the services write to)")
    certs.set_defaults(func=cmd_certs)

    compose = sub.add_parser("compose", help="write docker-compose.yml for N SuperNodes")
    compose.add_argument("-n", "--num-supernodes",
                         type=at_most(MAX_SUPERNODES, at_least(1)), default=3)
    compose.add_argument("--out", type=path_arg, default=Path("docker-compose.yml"),
                         help="output file ('-' for stdout)")
    compose.add_argument("--force", action="store_true",
                         help="replace an --out file that is not this command's output "
                              "(edited by hand, or another fedqhd version's)")
    compose.set_defaults(func=cmd_compose)

    local = sub.add_parser(
        "local", help="SuperLink + SuperExecs + SuperNodes as local processes, then flwr run")
    local.add_argument("-n", "--num-supernodes",
                       type=at_most(MAX_SUPERNODES, at_least(1)), default=3)
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
    local.add_argument("--episodes", type=at_least(1), default=5,
                       help="episodes per generated shard")
    local.add_argument("--rounds", type=at_least(1), default=None, help="num-server-rounds")
    local.add_argument("--run-config", default="",
                       help="extra run config as 'k1=v1 k2=v2' (TOML values)")
    local.add_argument("--app", type=Path, default=None, help="Flower app folder")
    local.add_argument("--serve", action="store_true",
                       help="start, print how to connect, and run until Ctrl-C")
    local.add_argument("--timeout", type=number_in(0, None, low_open=True), default=1800.0,
                       help="seconds for the run")
    local.set_defaults(func=cmd_local)


def cmd_certs(args: argparse.Namespace) -> int:
    from fedqhd.deploy.certs import make_credentials, stale_node_files

    out = writable_folder("--out", args.out)
    check_owner(args.owner, args.chown)
    sans = [name for names in args.san for name in names]
    made = not (out / "superlink" / "server.pem").is_file()
    stale = stale_node_files(out, args.num_supernodes)
    make_credentials(out, args.num_supernodes, sans, args.days, args.owner)
    if not made and sans:
        print(f"note: {out}/superlink/server.pem existed and was kept: --san applies "
              "to a new certificate only (delete the folder superlink/ to remake it)",
              file=sys.stderr)
    if stale:
        print(f"note: removed the credentials of SuperNodes above {args.num_supernodes} "
              f"({', '.join(str(p.relative_to(out)) for p in stale)}); a SuperLink that "
              "registered their keys accepts them until `flwr supernode unregister`",
              file=sys.stderr)
    if args.owner is not None:
        for folder in args.chown:
            os.chown(folder, args.owner, args.owner)
            for path in folder.rglob("*"):  # a link a service planted: not its target
                os.chown(path, args.owner, args.owner, follow_symlinks=False)
    print(f"credentials for a SuperLink and {args.num_supernodes} SuperNodes in {out} "
          "(existing ones kept)")
    return 0


def check_owner(owner: int | None, chown: list[Path]) -> None:
    """Refuse, before a credential is written, ``--owner``/``--chown`` that would fail
    (or be ignored) only after every file was written or chowned: a ``--chown`` without
    ``--owner``, a ``--chown`` that is no folder, or another user's uid when not root."""
    from fedqhd.config import ConfigError

    if chown and owner is None:
        raise ConfigError(f"--chown {chown[0]}: needs --owner (the uid to give it to)")
    for folder in chown:
        if not folder.is_dir():
            why = "is a file, not a folder" if folder.exists() else "no such folder"
            raise ConfigError(f"--chown {folder}: {why}")
    if owner is not None and os.geteuid() not in (0, owner):
        raise ConfigError(f"--owner {owner}: only root may give files to another user "
                          f"(this is uid {os.geteuid()})")


def cmd_compose(args: argparse.Namespace) -> int:
    from fedqhd.config import ConfigError
    from fedqhd.deploy.compose import is_generated, render_compose

    text = render_compose(args.num_supernodes)
    if str(args.out) == "-":
        sys.stdout.write(text)
        return 0
    out = writable_file("--out", args.out)
    if out.is_file() and not args.force:
        old = out.read_bytes()
        if old != text.encode() and not is_generated(old):
            raise ConfigError(f"--out {out}: exists and is not what `fedqhd deploy compose` "
                              "writes (edited by hand, or another version's output); "
                              "--force replaces it")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, text)
    print(f"wrote {out} with {args.num_supernodes} SuperNodes")
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
