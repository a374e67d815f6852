"""The FedQHD paper's deep baselines on its online protocol: FedAvg-DQN and distillation FedDQN.

5 clients x 600 epsilon-greedy episodes each (paper settings, see
fedqhd/baselines/dqn.py), aggregation every 25 episodes; prints one markdown
row per run (last-100 training return averaged over clients, greedy return,
wall and CPU seconds, per-step cost) and writes the full result (per-round
curve, all episode returns) as JSON to ``--out``. Runs on one CPU thread.

    python benchmarks/dqn_paper.py --env CartPole-v1 --methods fedavg,distill-shared \\
        --seeds 42 --out outputs/dqn-paper
"""

from __future__ import annotations

import os

# one CPU thread for XLA and BLAS (set before JAX is imported)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("XLA_FLAGS",
                      "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

from fedqhd.baselines.dqn import run_distill_dqn, run_fedavg_dqn  # noqa: E402

METHODS = {
    "fedavg": lambda **kw: run_fedavg_dqn(**kw),
    "distill-shared": lambda **kw: run_distill_dqn(setting="shared", **kw),
    "distill-hetero": lambda **kw: run_distill_dqn(setting="heterogeneous", **kw),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--methods", default="fedavg,distill-shared,distill-hetero")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--aggregate-every", type=int, default=25)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--out", default="outputs/dqn-paper")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("| env | method | seed | last-100 train return | greedy return | wall s | CPU s | "
          "steps | ms per step (train+act, all clients) | ms env per step | "
          "greedy before last distillation |", flush=True)
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    for method in args.methods.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            r = METHODS[method](env_id=args.env, n_clients=args.clients,
                                episodes=args.episodes, aggregate_every=args.aggregate_every,
                                seed=seed, eval_episodes=args.eval_episodes,
                                verbose=args.verbose)
            print(f"| {args.env} | {method} | {seed} | {r['train-return-last100']:.1f} | "
                  f"{r['greedy-return']:.1f} | {r['wall-s']:.0f} | {r['cpu-s']:.0f} | "
                  f"{r['lockstep-steps']} | {r['ms-per-step-call']:.2f} | "
                  f"{r['ms-env-per-step']:.2f} | "
                  f"{r.get('greedy-return-before-last-distill', float('nan')):.1f} |", flush=True)
            r["returns"] = r["returns"].tolist()
            (out / f"{args.env}_{method}_{seed}.json").write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
