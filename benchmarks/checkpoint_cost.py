"""Per-round cost of the run files (issue 11): appending a row to rounds.jsonl (vs
rewriting results.json whole, as before) and writing the checkpoint, at the default
sizes (D = 2000, CartPole's 2 actions, 10 clients).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/checkpoint_cost.py [--rows 100000]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from fedqhd.files import append_line, atomic_write
from fedqhd.server.checkpoint import Checkpoint, capture_rng

ROW = {"round": 1, "return-mean": 123.4, "return-std": 5.6, "bellman-residual": 0.61,
       "consensus-gap": 0.5, "num-transitions": 1260, **{f"replies-{k}": 10 for k in
       ("sampled", "received", "ok", "failed", "rejected", "timed-out", "norm-refused",
        "weight-capped", "identity-refused")}, "clients-averaged": 10, "wall-time-s": 1.0}


def _time(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(dir=".") as tmp:
        folder = Path(tmp)
        rows = [dict(ROW, round=r) for r in range(1, args.rows + 1)]
        whole = _time(lambda: atomic_write(folder / "results.json",
                                           json.dumps({"rounds": rows}, indent=2)), 3)
        append = _time(lambda: append_line(folder / "rounds.jsonl", json.dumps(ROW)), 20)
        cfg = {"seed": 0}
        readout = rng.normal(size=(args.dim, 2))
        avg = Checkpoint(1, cfg, {"readout": readout},
                         {"latest": {("partition", i): (rng.normal(size=(args.dim, 2)), 126.0)
                                     for i in range(10)}}, capture_rng(), 1, 1)
        exact = Checkpoint(1, cfg, {"readout": readout},
                           {"grams": rng.normal(size=(2, args.dim, args.dim))}, capture_rng(), 1, 1)
        t_avg = _time(lambda: avg.save(folder))
        size_avg = (folder / "checkpoint.npz").stat().st_size
        t_exact = _time(lambda: exact.save(folder), 3)
        size_exact = (folder / "checkpoint.npz").stat().st_size
    print(f"results.json of {args.rows} rows rewritten whole: {whole:.3f} s")
    print(f"one row appended to rounds.jsonl (fsync): {append * 1e3:.2f} ms")
    print(f"checkpoint, FedQHDAvg latest (10 clients, D={args.dim}): {t_avg * 1e3:.1f} ms, "
          f"{size_avg / 2**20:.2f} MiB")
    print(f"checkpoint, FedQHDExact (Grams, D={args.dim}): {t_exact * 1e3:.1f} ms, "
          f"{size_exact / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
