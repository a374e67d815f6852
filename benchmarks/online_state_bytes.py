"""Bytes of a node's online state in ``context.state`` at the end of a 600-episode CartPole
run (per-task table, seed 42): each client's snapshot at its final buffer size
(``min(capacity, per-episode x 600)`` rows, statistics filled as a real buffer fills
them: the dual kernel only holds float32 products), as ``fqi_online.save_node`` writes it,
and what the statistics would take unpacked (float64 full matrices, before 2026-11-30)."""

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.learners.fqi_online import _new_client
from fedqhd.strategies import contract as C

for enc in ("shared", "heterogeneous"):
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "CartPole-v1",
                                     "encoder": enc, "seed": 42})
    for pid in range(5 if enc == "heterogeneous" else 1):
        cl, _ = _new_client(cfg, pid, 5)
        n = min(cl.capacity, cfg.online_per_episode * 600)
        states = np.random.default_rng(pid).uniform(-0.2, 0.2, size=(n, 4))
        cl.append(states, np.arange(n) % 2, np.ones(n), states, np.zeros(n))
        cl.episode_returns = [0.0] * 600
        arrays, _ = cl.snapshot()
        rec = C.to_array_record(arrays)
        total = sum(len(rec[k].data) for k in rec.keys())
        stats = next(v for k, v in arrays.items() if k.startswith("statistics"))
        full = cl.gram.nbytes if cl.form == "primal" else 8 * n * n
        print(f"{enc} pid {pid}: D {cl.dim}, capacity {cl.capacity}, {cl.form}, "
              f"rows {cl.size}: state {total / 1e6:.2f} MB, of which statistics "
              f"{stats.nbytes / 1e6:.2f} MB ({stats.dtype}; unpacked {full / 1e6:.2f} MB)")
