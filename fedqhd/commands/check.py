"""``fedqhd check``: the run config ``flwr run`` would submit, checked before it is.

Why: Flower 1.42 refuses a ``--run-config`` key that the app's pyproject does not list
with ``[code: 15] Invalid run configuration.``, and names the key only in the
SuperLink's log; a bad value reaches the ServerApp, whose one-line error is the run's
first log line. This command fuses the app's ``[tool.flwr.app.config]`` with the
``--run-config`` overrides as Flower does, names a key Flower would refuse (with "did
you mean"), then parses the result as fedqhd's ServerApp will (importing
``env-module`` from the app folder), and with ``--federation-config
"num-supernodes=N"`` looks for a ``data-dir`` shard per partition.
Exit code 0: the run config is fine; 2: a config error, one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

from fedqhd.config import ConfigError, did_you_mean


def app_config(app: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]``, flattened as Flower flattens it."""
    from flwr.common.config import flatten_dict

    path = app / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the app's pyproject ({exc})") from None
    return flatten_dict(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


def overrides(items: list[str]) -> dict[str, Any]:
    """``--run-config`` values as Flower parses them (``k=v`` pairs or one ``.toml``)."""
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args(items or None)
    except Exception as exc:  # noqa: BLE001 (click, TOML and value errors alike)
        raise ConfigError(f"--run-config: {exc}") from None


def fused_config(app: Path, items: list[str]) -> dict[str, Any]:
    """The run config Flower would give the apps: the pyproject's keys, overridden.
    A key the pyproject does not list is refused here, named, as Flower refuses it."""
    from fedqhd.config import renamed_key_hint, run_config_fields

    listed = app_config(app)
    given = overrides(items)
    ours = {f.name.replace("_", "-") for f in run_config_fields()}
    for key in given:
        if key in listed:
            continue
        hint = ("; fedqhd knows it: add it to [tool.flwr.app.config] to set it with "
                "--run-config" if key in ours else
                renamed_key_hint(key) or did_you_mean(key, listed))
        raise ConfigError(f"--run-config key '{key}' is not in {app / 'pyproject.toml'}'s "
                          f"[tool.flwr.app.config]{hint} (flwr run would answer only "
                          "'[code: 15] Invalid run configuration.')")
    return {**listed, **given}


def num_supernodes(text: str | None) -> int | None:
    """``num-supernodes`` of a ``--federation-config`` string, if it has one."""
    if not text:
        return None
    for item in text.split():
        key, _, value = item.partition("=")
        if key == "num-supernodes":
            try:
                return int(value)
            except ValueError:
                raise ConfigError(f"--federation-config: num-supernodes={value!r} is not "
                                  "an integer") from None
    return None


def check(app: Path, items: list[str], federation: str | None = None) -> str:
    """Check the run config; returns a one-line summary, raises :class:`ConfigError`."""
    from fedqhd.learners import parse_run_config
    from fedqhd.server.preflight import check_shards

    app = app.resolve()
    config = fused_config(app, items)
    sys.path.insert(0, str(app))  # Flower puts the app folder on sys.path: env-module
    try:
        cfg = parse_run_config(config)
    finally:
        sys.path.remove(str(app))
    nodes = num_supernodes(federation)
    if cfg.data_dir and cfg.protocol == "offline" and cfg.learner == "fqi" and nodes:
        check_shards(cfg.data_dir, nodes, cfg.env_id)
    return (f"run config ok: {len(config)} keys, env-id {cfg.env_id!r}, learner "
            f"{cfg.learner!r}, {cfg.num_server_rounds} rounds")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="check a run config before flwr run submits it (exit 2 on an error)")
    p.add_argument("app", nargs="?", type=Path, default=Path("."),
                   help="the Flower app folder (default: .)")
    p.add_argument("--run-config", action="append", default=[], metavar="CONFIG",
                   help="as for flwr run: \"key=value key2=value2\" or a .toml file")
    p.add_argument("--federation-config", metavar="CONFIG",
                   help="as for flwr run; with num-supernodes=N, data-dir is looked into")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    print(check(args.app, args.run_config, args.federation_config))
    return 0
