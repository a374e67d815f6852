"""One attacker among 10 CartPole clients, and 30% of clients failing: final greedy return
of the clean run, of plain averaging under attack, and of the safeguards (defaults) and
robust aggregation options under the same attack.

In process (the real ServerApp logic and ClientApps on :class:`InProcessGrid`, no Ray),
default run config (shared encoder, FedQHDAvg, consensus ADMM, 20 rounds) with 10
clients. The attacker is client 9; it trains honestly and then alters its reply:

* ``scale``: its readout times 1e30;
* ``claim``: it claims ``num-transitions`` = 1e12;
* ``rotate``: it sends its readout negated, under a new partition id every round
  (``FedQHDAvg(aggregate="latest")`` would keep every id as another client);
* ``fail30``: no attacker; clients 7, 8 and 9 raise in training every round.

``plain`` is the behaviour before issue 11: weighted mean, no norm bound, no weight
cap, no identity binding (switched off here by patching the registry to accept every
claim). ``defaults`` is the shipped configuration; ``median`` and ``trimmed-mean`` add
``aggregation`` on top of the defaults.

    OMP_NUM_THREADS=1 python benchmarks/attack.py --seeds 0 1 2 --out attack.json
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import numpy as np
from flwr.app import Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedqhd.client.app import app as honest_app
from fedqhd.config import RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C
from fedqhd.strategies.identity import IdentityRegistry

N_CLIENTS = 10
ATTACKER = 9
PLAIN = {"norm_bound_factor": 0.0, "weight_cap_factor": 0.0}
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": PLAIN,
    "defaults": {},
    "median": {"aggregation": "median"},
    "trimmed-mean": {"aggregation": "trimmed-mean"},
}


def altered_app(alter: Callable[[dict, dict, int], tuple[dict, dict]]) -> ClientApp:
    """A client that trains honestly and replies ``alter(arrays, metrics, round)``."""
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        reply = honest_app(msg, context)
        if reply.has_error():
            return reply
        arrays = C.from_array_record(reply.content[C.ARRAYS])
        metrics = dict(reply.content[C.METRICS].items())
        arrays, metrics = alter(arrays, metrics, int(msg.content[C.CONFIG][C.SERVER_ROUND]))
        return Message(RecordDict({C.ARRAYS: C.to_array_record(arrays),
                                   C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        return honest_app(msg, context)

    return app


def failing_app() -> ClientApp:
    app = ClientApp()

    @app.train()
    def train(msg: Message, context) -> Message:
        raise RuntimeError("this client fails every round")

    return app


def _scale(arrays, metrics, rnd):
    return {k: v * 1e30 for k, v in arrays.items()}, metrics


def _claim(arrays, metrics, rnd):
    return arrays, {**metrics, C.NUM_TRANSITIONS: 1e12}


def _rotate(arrays, metrics, rnd):
    return ({k: -v for k, v in arrays.items()},
            {**metrics, C.PARTITION_ID: 1000 + rnd})


ATTACKS = {"scale": _scale, "claim": _claim, "rotate": _rotate}


def apps_for(attack: str) -> list[ClientApp]:
    apps = [honest_app] * N_CLIENTS
    if attack in ATTACKS:
        apps[ATTACKER] = altered_app(ATTACKS[attack])
    elif attack == "fail30":
        for i in (7, 8, 9):
            apps[i] = failing_app()
    return apps


@contextmanager
def identities_off():
    """Accept every identity claim (the behaviour before identity binding)."""
    original = IdentityRegistry.claim

    def accept(self, node, key, server_round):
        self.owner[key] = node
        self.last_seen[key] = server_round
        return None

    IdentityRegistry.claim = accept  # type: ignore[method-assign]
    try:
        yield
    finally:
        IdentityRegistry.claim = original  # type: ignore[method-assign]


def run(seed: int, attack: str, setting: str, rounds: int) -> dict[str, Any]:
    overrides = {k.replace("_", "-"): v for k, v in SETTINGS[setting].items()}
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.from_run_config({"seed": seed, "num-server-rounds": rounds,
                                         "output-dir": out, **overrides})
        grid = InProcessGrid(apps_for(attack), run_config=cfg.to_run_config())
        started = time.time()
        if setting == "plain":
            with identities_off():
                final, out_dir = run_federation(grid, cfg)
        else:
            final, out_dir = run_federation(grid, cfg)
        rows = json.loads((out_dir / "results.json").read_text())["rounds"]
    last = rows[-1]
    return {"seed": seed, "attack": attack, "setting": setting,
            "return": final["return-mean"], "status": final["status"],
            "clients-averaged": last.get(C.CLIENTS_AVERAGED),
            "replies": final["replies"], "seconds": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.ERROR)
    cases = [("clean", s) for s in SETTINGS]
    cases += [(a, s) for a in ATTACKS for s in SETTINGS]
    cases += [("fail30", "plain"), ("fail30", "defaults"), ("fail30", "median")]
    results = []
    for seed in args.seeds:
        for attack, setting in cases:
            r = run(seed, attack, setting, args.rounds)
            results.append(r)
            print(json.dumps(r), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    print()
    print("| attack | setting | " + " | ".join(f"seed {s}" for s in args.seeds)
          + " | mean | vs clean |")
    print("|---|---|" + "---|" * (len(args.seeds) + 2))
    clean = float(np.mean([r["return"] for r in results
                           if r["attack"] == "clean" and r["setting"] == "defaults"]))
    for attack, setting in cases:
        rets = [r["return"] for r in results if r["attack"] == attack and r["setting"] == setting]
        mean = float(np.mean(rets))
        print(f"| {attack} | {setting} | " + " | ".join(f"{x:.1f}" for x in rets)
              + f" | {mean:.1f} | {100 * (mean / clean - 1):+.0f}% |")


if __name__ == "__main__":
    main()
