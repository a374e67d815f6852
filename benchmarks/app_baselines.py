"""The paper's baselines in the Flower app next to the bench's in-process run.

Runs one app run config (online protocol, ``online-settings = "auto"``: the per-task
table, the paper's 600 episodes per client) on an in-process Grid of ``--clients``
ClientApps, then :func:`fedqhd.online.run_online` with the same settings
(:func:`fedqhd.learners.fqi_online.run_online_kwargs`), and prints one markdown row:
the final last-100 training return of each, the largest per-round difference, and
CPU / wall seconds of each. One CPU thread. ``--strategy fedavg-dqn`` runs
``learner = "dqn"`` (uniform weighting, as the bench) against
:func:`fedqhd.baselines.dqn.run_fedavg_dqn`, ``--strategy distill-dqn`` runs
``learner = "dqn"``, ``strategy = "anchor"`` (``--encoder heterogeneous``: the cycled
widths) against :func:`fedqhd.baselines.dqn.run_distill_dqn` (:func:`fedqhd.learners.
dqn.run_distill_kwargs`), both with ``as_nodes=True`` (each client drawn and computed as
a node alone; the dqn extra), and adds both greedy returns (the app's are evaluated on
other episode seeds).

    python benchmarks/app_baselines.py --env CartPole-v1 --strategy truncate \\
        --encoder heterogeneous --seed 42
    python benchmarks/app_baselines.py --env CartPole-v1 --strategy pooled --seed 42
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

from fedqhd.client.app import app as client_app  # noqa: E402
from fedqhd.config import RunConfig  # noqa: E402
from fedqhd.learners.fqi_online import run_online_kwargs  # noqa: E402
from fedqhd.online import run_online  # noqa: E402
from fedqhd.server.app import run_federation  # noqa: E402
from fedqhd.server.inprocess import InProcessGrid  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--strategy", default="none",
                        help="none, truncate, avg, anchor, pooled (the oracle), fedavg-dqn or "
                             "distill-dqn")
    parser.add_argument("--encoder", default="shared")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--weight-cap-factor", type=float, default=None,
                        help="run-config weight-cap-factor (default: the app's, 3; 0: off, "
                             "the bench's plain transition weights)")
    args = parser.parse_args()
    dqn = args.strategy in ("fedavg-dqn", "distill-dqn")
    keys = {"protocol": "online", "env-id": args.env, "seed": args.seed,
            "online-episodes": args.episodes, "min-nodes": args.clients,
            "output-dir": tempfile.mkdtemp(prefix="app-baselines-")}
    if args.weight_cap_factor is not None:
        keys["weight-cap-factor"] = args.weight_cap_factor
    keys.update({"learner": "dqn", "weighting": "uniform"} if dqn else
                {"strategy": args.strategy, "encoder": args.encoder})
    if args.strategy == "distill-dqn":
        keys.update({"strategy": "anchor", "encoder": args.encoder})
    cfg = RunConfig.from_run_config(keys)
    wall, cpu = time.perf_counter(), time.process_time()
    _, out = run_federation(InProcessGrid([client_app] * args.clients,
                                          run_config=cfg.to_run_config()), cfg)
    app_wall, app_cpu = time.perf_counter() - wall, time.process_time() - cpu
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    episodes = cfg.num_server_rounds * cfg.episodes_per_round
    if dqn:
        from fedqhd.baselines.dqn import run_distill_dqn, run_fedavg_dqn
        from fedqhd.learners.dqn import run_distill_kwargs

        if args.strategy == "distill-dqn":
            ref = run_distill_dqn(episodes=episodes, **run_distill_kwargs(cfg, args.clients))
        else:
            ref = run_fedavg_dqn(args.env, n_clients=args.clients, episodes=episodes,
                                 aggregate_every=cfg.episodes_per_round, seed=args.seed,
                                 eval_episodes=cfg.eval_episodes, as_nodes=True)
        bench_curve = [r["train-return-last100"] for r in ref["rounds"]]
        bench_cpu, bench_wall = ref["cpu-s"], ref["wall-s"]
        greedy = f" | {rounds[-1]['return-mean']:.1f} | {ref['greedy-return']:.1f}"
    else:
        bench = run_online(n_clients=args.clients, episodes=episodes,
                           **run_online_kwargs(cfg))
        bench_curve = [r["train-return-last100"] for r in bench.rounds]
        bench_cpu, bench_wall, greedy = bench.cpu_s, bench.wall_s, ""
    app_curve = [r["train-return-last100"] for r in rounds]
    capped = sum(r.get("replies-weight-capped", 0) for r in rounds)
    diff = max(abs(a - b) for a, b in zip(app_curve, bench_curve, strict=True))
    print("| env | strategy | encoder | seed | app last-100 | bench last-100 | max per-round "
          "diff | weights capped | app CPU s | app wall s | bench CPU s | bench wall s |"
          + (" app greedy | bench greedy |" if dqn else ""))
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          + ("---:|---:|" if dqn else ""))
    print(f"| {args.env} | {args.strategy} | {cfg.encoder} | {args.seed} | "
          f"{app_curve[-1]:.1f} | {bench_curve[-1]:.1f} | {diff:.2g} | {capped} | "
          f"{app_cpu:.0f} | {app_wall:.0f} | {bench_cpu:.0f} | {bench_wall:.0f}{greedy} |",
          flush=True)


if __name__ == "__main__":
    main()
