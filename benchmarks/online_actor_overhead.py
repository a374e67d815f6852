"""CPU seconds an actor pool adds to the online app, measured without Ray (2026-11-30).

Flower's Ray backend pickles a node's Context (its ``context.state``: the online client)
to whichever actor is free and back, for each of the node's messages. This runs the app
in process with ``--actors`` emulated actors (a seeded coin picks one per message, each
with its own process cache ``fqi_online._CLIENTS``) and the Context pickled there and
back as Ray does, so what the pool costs is separated from Ray's own start-up and
from the machine's load: the learner's CPU seconds, the pickling's, the bytes
pickled, and the final curve (which must not change). ``--actors 0``: plain in process.

    PYTHONPATH=<checkout> OMP_NUM_THREADS=1 python benchmarks/online_actor_overhead.py \\
        --encoder heterogeneous --actors 2
"""

from __future__ import annotations

import argparse
import json
import pickle
import random
import tempfile
import time
from typing import Any

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.learners import fqi_online
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid


class Pool:
    """The ClientApp behind ``actors`` emulated processes, Context pickled both ways."""

    def __init__(self, actors: int, seed: int) -> None:
        self.caches: list[dict[Any, Any]] = [{} for _ in range(actors)]
        self.coin = random.Random(seed)
        self.grid: InProcessGrid | None = None
        self.pickle_s = 0.0
        self.bytes = 0
        self.messages = 0

    def _copy(self, context: Any) -> Any:
        start = time.process_time()
        blob = pickle.dumps(context, protocol=5)
        copy = pickle.loads(blob)
        self.pickle_s += time.process_time() - start
        self.bytes += len(blob)
        return copy

    def __call__(self, msg: Any, context: Any) -> Any:
        assert self.grid is not None
        fqi_online._CLIENTS = self.caches[self.coin.randrange(len(self.caches))]
        self.messages += 1
        there = self._copy(context)
        reply = client_app(msg, there)
        self.grid.contexts[msg.metadata.dst_node_id] = self._copy(there)
        return reply


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--encoder", default="heterogeneous")
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--clients", type=int, default=5)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as out:
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": args.env,
                                         "encoder": args.encoder, "seed": args.seed,
                                         "output-dir": out})
        pool = Pool(args.actors, args.seed) if args.actors else None
        grid = InProcessGrid([pool or client_app] * args.clients,
                             run_config=cfg.to_run_config())
        if pool is not None:
            pool.grid = grid
        start, wall = time.process_time(), time.perf_counter()
        _, run_dir = run_federation(grid, cfg)
        cpu, wall = time.process_time() - start, time.perf_counter() - wall
        final = json.loads((run_dir / "results.json").read_text())["final"]
        rounds = json.loads((run_dir / "results.json").read_text())["rounds"]
    print(json.dumps({
        "encoder": args.encoder, "actors": args.actors, "cpu-s": round(cpu, 2),
        "wall-s": round(wall, 2),
        "pickle-cpu-s": round(pool.pickle_s, 2) if pool else 0.0,
        "messages": pool.messages if pool else None,
        "mb-pickled-per-message": round(pool.bytes / 2 / pool.messages / 1e6, 2)
        if pool else None,
        "train-return-last100": [r.get("train-return-last100") for r in rounds],
        "return-mean": final["return-mean"]}))


if __name__ == "__main__":
    main()
