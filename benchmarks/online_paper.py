"""The FedQHD paper's online protocol with our ridge-FQI clients (fedqhd.online).

5 clients x 600 episodes, metric = mean over clients of each client's last-100
training-episode returns; also the greedy return of the final policies, wall and
CPU seconds and where the time went. Run single-threaded:

    OMP_NUM_THREADS=1 python benchmarks/online_paper.py --env CartPole-v1 \
        --encoder shared --seeds 42 43 44

Any ``run_online`` keyword can be overridden with ``--set key=value`` (JSON value).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fedqhd.online import run_online

PAPER = {  # FedQHD paper, 3-seed means (shared / heterogeneous encoders)
    "CartPole-v1": (466.3, 351.1), "Acrobot-v1": (-105.0, -102.5),
    "LunarLander-v3": (224.1, 101.5), "MountainCar-v0": (-143.7, -162.3),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--encoder", default="shared", choices=["shared", "heterogeneous"])
    parser.add_argument("--aggregate", default="auto", choices=["auto", "none"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42])
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    aggregate = None if args.aggregate == "none" else "auto"
    paper = PAPER[args.env][args.encoder == "heterogeneous"]
    rows = []
    for seed in args.seeds:
        r = run_online(args.env, episodes=args.episodes, encoder=args.encoder,
                       aggregate=aggregate, seed=seed, **overrides)
        rows.append(r)
        prof = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r.profile.items(),
                                                          key=lambda kv: -kv[1]))
        print(f"{args.env} {args.encoder} aggregate={r.aggregate} seed={seed}: "
              f"train-return-last100 {r.train_return_last100:.1f}  greedy "
              f"{r.greedy_return:.1f}  wall {r.wall_s:.1f} s  cpu {r.cpu_s:.1f} s  "
              f"transitions/client {int(np.mean(r.n_transitions))}", flush=True)
        print(f"  per-client last100 {[round(x, 1) for x in r.client_last100]}")
        print(f"  time (wall s, sections overlap nothing): {prof}", flush=True)
    if len(rows) > 1:
        m = np.mean([r.train_return_last100 for r in rows])
        print(f"mean over {len(rows)} seeds: train-return-last100 {m:.1f}  greedy "
              f"{np.mean([r.greedy_return for r in rows]):.1f}  wall "
              f"{np.mean([r.wall_s for r in rows]):.1f} s  cpu "
              f"{np.mean([r.cpu_s for r in rows]):.1f} s")
    print(f"paper (FedQHD, {args.encoder}): {paper}")
    print("config:", rows[-1].config)


if __name__ == "__main__":
    main()
