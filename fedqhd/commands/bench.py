"""``fedqhd bench``: the bench (:mod:`fedqhd.studies.bench`), the FedQHD paper's table
(``--suite paper``, :mod:`fedqhd.studies.paper`), the scale suite (``--suite scale``,
:mod:`fedqhd.studies.scale`) and the paper's federation-gap ablations (``--suite
federation-gap``, :mod:`fedqhd.studies.federation_gap`): parse the arguments, run the
study, print its table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.commands.args import at_least, path_arg, seed_list, writable_folder
from fedqhd.config import ConfigError
from fedqhd.studies.bench import fqi_speed, run_bench, run_federated_only


def _print_table(summary: dict[str, Any]) -> None:
    print(f"\n{summary['env-id']}, {summary['clients']} clients, {summary['rounds']} rounds")
    print("| seed | pooled FQI | FedQHDAvg | FedQHDAnchor (het.) | lone (shared) | lone (het.) "
          "| uniform random | best constant action |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in summary["per-seed"]:
        ref = r["reference"]
        print(f"| {r['seed']} | {r['pooled']:.1f} | {r['fedqhd-avg']['return-mean']:.1f} | "
              f"{r['fedqhd-anchor']['return-mean']:.1f} | {r['lone-shared-mean']:.1f} | "
              f"{r['lone-heterogeneous-mean']:.1f} | {ref['random-mean']:.1f} | "
              f"{ref['best-constant-mean']:.1f} ({ref['best-constant-action']}) |")
    m = summary["mean"]
    print(f"| mean | {m['pooled']:.1f} | {m['fedqhd-avg']:.1f} | {m['fedqhd-anchor']:.1f} | "
          f"{m['lone-shared-mean']:.1f} | {m['lone-heterogeneous-mean']:.1f} | "
          f"{m['random']:.1f} | {m['best-constant']:.1f} |")
    print(f"FedQHDAvg / pooled = {m['avg-over-pooled']:.3f}; FedQHDAvg vs pooled FQI on the "
          f"pooled data states: Q error {m['avg-q-error-vs-pooled']:.3f} (relative), greedy "
          f"actions agree on {100 * m['avg-greedy-agreement']:.1f} %")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmarks in process: federated vs pooled vs lone clients, or a suite "
        "(--suite paper: the FedQHD paper's table)")
    p.add_argument("--env", default="CartPole-v1",
                   help="a registered env id (the four tasks, or one of --env-module's)")
    p.add_argument("--env-module", default="",
                   help="module(s) to import first, comma-separated: importing registers your "
                   "environments (passed on as run-config key env-module)")
    p.add_argument("--clients", type=at_least(1),
                   help="clients (default 10; --suite paper: 5)")
    p.add_argument("--seeds", type=seed_list, help="comma-separated, ranges too: 42-61 (default "
                   "0,1,2; --suite paper: 42,43,44)")
    p.add_argument("--rounds", type=at_least(1), help="rounds (default 30; --suite scale: 5)")
    p.add_argument("--out", type=path_arg,
                   help="output folder (default outputs/bench; --suite paper: outputs/paper)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override as for flwr run --run-config, e.g. --set "
                   "hd-dim=1000 --set \"partition='iid'\" (repeatable)")
    p.add_argument("--only", choices=["avg", "anchor"],
                   help="run only this federated strategy (no pooled or lone baselines)")
    p.add_argument("--speed", action="store_true",
                   help="instead: seconds per FQI sweep, factored once vs re-solved")
    p.add_argument("--dim", type=at_least(1), help="D for --speed and --suite scale "
                   "(default 2000)")
    suite = p.add_argument_group("the paper's table (--suite paper): online protocol, "
                                 "5 clients x 600 episodes, seeds 42,43,44 unless given")
    suite.add_argument("--suite", choices=["paper", "scale", "federation-gap"],
                       help="instead: the FedQHD paper's table (fedqhd.studies.paper), the "
                       "scale suite (fedqhd.studies.scale: in-process vs flwr run round time at "
                       "--clients, streamed-fit memory, FedQHDExact exactness, BLAS fraction), "
                       "or the paper's federation-gap ablations (fedqhd.studies.federation_gap: "
                       "compiled teacher vs oracle projection, vs D with m = 4D and vs m at "
                       "D = 512; default seeds 0,1,2, --clients 5)")
    suite.add_argument("--envs", help="comma-separated tasks (default: all four)")
    suite.add_argument("--settings", help="shared,heterogeneous (default: both)")
    suite.add_argument("--methods", help="comma-separated (default: "
                       "fedqhd,independent,truncate,fedavg-dqn,distill-dqn,pooled)")
    suite.add_argument("--episodes", type=at_least(1), help="episodes per client (default 600)")
    suite.add_argument("--resume", action="store_true",
                       help="--out holds a stopped suite's paper.json: keep its cells and run "
                       "only the missing ones")
    suite.add_argument("--jobs", type=at_least(1),
                       help="cells run at once, each in its own process with one BLAS thread "
                       "(the numbers of OMP_NUM_THREADS=1 runs; default 1)")
    suite.add_argument("--overwrite", action="store_true",
                       help="start over even where --out holds a paper.json with cells")
    suite.add_argument("--merge", metavar="PAPER_JSON", nargs="+", type=Path,
                       help="run nothing: join these suites' paper.json files (same protocol; "
                       "a cell in two files must have one result) into --out's table, "
                       "paper.json and curves")
    gap = p.add_argument_group("--suite federation-gap (default out: outputs/federation-gap)")
    gap.add_argument("--quick", action="store_true",
                     help="a small grid (D 32-256, m 32-512 at D = 128, seeds 0,1): seconds")
    scale = p.add_argument_group("--suite scale (default --clients 10 --rounds 5)")
    scale.add_argument("--no-flwr", action="store_true",
                       help="skip the flwr run (Ray) measurement")
    scale.add_argument("--transitions", type=at_least(1),
                       help="transitions of the streamed fit (at --dim; default 20000)")
    scale.add_argument("--app", type=path_arg,
                       help="the Flower app folder flwr run builds (default: .)")
    p.set_defaults(func=_main)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """:func:`run_config_overrides` as RunConfig fields (snake_case)."""
    return {k.replace("-", "_"): v for k, v in run_config_overrides(items).items()}


def run_config_overrides(items: list[str]) -> dict[str, Any]:
    """``--set`` values as Flower's ``--run-config`` reads them (TOML values: strings in
    quotes, ``true``/``false``), validated as run-config keys; returns those keys
    (kebab-case) and their values. A value that is not TOML is taken as a bare string
    (``--set partition=iid``)."""
    from click import ClickException
    from flwr.common.config import parse_config_args

    given: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not (sep and key.strip() and value.strip()):
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE")
        try:
            given.update(parse_config_args([item]))
        except ClickException:
            given[key.strip()] = value.strip()
    from fedqhd.learners import parse_run_config

    parsed = parse_run_config(given).to_run_config()
    return {k: parsed[k] for k in given}


def _paper_suite(args: argparse.Namespace) -> int:
    from fedqhd.studies import paper

    def pick(text: str | None, default: tuple[str, ...]) -> list[str]:
        return [v for v in text.split(",") if v] if text else list(default)

    envs = pick(args.envs, paper.ENVS)
    settings = pick(args.settings, paper.SETTINGS)
    methods = pick(args.methods, paper.METHODS)
    for name, values, valid in (("--envs", envs, paper.ENVS),
                                ("--settings", settings, paper.SETTINGS),
                                ("--methods", methods, paper.METHODS)):
        bad = [v for v in values if v not in valid]
        if bad:
            raise ConfigError(f"{name}: unknown {bad}; valid: {', '.join(valid)}")
    seeds = args.seeds or list(paper.SEEDS)
    clients = args.clients or 5
    out = args.out or Path("outputs/paper")
    try:
        if args.merge:
            if args.resume or args.overwrite:
                raise ValueError("--merge runs nothing: it takes no --resume or --overwrite")
            target = out / "paper.json"
            if target.exists() and target.resolve() not in [p.resolve() for p in args.merge]:
                raise FileExistsError(f"{target} exists; merge into another --out (or name "
                                      "it among the --merge files)")
            summary = paper.merge(args.merge)
            paper.write_outputs(summary, out)
        else:
            summary = paper.run_suite(envs, settings, methods, seeds, out,
                                      episodes=args.episodes or 600, clients=clients,
                                      resume=args.resume, overwrite=args.overwrite,
                                      jobs=args.jobs or 1)
    except (ValueError, FileExistsError) as exc:
        raise ConfigError(str(exc)) from None
    print(paper.markdown_table(summary))
    print(f"written {out / 'paper.json'}, {out / 'paper-table.md'} and curves-*.png")
    return 0


def _scale_suite(args: argparse.Namespace) -> int:
    from fedqhd.studies import scale

    out = args.out or Path("outputs/scale")
    app = args.app or Path(".")
    if not args.no_flwr and not (app / "pyproject.toml").is_file():
        raise ConfigError(f"--app {app}: no pyproject.toml (the Flower app flwr run builds); "
                         "run from the fedqhd checkout or pass --no-flwr")
    overrides = {"env-id": args.env,
                 **run_config_overrides(args.set)}
    seed = args.seeds[0] if args.seeds else 0
    if args.clients is not None and args.clients < 2:
        raise ConfigError("--clients: the scale suite needs >= 2 (a federation's round)")
    summary = scale.run_suite(args.clients or 10, args.rounds or 5, out,
                              flwr=not args.no_flwr, app_dir=app.resolve(),
                              run_config=overrides, transitions=args.transitions or 20_000,
                              dim=args.dim or 2000, seed=seed)
    print(scale.markdown(summary))
    print(f"written {out / 'scale.json'}")
    return 0


def _gap_suite(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tqdm import tqdm

    from fedqhd.studies import federation_gap as gap

    settings = gap.QUICK if args.quick else gap.GapSettings()
    overrides = {**parse_overrides(args.set), "env_id": args.env}
    settings = replace(settings, run_config=overrides)
    if args.seeds:
        settings = replace(settings, seeds=tuple(args.seeds))
    if args.clients:
        if args.clients < 2:
            raise ConfigError("--clients: the federation-gap suite needs >= 2 (a teacher and "
                             "the client that compiles it)")
        settings = replace(settings, clients=args.clients)
    out = args.out or Path("outputs/federation-gap")
    steps = len(settings.seeds) * len(settings.variants) * (len(settings.dims)
                                                            + len(settings.anchor_counts))
    with tqdm(total=steps, desc="federation gap", unit="point") as bar:
        def step(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update()

        summary = gap.run_suite(settings, out, progress=step)
    print(gap.markdown(summary))
    print(f"written {out / 'federation-gap.json'}, .csv, .md and .png "
          f"({summary['wall-s']:.0f} s)")
    return 0


#: flags only one part of ``fedqhd bench`` reads (None: the default bench), by
#: attribute; any other part refuses them rather than run without them
_SUITE_FLAGS: dict[str | None, tuple[str, ...]] = {
    "paper": ("envs", "settings", "methods", "episodes", "resume", "jobs", "overwrite",
              "merge"),
    "federation-gap": ("quick",),
    "scale": ("no_flwr", "transitions", "app"),
    None: ("only", "speed"),
}


def check_flags_fit_the_suite(args: argparse.Namespace) -> None:
    """Refuse a flag of another suite (``--merge`` without ``--suite paper`` would
    otherwise start the default bench), naming it and the suite that reads it."""
    for suite, names in _SUITE_FLAGS.items():
        if suite == args.suite:
            continue
        given = [n for n in names if getattr(args, n) not in (None, False, [])]
        if given:
            flags = ", ".join("--" + n.replace("_", "-") for n in given)
            where = f"--suite {suite}" if suite else "the default bench (no --suite)"
            here = f"--suite {args.suite}" if args.suite else "the default bench"
            raise ConfigError(f"{flags}: only for {where}, not {here}")
    if args.dim is not None and not (args.suite == "scale" or args.suite is None and args.speed):
        raise ConfigError("--dim: only for --speed or --suite scale")
    if args.rounds is not None and args.suite in ("paper", "federation-gap"):
        raise ConfigError(f"--rounds: not for --suite {args.suite} (the paper suite counts "
                          "--episodes; the federation gap has no rounds)")


def _main(args: argparse.Namespace) -> int:
    if args.env_module:
        args.set = [f"env-module='{args.env_module}'", *args.set]
    # the module first (it registers the env), then the env id: a ConfigError is one line
    # and exit code 2 (fedqhd.commands.main), a failed run exit code 1
    parse_overrides([*args.set, f"env-id='{args.env}'"])
    check_flags_fit_the_suite(args)
    if args.out is not None:
        writable_folder("--out", args.out)
    if args.suite == "paper":
        return _paper_suite(args)
    if args.suite == "scale":
        return _scale_suite(args)
    if args.suite == "federation-gap":
        return _gap_suite(args)
    args.rounds = args.rounds or 30
    args.clients = args.clients or 10
    seeds = args.seeds or [0, 1, 2]
    args.out = args.out or Path("outputs/bench")
    if args.speed:
        result = fqi_speed(args.env, args.clients, args.dim or 2000, sweeps=10)
        print(json.dumps(result, indent=2))
        return 0
    overrides = parse_overrides(args.set)
    if args.only:
        summary = run_federated_only(args.env, args.clients, seeds, args.rounds, args.out,
                                     overrides, args.only)
        for row in summary["per-seed"]:
            close = (f"; vs pooled FQI: Q error {row['q-error-vs-pooled']:.3f}, greedy "
                     f"agreement {100 * row['greedy-agreement']:.1f} %"
                     if "greedy-agreement" in row else "")
            print(f"seed {row['seed']}: final return {row['return-mean']:.1f} "
                  f"(best {row['best-return-mean']:.1f}){close} {row['run-dir']}")
        rows = summary["per-seed"]
        line = f"mean final return {np.mean([r['return-mean'] for r in rows]):.1f}"
        if "greedy-agreement" in rows[0]:
            agree = 100 * np.mean([r["greedy-agreement"] for r in rows])
            line += (f"; Q error {np.mean([r['q-error-vs-pooled'] for r in rows]):.3f}, "
                     f"greedy agreement {agree:.2f} %")
        print(line)
        return 0
    summary = run_bench(args.env, args.clients, seeds, args.rounds, args.out, overrides)
    _print_table(summary)
    print(f"written {args.out / 'bench.json'}")
    return 0
