"""``fedqhd check``: the run config ``flwr run`` would submit, checked before it is.

Why: Flower 1.42 refuses a ``--run-config`` key that the app's pyproject does not list
with ``[code: 15] Invalid run configuration.``, and names the key only in the
SuperLink's log; a bad value reaches the ServerApp, whose one-line error is the run's
first log line. This command fuses the app's ``[tool.flwr.app.config]`` with the
``--run-config`` overrides as Flower does, names a key Flower would refuse (with "did
you mean"), then parses the result as fedqhd's ServerApp will (importing
``env-module`` from the app folder), and with ``--federation-config
"num-supernodes=N"`` loads the ``data-dir`` shard of each partition as its client will.
A token that is not ``key=value`` (Flower drops it silently) and a federation-config
key or value Flower's simulation would refuse are refused too.
Exit code 0: the run config is fine; 2: a config error, one line on stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from fedqhd.config import ConfigError, RunConfig, did_you_mean


def app_config(app: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]``, flattened as Flower flattens it."""
    from flwr.common.config import flatten_dict

    path = app / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the app's pyproject ({exc})") from None
    return flatten_dict(data.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


#: a ``key=value`` pair as :func:`flwr.common.config.parse_config_args` finds it (the
#: rest of the string it drops without a word)
_PAIR = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")


def parse_pairs(flag: str, items: list[str]) -> dict[str, Any]:
    """``flag``'s values as Flower parses them (``k=v`` pairs or one ``.toml``), and a
    token that is no ``k=v`` pair refused: Flower would drop it, so ``num-server-rounds``
    without ``=20`` would run with the default."""
    from flwr.common.config import parse_config_args

    for item in items:  # flwr refuses a key twice in one string, naming no key
        keys = [] if item.endswith(".toml") else [k for k, _ in _PAIR.findall(item)]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ConfigError(f"{flag} {item!r}: key {twice[0]!r} is given twice (flwr run "
                              "refuses it; give each key once)")
    try:
        parsed = parse_config_args(items or None)
    except Exception as exc:  # noqa: BLE001 (click, TOML and value errors alike)
        raise ConfigError(f"{flag}: {exc}") from None
    for item in items:
        stray = [] if item.endswith(".toml") else _PAIR.sub(" ", item).split()
        if stray:
            raise ConfigError(f"{flag} {item!r}: {stray[0]!r} is not a key=value pair "
                              "(flwr run would drop it without a word)")
    return parsed


def fused_config(app: Path, items: list[str]) -> dict[str, Any]:
    """The run config Flower would give the apps: the pyproject's keys, overridden.
    A key the pyproject does not list is refused here, named, as Flower refuses it."""
    from fedqhd.config import renamed_key_hint, run_config_fields

    listed = app_config(app)
    given = parse_pairs("--run-config", items)
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


def federation(text: str | None) -> dict[str, Any]:
    """A ``--federation-config`` as Flower's simulation takes it (keys with ``-``), a key
    or value it would refuse refused here, named, and ``num-supernodes`` below 1 too
    (a simulation without SuperNodes never runs a round)."""
    from flwr.proto.federation_config_pb2 import SimulationConfig
    from flwr.supercore.utils import simulation_config_from_json

    given = {k.replace("_", "-"): v for k, v in parse_pairs(
        "--federation-config", [text] if text else []).items()}
    known = [field.name.replace("_", "-") for field in SimulationConfig.DESCRIPTOR.fields]
    for key, value in given.items():
        if key not in known:
            raise ConfigError(f"--federation-config key {key!r} is not a setting of Flower's "
                              f"simulation{did_you_mean(key.removeprefix('options.'), known)} "
                              f"(it takes {', '.join(known)})")
        if key == "num-supernodes" and isinstance(value, int) and value < 1:
            raise ConfigError(f"--federation-config num-supernodes={value}: must be >= 1")
        try:
            simulation_config_from_json({key.replace("-", "_"): value})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"--federation-config {key}={value!r}: {exc}") from None
    return given


