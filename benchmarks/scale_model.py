"""The scale model of docs/scale.md (issue 32): measure its parts, calibrate it on a
cluster, predict rounds at 10^4-10^6 clients and check one prediction.

    # 1. in process: per-message client CPU (learner cached / rebuilt), bytes, server CPU
    OMP_NUM_THREADS=1 python benchmarks/scale_model.py measure --out OUT
    # 2. on the 2-node cluster, the offline app at 1000 clients, then at 10,000
    python benchmarks/warm_cluster.py --nodes 2 --runs 1 --supernodes 1000 \\
        --run-config "num-server-rounds=3 eval-episodes=3 seed=0" --out OUT/c1000
    #    (likewise --supernodes 10000 --timeout 1400 into OUT/c10k)
    # 3. calibrate on the 1000-client run, predict, and check the 10,000-client rounds
    python benchmarks/scale_model.py predict --out OUT --calibration OUT/c1000/report.json \\
        --check OUT/c10k/report.json

Every number ``predict`` prints comes from ``OUT/points.json`` and the reports; it
writes ``OUT/model.json``.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from fedqhd.studies.scale_model import (
    Model,
    Point,
    calibrate,
    fit,
    later_rounds,
    measure_in_child,
)

DIMS = (500, 1000, 2000, 4000)
SMALL, LARGE = 20, 200


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
    run = json.loads(Path(args.calibration).read_text())["runs"][0]
    calibrate(model, args.clients, run, args.cpus, args.cpus)
    (out / "model.json").write_text(json.dumps(asdict(model), indent=1))
    ms = {k: round(v * 1e3, 3) for k, v in asdict(model).items()
          if k in ("c_hit", "c_build", "c_flower", "s_app", "s_flower")}
    print(f"model ({args.env}, D {args.dim}), ms per message: {ms}; fixed "
          f"{model.t_fixed:.3f} s a round; utilisation {model.utilisation:.2f}; node "
          f"{model.node_bytes / 1e6:.2f} MB, {model.cache_bytes / model.node_bytes:.0f} "
          f"nodes per process cache; message / reply {model.message_bytes / 1e3:.1f} / "
          f"{model.reply_bytes / 1e3:.1f} KB")
    if args.check:
        run = json.loads(Path(args.check).read_text())["runs"][0]
        n = args.check_clients
        wall, actors, server = later_rounds(run, n)
        predicted = model.round_s(n, args.cpus, args.cpus)
        print(f"\ncheck, {n} clients on {args.cpus} actor CPUs sharing {args.cpus} cores: "
              f"later rounds {', '.join(f'{r:.1f}' for r in run['round-s'][1:])} s, "
              f"predicted {predicted:.1f} s ({predicted / wall - 1:+.1%}); actor CPU per "
              f"message {actors * 1e3:.2f} ms (predicted {model.client_s(n) * 1e3:.2f}), "
              f"server's {server * 1e3:.2f} ms (predicted {model.server_s() * 1e3:.2f})")
    print(f"\nthe server on its own machine, actors on P CPUs:\n{'clients':>9} "
          f"{'P':>5} {'round s':>9} {'bound':>7} {'server-bound beyond P':>21} "
          f"{'replies held GB':>15}")
    for n in (10_000, 100_000, 1_000_000):
        for cpus in (2, 16, 64, 256):
            bound = ("server" if n * model.server_s() > n * model.client_s(n) / cpus
                     else "actors")
            print(f"{n:>9} {cpus:>5} {model.round_s(n, cpus):>9.1f} {bound:>7} "
                  f"{model.server_bound_cpus(n):>21.1f} "
                  f"{model.server_reply_memory(n) / 1e9:>15.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", required=True)
    p = sub.add_parser("predict")
    p.add_argument("--out", required=True)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--dim", type=int, default=2000)
    p.add_argument("--calibration", required=True,
                   help="warm_cluster.py report of the calibration run (>= 2 rounds)")
    p.add_argument("--clients", type=int, default=1000, help="its clients")
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
