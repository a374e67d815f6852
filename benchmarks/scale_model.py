"""The scale model of docs/scale.md (issue 32): measure its parts, calibrate it on a
cluster, predict rounds at 10^4-10^6 clients and check one prediction.

    # 1. in process: per-message client CPU (learner cached / rebuilt), bytes, server CPU
    OMP_NUM_THREADS=1 python benchmarks/scale_model.py measure --out OUT
    # 2. on the 2-node cluster, the offline app at 1000 clients, 2 and 4 rounds, then 10,000
    python benchmarks/warm_cluster.py --nodes 2 --runs 1 --supernodes 1000 \\
        --run-config "num-server-rounds=2 eval-episodes=3 seed=0" --out OUT/c2
    #    (likewise num-server-rounds=4 into OUT/c4, and 10000 clients into OUT/c10k)
    # 3. calibrate on the two 1000-client runs, predict, and check the 10,000-client round
    python benchmarks/scale_model.py predict --out OUT --short OUT/c2/report.json \\
        --long OUT/c4/report.json --check OUT/c10k/report.json

Every number ``predict`` prints comes from ``OUT/points.json`` and the reports; it
writes ``OUT/model.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from fedqhd.studies.scale_model import Model, Point, calibrate, fit, measure_in_child

DIMS = (500, 1000, 2000, 4000)
SMALL, LARGE = 20, 80


def measure(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    points: list[dict] = []
    grid = [("CartPole-v1", d) for d in DIMS] + [("Acrobot-v1", 2000), ("LunarLander-v3", 2000)]
    print(f"{'env':<15} {'D':>5} {'|A|':>3} {'c_hit ms':>8} {'c_build ms':>10} "
          f"{'server ms/reply':>15} {'fixed s':>7} {'node MB':>7} {'msg KB':>6} {'reply KB':>8}")
    for env_id, dim in grid:
        small = measure_in_child(env_id, dim, SMALL)
        large = measure_in_child(env_id, dim, LARGE)
        build = measure_in_child(env_id, dim, SMALL, cached=False)
        points += [asdict(small), asdict(large), asdict(build)]
        model = fit(small, large, build)
        print(f"{env_id:<15} {dim:>5} {small.n_actions:>3} {model.c_hit * 1e3:>8.2f} "
              f"{model.c_build * 1e3:>10.2f} {model.s_app * 1e3:>15.3f} "
              f"{model.t_fixed:>7.3f} {model.node_bytes / 1e6:>7.2f} "
              f"{model.message_bytes / 1e3:>6.1f} {model.reply_bytes / 1e3:>8.1f}", flush=True)
        (out / "points.json").write_text(json.dumps(points, indent=1))


def _model(out: Path, env_id: str, dim: int) -> Model:
    points = [Point(**p) for p in json.loads((out / "points.json").read_text())]
    mine = [p for p in points if p.env_id == env_id and p.dim == dim]
    cached = sorted((p for p in mine if p.cached), key=lambda p: p.clients)
    build = next(p for p in mine if not p.cached)
    return fit(cached[0], cached[-1], build)


def predict(args: argparse.Namespace) -> None:
    out = Path(args.out)
    model = _model(out, args.env, args.dim)
    short = json.loads(Path(args.short).read_text())["runs"][0]
    long = json.loads(Path(args.long).read_text())["runs"][0]
    calibrate(model, args.clients, short, long)
    (out / "model.json").write_text(json.dumps(asdict(model), indent=1))
    ms = {k: round(v * 1e3, 3) for k, v in asdict(model).items()
          if k in ("c_hit", "c_build", "c_flower", "s_app", "s_flower")}
    print(f"model ({args.env}, D {args.dim}), ms per message: {ms}; fixed "
          f"{model.t_fixed:.3f} s a round; node {model.node_bytes / 1e6:.2f} MB, "
          f"{model.cache_bytes / model.node_bytes:.0f} nodes per process cache")
    print(f"\n{'clients':>9} {'actor CPUs':>10} {'round s':>9} {'bound':>7} "
          f"{'server-bound beyond':>19} {'replies held GB':>15}")
    for n in (10_000, 100_000, 1_000_000):
        for cpus in (2, 16, 64, 256):
            t = model.round_s(n, cpus)
            bound = "server" if model.server_s(n) > n * model.client_s(n) / cpus else "actors"
            print(f"{n:>9} {cpus:>10} {t:>9.1f} {bound:>7} "
                  f"{model.server_bound_cpus(n):>19.1f} "
                  f"{model.server_reply_memory(n) / 1e9:>15.2f}")
    if args.check:
        run = json.loads(Path(args.check).read_text())["runs"][0]
        measured = run["round-s"][1:]
        later = sum(measured) / len(measured)
        predicted = model.round_s(args.check_clients, args.cpus)
        print(f"\ncheck: {args.check_clients} clients on {args.cpus} actor CPUs, later "
              f"rounds measured {', '.join(f'{r:.1f}' for r in measured)} s (mean "
              f"{later:.1f}); predicted {predicted:.1f} s: {predicted / later - 1:+.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--out", required=True)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--dim", type=int, default=2000)
    p.add_argument("--short", required=True, help="cluster report, fewer rounds")
    p.add_argument("--long", required=True, help="cluster report, more rounds")
    p.add_argument("--clients", type=int, default=1000, help="clients of the two runs")
    p.add_argument("--check", help="cluster report of the run to predict")
    p.add_argument("--check-clients", type=int, default=10_000)
    p.add_argument("--cpus", type=int, default=2, help="the cluster's actor CPUs")
    args = parser.parse_args()
    if args.cmd == "measure":
        measure(Path(args.out))
    else:
        predict(args)


if __name__ == "__main__":
    main()
