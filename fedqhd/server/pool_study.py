"""Does federation help a POOL client? Federated vs lone vs pooled, measured the same way.

``python -m fedqhd.server.pool_study --clients 5 --rho 1 --seeds 5``

Per seed (a fresh inventory MDP and fresh shards): one in-process federated round
(real ServerApp logic and ClientApps, no Ray) gives the federated policy's gap
(server), each client's own policy alone and its teacher-informed policy (client
evaluation, mean over clients); the pooled row is one POOL release of all clients'
trajectories together at the same rho (what a single trusted curator would get).
All policies of a seed are scored on the same simulated demands against c*.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile

import numpy as np

from fedqhd.client import pool_learner as pl
from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C


def study(clients: int, rho: float, seeds: int, **keys: object) -> dict[str, object]:
    """Gaps (%) per seed and their means for the four policies."""
    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            cfg = RunConfig.from_run_config({
                "learner": "pool", "env-id": "fedqhd/Inventory-v0", "seed": seed,
                "num-server-rounds": 1, "pool-rho": rho, "min-nodes": clients,
                "output-dir": tmp, **keys})
            grid = InProcessGrid([client_app] * clients, run_config=cfg.to_run_config())
            _, out_dir = run_federation(grid, cfg)
            row = json.loads((out_dir / "results.json").read_text())["rounds"][-1]
            pooled_cfg = cfg.replace(pool_trajectories=cfg.pool_trajectories * clients)
            counts, _ = pl.release(pooled_cfg, 0, pl.ClientPrivacy.of(pooled_cfg, {}))
            pooled = pl.GapEvaluator(cfg)(pl.fit(pooled_cfg, counts))[C.GAP]
            rows.append({"seed": seed, "federated": row[C.GAP], "lone": row[C.GAP_OWN],
                         "informed": row[C.GAP_INFORMED], "pooled": pooled})
    keys_ = [k for k in rows[0] if k != "seed"]
    means: dict[str, float] = {k: float(np.mean([r[k] for r in rows])) for k in keys_}
    stds = {k: float(np.std([r[k] for r in rows])) for k in means}
    diff = np.array([r["federated"] - r["lone"] for r in rows])  # paired, same seed
    means["federated-minus-lone"], stds["federated-minus-lone"] = diff.mean(), diff.std()
    means["seeds-federated-better"] = int(np.sum(diff < 0))
    return {"clients": clients, "rho": rho, "keys": keys, "mean": means, "std": stds,
            "runs": rows}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=5)
    p.add_argument("--rho", type=float, default=1.0)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--trajectories", type=int, default=1000)
    a = p.parse_args(argv)
    res = study(a.clients, a.rho, a.seeds, **{"pool-trajectories": a.trajectories})
    print(json.dumps({k: res[k] for k in ("clients", "rho", "mean", "std")}, indent=1))


if __name__ == "__main__":
    main()