def check_data_dir(cfg: RunConfig, num_partitions: int) -> None:
    """Load each partition's shard from ``data-dir`` as its client will (a simulation
    node's default limits), so a corrupt shard fails here, not in round 1; then refuse a
    folder that ``fedqhd data inspect`` finds inconsistent
    (:func:`~fedqhd.data.folder.folder_problems`: the first problem and how many more).
    On a terminal a progress bar counts the shards."""
    from tqdm import tqdm

    from fedqhd.data import ShardError, client_shard, load_shard, shard_filename
    from fedqhd.data.folder import folder_problems, shard_files
    from fedqhd.server.preflight import check_shards

    key = f"run-config key 'data-dir' = {cfg.data_dir!r}"
    check_shards(cfg.data_dir, num_partitions, cfg.env_id)
    folder = Path(cfg.data_dir).expanduser()
    metadata: dict[Path, dict[str, Any] | None] = {}
    transitions: dict[Path, int] = {}
    # a bar on a terminal only (tqdm's disable=None): a log stays clean
    for i in tqdm(range(num_partitions), desc="loading data-dir shards", unit="shard",
                  disable=None, leave=False):
        try:
            shard = client_shard(cfg.env_id, cfg.partition, i, num_partitions,
                                 cfg.episodes_per_client, cfg.seed, data_dir=cfg.data_dir)
        except ShardError as exc:
            raise ConfigError(f"{key}: {exc}") from None
        path = folder / shard_filename(i)
        metadata[path], transitions[path] = shard.metadata, shard.n_transitions
    for path in shard_files(folder):  # the rest of the set, as inspect reads it
        if path not in metadata:
            try:
                shard = load_shard(path)
            except ShardError:
                metadata[path] = None  # present, records nothing: as inspect counts it
                continue
            metadata[path], transitions[path] = shard.metadata, shard.n_transitions
    in_order = {path: metadata[path] for path in shard_files(folder)}  # as inspect lists
    problems = folder_problems(folder, in_order, transitions)
    if problems:
        more = f" (and {len(problems) - 1} more problem(s): fedqhd data inspect " \
               f"{cfg.data_dir})" if len(problems) > 1 else ""
        raise ConfigError(f"{key}: {problems[0]}{more}")


def check(app: Path, items: list[str], federation_config: str | None = None) -> str:
    """Check the run config; returns a one-line summary, raises :class:`ConfigError`."""
    from fedqhd.learners import parse_run_config

    app = app.resolve()
    nodes = federation(federation_config).get("num-supernodes")
    config = fused_config(app, items)
    sys.path.insert(0, str(app))  # Flower puts the app folder on sys.path: env-module
    try:
        cfg = parse_run_config(config)
    finally:
        sys.path.remove(str(app))
    data = ""
    if cfg.data_dir and cfg.protocol == "offline" and cfg.learner == "fqi":
        if nodes:
            check_data_dir(cfg, nodes)
            data = f", data-dir holds {nodes} valid shards"
        else:
            data = (", data-dir not checked (it is looked into with --federation-config "
                    "\"num-supernodes=N\")")
    learner = repr(cfg.learner)
    if cfg.learner_key == "fqi-online":
        learner += f" (update {cfg.online.update!r})"
    return (f"run config ok: {len(config)} keys, env-id {cfg.env_id!r}, learner {learner}, "
            f"strategy {cfg.resolved_strategy!r}, {cfg.num_server_rounds} rounds{data}")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "check", help="check a run config before flwr run submits it (exit 2 on an error)")
    p.add_argument("app", nargs="?", type=Path, default=Path("."),
                   help="the Flower app folder (default: .)")
    p.add_argument("--run-config", action="append", default=[], metavar="CONFIG",
                   help="as for flwr run: \"key=value key2=value2\" or a .toml file")
    p.add_argument("--federation-config", metavar="CONFIG",
                   help="as for flwr run (a simulation's settings); with num-supernodes=N, "
                        "the data-dir shard of each partition is loaded as its client will")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    print(check(args.app, args.run_config, args.federation_config))
    return 0
