"""Bytes of a node's online state in ``context.state`` at the end of a 600-episode CartPole
run (per-task table, seed 42): each client's snapshot at its final buffer size
(``min(capacity, per-episode x 600)`` rows), as ``fqi_online.save_node`` writes it."""

from fedqhd.config import RunConfig
from fedqhd.learners.fqi_online import _new_client
from fedqhd.strategies import contract as C

for enc in ("shared", "heterogeneous"):
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "CartPole-v1",
                                     "encoder": enc, "seed": 42})
    for pid in range(5 if enc == "heterogeneous" else 1):
        cl, _ = _new_client(cfg, pid, 5)
        cl.size = min(cl.capacity, cfg.online_per_episode * 600)
        cl.episode_returns = [0.0] * 600
        arrays, _ = cl.snapshot()
        rec = C.to_array_record(arrays)
        total = sum(len(rec[k].data) for k in rec.keys())
        print(f"{enc} pid {pid}: D {cl.dim}, capacity {cl.capacity}, {cl.form}, "
              f"rows {cl.size}: state {total / 1e6:.2f} MB, of which statistics "
              f"{arrays['statistics'].nbytes / 1e6:.2f} MB")
