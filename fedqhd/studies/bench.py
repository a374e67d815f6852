"""``fedqhd bench``: federated vs pooled vs lone learners, measured the same way.

For each seed it trains, on the same client shards and with the same number of
FQI sweeps, (1) ridge FQI on all pooled data with the shared encoder, (2) every
client alone (shared encoder, and its own heterogeneous encoder), (3) FedQHDAvg
with the shared encoder and (4) FedQHDAnchor with heterogeneous encoders, and
evaluates each greedy policy on the same evaluation episodes. The federated runs
use the real ServerApp logic and ClientApp in process (no Ray), so the numbers
are those of ``flwr run`` without the transport.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.config import RunConfig


def client_shards(cfg: RunConfig, n_clients: int) -> list[Any]:
    """The shards the run's ``n_clients`` clients would generate (cached on disk)."""
    from fedqhd.data import client_shard

    return [client_shard(cfg.env_id, cfg.partition, i, n_clients, cfg.episodes_per_client,
                         cfg.seed, epsilon_min=cfg.epsilon_min, epsilon_max=cfg.epsilon_max)
            for i in range(n_clients)]


def _fit(cfg: RunConfig, shard: Any, encoder: Any) -> Any:
    """Plain ridge FQI (full ridge, no proximal term) for as many sweeps as the federation."""
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import FQILearner

    learner = FQILearner(shard, encoder, get_spec(cfg.env_id).n_actions, cfg.gamma, cfg.ridge,
                         proximal=0.0)
    learner.train(cfg.num_server_rounds * cfg.local_iterations, start=learner.readout)
    return learner


def greedy_return(cfg: RunConfig, learner: Any) -> float:
    """Mean greedy return of a learner on the server's fixed evaluation episodes."""
    from fedqhd.learners.fqi import greedy_return as returns

    return float(returns(cfg, learner.encoder, learner.readout).mean())


def pooled_reference(cfg: RunConfig, shards: list[Any]) -> tuple[Any, np.ndarray]:
    """Ridge FQI on all clients' pooled shards with the shared encoder, and the pooled
    data states (where :func:`fidelity` compares)."""
    from fedqhd.data import pooled
    from fedqhd.learners.fqi import shared_encoder

    data = pooled(shards)
    return _fit(cfg, data, shared_encoder(cfg)), data.observations


def fidelity(reference: Any, states: np.ndarray, readout: np.ndarray) -> dict[str, float]:
    """How close a shared-encoder readout is to the pooled reference on the data states:
    relative error of the Q-values and the share of states with the same greedy action."""
    pooled_q = reference.q_values(states)
    q = reference.encoder.encode(states) @ readout
    return {"q-error-vs-pooled": float(np.linalg.norm(q - pooled_q) / np.linalg.norm(pooled_q)),
            "greedy-agreement": float(np.mean(q.argmax(1) == pooled_q.argmax(1)))}


def _lone(cfg: RunConfig, shards: list[Any]) -> dict[str, Any]:
    from fedqhd.learners.fqi import client_encoder

    hetero = cfg.replace(encoder="heterogeneous")
    lone_shared = [greedy_return(cfg, _fit(cfg, s, client_encoder(cfg.replace(
        encoder="shared"), i))) for i, s in enumerate(shards)]
    lone_hetero = [greedy_return(cfg, _fit(cfg, s, client_encoder(hetero, i)))
                   for i, s in enumerate(shards)]
    return {"lone-shared-mean": float(np.mean(lone_shared)),
            "lone-heterogeneous-mean": float(np.mean(lone_hetero)),
            "transitions": int(sum(s.n_transitions for s in shards))}


def _final_readout(run: dict[str, Any]) -> np.ndarray:
    return np.load(Path(run["run-dir"]) / "final_model.npz")["readout"]


def _federated(cfg: RunConfig, n_clients: int) -> dict[str, Any]:
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    final, out_dir = run_federation(grid, cfg)
    return {"return-mean": final["return-mean"], "best-return-mean": final["best-return-mean"],
            "run-dir": str(out_dir)}


