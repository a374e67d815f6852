"""The FedQHD paper's online protocol with our ridge-FQI clients (fedqhd.online).

5 clients x 600 episodes, metric = mean over clients of each client's last-100
training-episode returns; also the greedy return of the final policies, wall and
CPU seconds and where the time went (``--json``: also every round's row, the
learning curve and the value bias). Settings per task come from
``fedqhd.online.ONLINE_SETTINGS`` unless overridden. Run single-threaded:

    OMP_NUM_THREADS=1 python benchmarks/online_paper.py            # 4 tasks x 2 settings x 3 seeds
    OMP_NUM_THREADS=1 python benchmarks/online_paper.py --envs CartPole-v1 \
        --encoders shared --seeds 42

Any ``run_online`` keyword can be overridden with ``--set key=value`` (JSON value).
Prints one line per run as it ends, then a markdown table (mean +- std over seeds).

``--rhs-blocks K`` (K > 1) computes each sweep's right-hand side ``Phi_a^T y_a`` as the
float64 sum of K row blocks' float32 products instead of one product: the same sums in
another order, so the runs differ from the library's by rounding alone (how much of a
cell is decided by the last bits; BENCHMARKS.md, "Fourteenth round").
"""

from __future__ import annotations

import argparse
import json

import numpy as np

import fedqhd.online
from fedqhd.online import ONLINE_SETTINGS, run_online


def perturb_rhs_rounding(blocks: int) -> None:
    """Make every sweep's right-hand side the sum of ``blocks`` row blocks' products."""
    whole = fedqhd.online.primal_rhs

    def blocked(features: np.ndarray, onehot: np.ndarray, y: np.ndarray) -> np.ndarray:
        cuts = np.linspace(0, len(features), blocks + 1).astype(int)
        return sum(whole(features[a:b], onehot[a:b], y[a:b])
                   for a, b in zip(cuts[:-1], cuts[1:], strict=True))

    fedqhd.online.primal_rhs = blocked

PAPER = {  # FedQHD paper, 3-seed means (shared / heterogeneous encoders)
    "CartPole-v1": (466.3, 351.1), "Acrobot-v1": (-105.0, -102.5),
    "LunarLander-v3": (224.1, 101.5), "MountainCar-v0": (-143.7, -162.3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(ONLINE_SETTINGS))
    parser.add_argument("--encoders", nargs="+", default=["shared", "heterogeneous"],
                        choices=["shared", "heterogeneous"])
    parser.add_argument("--aggregate", default="auto", choices=["auto", "none"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    parser.add_argument("--json", default="", help="write every run's numbers here")
    parser.add_argument("--rhs-blocks", type=int, default=1,
                        help="> 1: the right-hand sides' sums in another order (rounding)")
    args = parser.parse_args()
    if args.rhs_blocks > 1:
        perturb_rhs_rounding(args.rhs_blocks)
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    aggregate = None if args.aggregate == "none" else "auto"
    table, dump = [], []
    for env_id in args.envs:
        for enc in args.encoders:
            rows = []
            for seed in args.seeds:
                r = run_online(env_id, episodes=args.episodes, encoder=enc,
                               aggregate=aggregate, seed=seed, **overrides)
                rows.append(r)
                prof = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.profile.items(),
                                                                  key=lambda kv: -kv[1]))
                print(f"{env_id} {enc} seed={seed}: train-return-last100 "
                      f"{r.train_return_last100:.1f}  greedy {r.greedy_return:.1f}  wall "
                      f"{r.wall_s:.1f} s  cpu {r.cpu_s:.1f} s  transitions/client "
                      f"{int(np.mean(r.n_transitions))}\n  per-client last100 "
                      f"{[round(x, 1) for x in r.client_last100]}\n  time (wall s): {prof}",
                      flush=True)
                dump.append({"env": env_id, "encoder": enc, "seed": seed,
                             "train_return_last100": r.train_return_last100,
                             "greedy_return": r.greedy_return, "wall_s": r.wall_s,
                             "cpu_s": r.cpu_s, "profile": r.profile,
                             "client_last100": r.client_last100,
                             "rounds": r.rounds,
                             "config": {k: list(v) if isinstance(v, tuple) else v
                                        for k, v in r.config.items()}})
            last = np.array([r.train_return_last100 for r in rows])
            paper = PAPER[env_id][enc == "heterogeneous"]
            table.append(
                f"| {env_id} | {enc} | {' / '.join(f'{x:.1f}' for x in last)} | "
                f"{last.mean():.1f} +- {last.std():.1f} | "
                f"{np.mean([r.greedy_return for r in rows]):.1f} | "
                f"{np.mean([r.wall_s for r in rows]):.1f} | "
                f"{np.mean([r.cpu_s for r in rows]):.1f} | {paper} | "
                f"{'yes' if last.mean() >= paper else 'NO'} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dump, fh, indent=1)
    print(f"\nseeds {args.seeds}, overrides {overrides or 'none'}\n")
    print("| task | encoders | last-100 per seed | mean +- std | greedy | wall s | CPU s "
          "| paper | >= paper |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
