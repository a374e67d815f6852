"""Why 30 % failing clients cost what they cost: per-client evaluations and a re-evaluation
of every final model with more episodes (issue 11, the failing-clients bar).

Runs the cases of ``benchmarks/attack.py --only failures`` in process and, besides the
recorded return (10 episodes, as the run reports it), keeps

* ``clients``: every client's last-round evaluation reply (anchor setting: the return of
  the compiled teacher in its own features, and the weight its reply carries);
* ``reeval``: the final model re-evaluated with ``--episodes`` episodes (shared: the
  server's greedy return of the final readout; anchor: the final teacher compiled into
  each of the 10 clients' features, so that a 7-client run is scored by the same 10
  evaluators as the 10-client runs), separating evaluation noise from policy noise.

Case ``absent30`` is ``attack.py``'s control, the same data as the failing runs: the 7
nodes hold shards 0..6 *of the 10-client federation* (num-partitions 10: same behaviour
epsilons, same ridge share); ``absent30-repart`` is the control as it was until session
5, a re-partition into 7 clients (other shards: epsilons 0.8..1.0 over 7 clients).

    OMP_NUM_THREADS=1 python benchmarks/failures_diagnose.py --seeds 0 1 2 --out d.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.clientapp import ClientApp

from fedqhd.config import RunConfig
from fedqhd.learners.fqi import client_encoder, greedy_return, shared_encoder
from fedqhd.readout import RidgeSystem
from fedqhd.seeding import SERVER
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C

sys.path.insert(0, str(Path(__file__).parent))
import attack  # noqa: E402
from attack import N_CLIENTS, SETTINGS, apps_for, node_configs_for  # noqa: E402


def recording(app: ClientApp, store: dict[int, dict[str, float]]) -> ClientApp:
    """``app`` whose evaluation replies' metrics are kept in ``store[partition id]`` (last
    round)."""
    out = ClientApp()

    @out.train()
    def train(msg: Message, context) -> Message:
        return app(msg, context)

    @out.evaluate()
    def evaluate(msg: Message, context) -> Message:
        reply = app(msg, context)
        if not reply.has_error():
            store[int(context.node_config["partition-id"])] = dict(
                reply.content[C.METRICS].items())
        return reply

    return out


def reevaluate(cfg: RunConfig, arrays: dict[str, np.ndarray], episodes: int
               ) -> dict[str, Any]:
    """The final model's greedy return over ``episodes`` episodes (see the module doc)."""
    long = dataclasses.replace(cfg, eval_episodes=episodes)
    if C.READOUT in arrays:
        returns = greedy_return(long, shared_encoder(cfg), arrays[C.READOUT], party=SERVER)
        return {"server": float(returns.mean()), "server-std": float(returns.std())}
    out: dict[str, Any] = {}
    for pid in range(N_CLIENTS):
        encoder = client_encoder(cfg, pid)
        readout = RidgeSystem(encoder.encode(arrays[C.ANCHORS]), cfg.ridge).solve(
            arrays[C.TEACHER])
        out[str(pid)] = float(greedy_return(long, encoder, readout, party=pid).mean())
    return out


def run(seed: int, case: str, setting: str, rounds: int, episodes: int,
        per_client: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    overrides = {k.replace("_", "-"): v for k, v in SETTINGS[setting].items()}
    overrides.update(extra or {})
    store: dict[int, dict[str, float]] = {}
    repart = case == "absent30-repart"
    apps = apps_for("absent30" if repart else case)
    apps = [recording(app, store) for app in apps]
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.from_run_config({"seed": seed, "num-server-rounds": rounds,
                                         "output-dir": out,
                                         "episodes-per-client": per_client, **overrides})
        grid = InProcessGrid(apps, run_config=cfg.to_run_config(),
                             node_configs=None if repart else node_configs_for(case))
        started = time.time()
        final, out_dir = run_federation(grid, cfg)
        seconds = time.time() - started
        with np.load(out_dir / "final_model.npz") as z:
            arrays = {k: z[k] for k in z.files}
        rows = json.loads((out_dir / "results.json").read_text())["rounds"]
    federated = cfg.encoder == "heterogeneous"
    counted = {"train-failed": sum(r[C.REPLIES_FAILED] for r in rows)}
    if federated:
        counted["evaluate-failed"] = sum(r["evaluate-" + C.REPLIES_FAILED] for r in rows)
    return {"seed": seed, "case": case, "setting": setting, "per-client": per_client,
            "overrides": extra or {},
            "return": final["return-mean"], "status": final["status"],
            "counts-exact": counted == attack.expected_failures(case, rounds, federated),
            "clients": {str(p): {"return": m.get(C.RETURN_MEAN),
                                 "num-transitions": m.get(C.NUM_TRANSITIONS)}
                        for p, m in sorted(store.items())},
            "reeval": reevaluate(cfg, arrays, episodes), "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=100, help="re-evaluation episodes")
    parser.add_argument("--episodes-per-client", type=int, default=5)
    parser.add_argument("--cases", nargs="+", default=[
        "clean:defaults", "fail30:defaults", "absent30:defaults", "clean:median",
        "fail30:median", "clean:anchor", "fail30:anchor", "absent30-repart:anchor",
        "absent30:anchor"])
    parser.add_argument("--failing", type=int, nargs="+", default=list(attack.FAILING),
                        help="the 3 failing clients (default 7 8 9, the most random "
                        "behaviour under behaviour-skew); the absent30 control then "
                        "leaves these out")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="run-config overrides for every case (numbers parsed as "
                        "float), e.g. ridge=0.142857")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    extra: dict[str, Any] = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            extra[key] = float(value)
        except ValueError:
            extra[key] = value
    if len(args.failing) != len(attack.FAILING):
        parser.error(f"--failing takes {len(attack.FAILING)} client ids")
    attack.FAILING = tuple(args.failing)
    logging.getLogger("flwr").setLevel(logging.ERROR)
    results = []
    for seed in args.seeds:
        for item in args.cases:
            case, setting = item.split(":")
            r = run(seed, case, setting, args.rounds, args.episodes, args.episodes_per_client,
                    extra)
            results.append(r)
            print(json.dumps(r), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
