"""Does ridge FQI on the pooled CartPole shards converge, and how good is its policy?

For each (bandwidth, ridge) it fits ridge FQI on the 10 clients' pooled shards
(the bench's defaults otherwise) for 120 and for 1000 sweeps and prints the mean
greedy return and the mean Q-value on the data states. CartPole's rewards are 1
per step, so a converged Q cannot exceed 1 / (1 - gamma) = 100: growth past that
(and between 120 and 1000 sweeps) is divergence.

    python benchmarks/pooled_fqi_growth.py --seeds 0,1,2,3,4 --unbounded

(``--unbounded``: FQI without the value bound, as BENCHMARKS.md measured it before
``value_range`` existed; without the flag the targets are bounded, the default.)
"""

from __future__ import annotations

import argparse

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.data import pooled
from fedqhd.envs import get_spec
from fedqhd.learners.fqi import FQILearner, shared_encoder
from fedqhd.studies.bench import client_shards, greedy_return

GRID = [(1.0, 0.1), (1.0, 0.3), (1.0, 1.0), (1.0, 3.0), (1.0, 10.0),
        (0.5, 0.3), (0.5, 1.0), (2.0, 0.3), (2.0, 1.0), (3.0, 1.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--unbounded", action="store_true",
                        help="value_range=None: the old FQI, Bellman targets not bounded")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print("| bandwidth | ridge | return, 120 sweeps | return, 1000 sweeps | mean Q, 120 | "
          "mean Q, 1000 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for bandwidth, ridge in GRID:
        rows = []
        for seed in seeds:
            cfg = RunConfig(seed=seed, bandwidth=bandwidth, ridge=ridge)
            data = pooled(client_shards(cfg, args.clients))
            learner = FQILearner(data, shared_encoder(cfg), get_spec(cfg.env_id).n_actions,
                                 cfg.gamma, ridge, proximal=0.0,
                                 value_range=None if args.unbounded else "data")
            row = []
            for sweeps in (120, 880):
                learner.train(sweeps)
                row += [greedy_return(cfg, learner), learner.q_values(data.observations).mean()]
            rows.append(row)
        r = np.mean(rows, axis=0)
        print(f"| {bandwidth} | {ridge} | {r[0]:.1f} | {r[2]:.1f} | {r[1]:.3g} | {r[3]:.3g} |",
              flush=True)


if __name__ == "__main__":
    main()
