"""Does pooled ridge FQI stay inside the value range, with and without the bound?

For each task and seed it fits ridge FQI on the pooled shards of the clients
(the run's defaults: D = 2000, ridge 0.1, gamma 0.99, 10 clients x 5 episodes)
with the targets bounded (``value_range="data"``, the default) and unbounded
(``value_range=None``, the old behaviour), and prints

* the greedy return after the bench's sweep count (20 rounds x 3 sweeps) and
  after ``--sweeps`` sweeps (server evaluation episodes, as ``fedqhd bench``),
* the largest |Q| on the data states and the non-terminal next states (those
  FQI bootstraps from) after ``--sweeps``, as a share of the reward-implied
  bound ``max(|lo|, |hi|)`` (1 = at the bound),
* the largest overshoot beyond ``[lo, hi]``, as a share of ``hi - lo``,
* the change of the readout's Q in the last sweep (relative; 0 = converged).

    python benchmarks/fqi_convergence.py --seeds 0,1,2
"""

from __future__ import annotations

import argparse

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.data import pooled
from fedqhd.envs import get_spec
from fedqhd.learners.fqi import FQILearner, shared_encoder
from fedqhd.readout import value_range
from fedqhd.studies.bench import client_shards, greedy_return

TASKS = ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3"]


def measure(cfg: RunConfig, n_clients: int, bound: bool, sweeps: int) -> dict[str, float]:
    data = pooled(client_shards(cfg, n_clients))
    learner = FQILearner(data, shared_encoder(cfg), get_spec(cfg.env_id).n_actions, cfg.gamma,
                         cfg.ridge, proximal=0.0, value_range="data" if bound else None)
    lo, hi = value_range(data.rewards, cfg.gamma)
    early = cfg.num_server_rounds * cfg.local_iterations
    learner.train(early)
    row = {"return-early": greedy_return(cfg, learner)}
    learner.train(sweeps - early - 1)
    # the states whose Q-values FQI uses: data states and the next states it bootstraps from
    states = np.vstack([data.observations, data.next_observations[~data.terminated]])
    before = learner.q_values(states)
    learner.train(1)
    q = learner.q_values(states)
    with np.errstate(over="ignore", invalid="ignore"):
        row.update({
            "return-late": greedy_return(cfg, learner) if np.isfinite(q).all() else np.nan,
            "max-abs-q/bound": float(np.abs(q).max() / max(abs(lo), abs(hi))),
            "overshoot/range": float(max(q.max() - hi, lo - q.min(), 0.0) / (hi - lo)),
            "last-sweep-change": float(np.linalg.norm(q - before) / np.linalg.norm(q)),
        })
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--sweeps", type=int, default=1000)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="RunConfig override, e.g. --set gamma=0.9 (repeatable)")
    args = parser.parse_args()
    overrides = {k.replace("-", "_"): float(v) if "." in v or "e" in v else int(v)
                 for k, _, v in (s.partition("=") for s in args.set)}
    print(f"| task | bound | return, {RunConfig().num_server_rounds * RunConfig().local_iterations}"
          f" sweeps | return, {args.sweeps} | max abs Q / bound | overshoot / range | "
          f"last-sweep change |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for task in args.tasks.split(","):
        for bound in (False, True):
            rows = [measure(RunConfig(env_id=task, seed=int(seed), **overrides), args.clients,
                            bound, args.sweeps) for seed in args.seeds.split(",")]
            cell = {k: [r[k] for r in rows] for k in rows[0]}
            per_seed = " / ".join(f"{v:.1f}" for v in cell["return-late"])
            print(f"| {task} | {'on' if bound else 'off'} | {np.mean(cell['return-early']):.1f} | "
                  f"{np.mean(cell['return-late']):.1f} ({per_seed}) | "
                  f"{max(cell['max-abs-q/bound']):.3g} | {max(cell['overshoot/range']):.3g} | "
                  f"{max(cell['last-sweep-change']):.2g} |", flush=True)


if __name__ == "__main__":
    main()