def run_federated_only(env_id: str, n_clients: int, seeds: list[int], rounds: int, out: Path,
                       overrides: dict[str, Any], strategy: str) -> dict[str, Any]:
    """Only one federated strategy per seed (for sweeps of its settings)."""
    from flwr.common.logger import FLOWER_LOGGER
    from tqdm import tqdm

    FLOWER_LOGGER.setLevel(logging.WARNING)
    encoder = "shared" if strategy == "avg" else "heterogeneous"
    rows = []
    for seed in tqdm(seeds, desc=f"{strategy} {env_id}", unit="seed"):
        cfg = RunConfig(env_id=env_id, seed=seed, num_server_rounds=rounds,
                        output_dir=str(out / "runs"), **{**overrides, "encoder": encoder})
        row = {"seed": seed, **_federated(cfg, n_clients)}
        if strategy == "avg":  # the pooled reference's Q (no rollouts: cheap)
            row.update(fidelity(*pooled_reference(cfg, client_shards(cfg, n_clients)),
                                _final_readout(row)))
        rows.append(row)
    summary = {"env-id": env_id, "clients": n_clients, "rounds": rounds, "strategy": strategy,
               "config": cfg.to_run_config(), "per-seed": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench-{strategy}.json").write_text(json.dumps(summary, indent=2))
    return summary


def run_bench(env_id: str, n_clients: int, seeds: list[int], rounds: int,
              out: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    from flwr.common.logger import FLOWER_LOGGER
    from tqdm import tqdm

    FLOWER_LOGGER.setLevel(logging.WARNING)
    rows = []
    for seed in tqdm(seeds, desc=f"bench {env_id}", unit="seed"):
        base = RunConfig(env_id=env_id, seed=seed, num_server_rounds=rounds,
                         output_dir=str(out / "runs"), **overrides)
        t0 = time.time()
        shards = client_shards(base, n_clients)
        reference, states = pooled_reference(base, shards)
        row: dict[str, Any] = {"seed": seed, "pooled": greedy_return(base, reference),
                               **_lone(base, shards)}
        row["fedqhd-avg"] = _federated(base.replace(encoder="shared"), n_clients)
        row["fedqhd-avg"].update(fidelity(reference, states, _final_readout(row["fedqhd-avg"])))
        row["fedqhd-anchor"] = _federated(base.replace(encoder="heterogeneous"), n_clients)
        row["wall-time-s"] = round(time.time() - t0, 1)
        rows.append(row)
    summary: dict[str, Any] = {
        "env-id": env_id, "clients": n_clients, "rounds": rounds, "seeds": seeds,
        "config": RunConfig(env_id=env_id, num_server_rounds=rounds, **overrides).to_run_config(),
        "per-seed": rows,
        "mean": {
            "pooled": float(np.mean([r["pooled"] for r in rows])),
            "fedqhd-avg": float(np.mean([r["fedqhd-avg"]["return-mean"] for r in rows])),
            "fedqhd-anchor": float(np.mean([r["fedqhd-anchor"]["return-mean"] for r in rows])),
            "lone-shared-mean": float(np.mean([r["lone-shared-mean"] for r in rows])),
            "lone-heterogeneous-mean": float(np.mean([r["lone-heterogeneous-mean"]
                                                      for r in rows])),
            "avg-q-error-vs-pooled": float(np.mean([r["fedqhd-avg"]["q-error-vs-pooled"]
                                                    for r in rows])),
            "avg-greedy-agreement": float(np.mean([r["fedqhd-avg"]["greedy-agreement"]
                                                   for r in rows])),
        },
    }
    summary["mean"]["avg-over-pooled"] = summary["mean"]["fedqhd-avg"] / summary["mean"]["pooled"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(summary, indent=2))
    return summary


def _print_table(summary: dict[str, Any]) -> None:
    print(f"\n{summary['env-id']}, {summary['clients']} clients, {summary['rounds']} rounds")
    print("| seed | pooled FQI | FedQHDAvg | FedQHDAnchor (het.) | lone (shared) | lone (het.) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in summary["per-seed"]:
        print(f"| {r['seed']} | {r['pooled']:.1f} | {r['fedqhd-avg']['return-mean']:.1f} | "
              f"{r['fedqhd-anchor']['return-mean']:.1f} | {r['lone-shared-mean']:.1f} | "
              f"{r['lone-heterogeneous-mean']:.1f} |")
    m = summary["mean"]
    print(f"| mean | {m['pooled']:.1f} | {m['fedqhd-avg']:.1f} | {m['fedqhd-anchor']:.1f} | "
          f"{m['lone-shared-mean']:.1f} | {m['lone-heterogeneous-mean']:.1f} |")
    print(f"FedQHDAvg / pooled = {m['avg-over-pooled']:.3f}; FedQHDAvg vs pooled FQI on the "
          f"pooled data states: Q error {m['avg-q-error-vs-pooled']:.3f} (relative), greedy "
          f"actions agree on {100 * m['avg-greedy-agreement']:.1f} %")


def fqi_speed(env_id: str, n_clients: int, dim: int, sweeps: int, seed: int = 0) -> dict[str, Any]:
    """Seconds per FQI sweep on the pooled shards: factored once (what fedqhd does) vs
    solving every action's regularised normal equations afresh in every sweep."""
    from fedqhd.data import client_shard, pooled
    from fedqhd.encoders import shared_encoder_params
    from fedqhd.envs import get_spec
    from fedqhd.readout import RidgeFQI

    spec = get_spec(env_id)
    data = pooled([client_shard(env_id, "behaviour-skew", i, n_clients, 5, seed)
                   for i in range(n_clients)])
    enc = shared_encoder_params(seed, dim, 1.0).build(spec.obs_bound)
    phi, nphi = enc.encode(data.observations), enc.encode(data.next_observations)
    t0 = time.perf_counter()
    fqi = RidgeFQI(phi, data.actions, data.rewards, nphi, data.terminated, spec.n_actions,
                   ridge=0.1)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    fqi.fit(sweeps)
    factored = (time.perf_counter() - t0) / sweeps
    readout = np.zeros((dim, spec.n_actions))
    t0 = time.perf_counter()
    for _ in range(sweeps):
        y = fqi.targets(readout)
        for a in range(spec.n_actions):
            rows = data.actions == a
            gram = phi[rows].T @ phi[rows] + 0.1 * np.eye(dim)
            readout[:, a] = np.linalg.solve(gram, phi[rows].T @ y[rows])
    naive = (time.perf_counter() - t0) / sweeps
    return {"env-id": env_id, "transitions": data.n_transitions, "D": dim,
            "setup-s": setup, "factored-sweep-s": factored, "naive-sweep-s": naive,
            "speedup": naive / factored,
            "max-readout-difference": float(np.abs(readout - fqi.readout_).max())}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bench", help="federated vs pooled vs lone FQI (in process)")
    p.add_argument("--env", default="CartPole-v1",
                   help="a registered env id (the four tasks, or one of --env-module's)")
    p.add_argument("--env-module", default="",
                   help="module(s) to import first, comma-separated: importing registers your "
                   "environments (passed on as run-config key env-module)")
    p.add_argument("--clients", type=int, help="clients (default 10; --suite paper: 5)")
    p.add_argument("--seeds", help="comma-separated (default 0,1,2; --suite paper: 42,43,44; "
                   "--suite paper also takes ranges: 42-61)")
    p.add_argument("--rounds", type=int, help="rounds (default 30; --suite scale: 5)")
    p.add_argument("--out", type=Path,
                   help="output folder (default outputs/bench; --suite paper: outputs/paper)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="run-config override as for flwr run --run-config, e.g. --set "
                   "hd-dim=1000 --set \"partition='iid'\" (repeatable)")
    p.add_argument("--only", choices=["avg", "anchor"],
                   help="run only this federated strategy (no pooled or lone baselines)")
    p.add_argument("--speed", action="store_true",
                   help="instead: seconds per FQI sweep, factored once vs re-solved")
    p.add_argument("--dim", type=int, default=2000, help="D for --speed")
    suite = p.add_argument_group("the paper's table (--suite paper): online protocol, "
                                 "5 clients x 600 episodes, seeds 42,43,44 unless given")
    suite.add_argument("--suite", choices=["paper", "scale"],
                       help="instead: the FedQHD paper's table (fedqhd.studies.paper), or the "
                       "scale suite (fedqhd.studies.scale: in-process vs flwr run round time at "
                       "--clients, streamed-fit memory, FedQHDExact exactness, BLAS fraction)")
    suite.add_argument("--envs", help="comma-separated tasks (default: all four)")
    suite.add_argument("--settings", help="shared,heterogeneous (default: both)")
    suite.add_argument("--methods", help="comma-separated (default: "
                       "fedqhd,independent,truncate-avg,fedavg-dqn,distill-dqn,oracle)")
    suite.add_argument("--episodes", type=int, default=600, help="episodes per client")
    suite.add_argument("--resume", action="store_true",
                       help="--out holds a stopped suite's paper.json: keep its cells and run "
                       "only the missing ones")
    suite.add_argument("--jobs", type=int, default=1,
                       help="cells run at once, each in its own process with one BLAS thread "
                       "(the numbers of OMP_NUM_THREADS=1 runs; default 1)")
    suite.add_argument("--overwrite", action="store_true",
                       help="start over even where --out holds a paper.json with cells")
    suite.add_argument("--merge", metavar="PAPER_JSON", nargs="+", type=Path,
                       help="run nothing: join these suites' paper.json files (same protocol; "
                       "a cell in two files must have one result) into --out's table, "
                       "paper.json and curves")
    scale = p.add_argument_group("--suite scale (default --clients 10 --rounds 5)")
    scale.add_argument("--no-flwr", action="store_true",
                       help="skip the flwr run (Ray) measurement")
    scale.add_argument("--transitions", type=int, default=20_000,
                       help="transitions of the streamed fit (at --dim)")
    scale.add_argument("--app", type=Path, default=Path("."),
                       help="the Flower app folder flwr run builds (default: .)")
    p.set_defaults(func=_main)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``--set`` values as Flower's ``--run-config`` reads them (TOML values: strings in
    quotes, ``true``/``false``), validated as run-config keys; returns RunConfig fields.
    A value that is not TOML is taken as a bare string (``--set client-update=proximal``)."""
    from click import ClickException
    from flwr.common.config import parse_config_args

    given: dict[str, Any] = {}
    for item in items:
        try:
            given.update(parse_config_args([item]))
        except ClickException:
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--set {item!r}: expected KEY=VALUE") from None
            given[key.strip()] = value.strip()
    from fedqhd.learners import parse_run_config

    parsed = parse_run_config(given).to_run_config()
    return {k.replace("-", "_"): parsed[k] for k in given}


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
            raise SystemExit(f"{name}: unknown {bad}; valid: {', '.join(valid)}")
    try:
        seeds = paper.parse_seeds(args.seeds) if args.seeds else list(paper.SEEDS)
    except ValueError as exc:
        raise SystemExit(f"--seeds: {exc}") from None
    if args.jobs < 1:
        raise SystemExit(f"--jobs: must be >= 1, got {args.jobs}")
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
                                      episodes=args.episodes, clients=clients,
                                      resume=args.resume, overwrite=args.overwrite,
                                      jobs=args.jobs)
    except (ValueError, FileExistsError) as exc:
        raise SystemExit(f"error: {exc}") from None
    print(paper.markdown_table(summary))
    print(f"written {out / 'paper.json'}, {out / 'paper-table.md'} and curves-*.png")
    return 0


def _scale_suite(args: argparse.Namespace) -> int:
    from fedqhd.studies import scale

    out = args.out or Path("outputs/scale")
    if not args.no_flwr and not (args.app / "pyproject.toml").is_file():
        raise SystemExit(f"--app {args.app}: no pyproject.toml (the Flower app flwr run builds); "
                         "run from the fedqhd checkout or pass --no-flwr")
    overrides = {"env-id": args.env,
                 **{k.replace("_", "-"): v for k, v in parse_overrides(args.set).items()}}
    seed = int(args.seeds.split(",")[0]) if args.seeds else 0
    summary = scale.run_suite(args.clients or 10, args.rounds or 5, out,
                              flwr=not args.no_flwr, app_dir=args.app.resolve(),
                              run_config=overrides, transitions=args.transitions,
                              dim=args.dim, seed=seed)
    print(scale.markdown(summary))
    print(f"written {out / 'scale.json'}")
    return 0


def _main(args: argparse.Namespace) -> int:
    from fedqhd.config import ConfigError

    if args.env_module:
        args.set = [f"env-module='{args.env_module}'", *args.set]
    try:  # the module first (it registers the env), then the env id: errors, not tracebacks
        parse_overrides([*args.set, f"env-id='{args.env}'"])
    except ConfigError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.suite == "paper":
        return _paper_suite(args)
    if args.suite == "scale":
        return _scale_suite(args)
    args.rounds = args.rounds or 30
    args.clients = args.clients or 10
    args.seeds = args.seeds or "0,1,2"
    args.out = args.out or Path("outputs/bench")
    if args.speed:
        result = fqi_speed(args.env, args.clients, args.dim, sweeps=10)
        print(json.dumps(result, indent=2))
        return 0
    overrides = parse_overrides(args.set)
    seeds = [int(s) for s in args.seeds.split(",")]
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
