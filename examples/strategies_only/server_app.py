"""The ServerApp: FedQHDAvg, then FedQHDExact, each aggregate checked against numpy.

The checks recompute every client's data from the seed (synthetic data: only a test
can do this) and write ``result-file``; a failed check ends the run with an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Result
from task import client_data, mse, ridge_fit

from fedqhd.strategies import FedQHDAvg, FedQHDExact
from fedqhd.strategies import contract as C
from fedqhd.strategies.stale import warn_if_stale_clientapp

app = ServerApp()
TOLERANCE = 1e-8


def final_readout(result: Result, initial: np.ndarray, name: str) -> np.ndarray:
    """The last aggregated readout, or ``initial`` when no round aggregated anything:
    Flower's ``Result.arrays`` is then an EMPTY ArrayRecord, not the initial arrays."""
    if C.READOUT not in result.arrays:
        print(f"strategies_only: no {name} round aggregated anything (every train reply "
              "was left out); keeping the initial model")
        return initial
    return result.arrays[C.READOUT].numpy()


@app.main()
def main(grid: Grid, context: Context) -> None:
    warn_if_stale_clientapp(Path(__file__).parent)  # a SuperLink started in another app
    cfg = context.run_config
    seed, dim, ridge = int(cfg["seed"]), int(cfg["dim"]), float(cfg["ridge"])
    rounds = int(cfg["num-server-rounds"])
    n_nodes = len(list(grid.get_node_ids()))
    data = [client_data(pid, seed, dim) for pid in range(n_nodes)]
    sizes = np.array([len(y) for _, y in data], dtype=float)
    share = sizes / sizes.sum()  # each client's weight: its num-examples

    # FedQHDAvg: the size-weighted mean of the clients' ridge readouts
    avg = FedQHDAvg(fraction_evaluate=1.0, min_available_nodes=n_nodes,
                    min_train_nodes=n_nodes, min_evaluate_nodes=n_nodes)
    initial = np.zeros((dim, 1))
    result = avg.start(grid, C.to_array_record({C.READOUT: initial}), num_rounds=rounds)
    averaged = final_readout(result, initial, "FedQHDAvg")
    expected = sum(p * ridge_fit(x, y, ridge) for p, (x, y) in zip(share, data, strict=True))
    evaluated = result.evaluate_metrics_clientapp[rounds]
    expected_mse = sum(p * mse(x, y, averaged) for p, (x, y) in zip(share, data, strict=True))

    # FedQHDExact: one round = ridge on the pooled data (unbounded targets: plain regression)
    exact = FedQHDExact(dim, 1, gamma=0.0, ridge=ridge, bounded=False,
                        min_available_nodes=n_nodes, min_train_nodes=n_nodes)
    pooled_result = exact.start(grid, C.to_array_record({C.READOUT: initial}), num_rounds=1)
    pooled = final_readout(pooled_result, initial, "FedQHDExact")
    x_all, y_all = (np.concatenate(parts) for parts in zip(*data, strict=True))

    checks = {
        "avg-aggregated": C.READOUT in result.arrays,
        "exact-aggregated": C.READOUT in pooled_result.arrays,
        "avg-error": float(np.abs(averaged - expected).max()),
        "avg-replies-ok": int(result.train_metrics_clientapp[rounds][C.REPLIES_OK]),
        "evaluate-mse-error": float(abs(float(evaluated["mse"]) - expected_mse)),
        "evaluate-replies-ok": int(evaluated[f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}"]),
        "exact-error": float(np.abs(pooled - ridge_fit(x_all, y_all, ridge)).max()),
        "exact-clients": int(pooled_result.train_metrics_clientapp[1][C.EXACT_CLIENTS]),
    }
    ok = (checks["avg-aggregated"] and checks["exact-aggregated"]
          and checks["avg-error"] < TOLERANCE and checks["exact-error"] < TOLERANCE
          and checks["evaluate-mse-error"] < TOLERANCE
          and checks["avg-replies-ok"] == checks["evaluate-replies-ok"] == n_nodes
          and checks["exact-clients"] == n_nodes)
    out = Path(str(cfg["result-file"]) or "strategies_only.json")
    out.write_text(json.dumps({"ok": ok, "nodes": n_nodes, "seed": seed, **checks}, indent=2))
    print(f"strategies_only: {'ok' if ok else 'FAILED'} {checks} -> {out}")
    if not ok:
        raise RuntimeError(f"an aggregate differs from its numpy reference: {checks}")
