"""The ClientApp: fits ridge on its own data and replies what the strategy asks for.

The reply keys are fedqhd's contract (docs/strategies.md): ``arrays`` / ``readout`` for
FedQHDAvg; ``gram``, ``phi-y``, ``action-counts``, ``reward-range`` and the metric
``gram-through`` for FedQHDExact; every reply carries ``num-examples`` > 0 (its weight).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from task import client_data, mse, ridge_fit

from fedqhd.strategies import contract as C

app = ClientApp()


def _data(context: Context) -> tuple[int, np.ndarray, np.ndarray]:
    pid = int(context.node_config["partition-id"])
    x, y = client_data(pid, int(context.run_config["seed"]), int(context.run_config["dim"]))
    return pid, x, y


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid, x, y = _data(context)
    arrays = C.from_array_record(msg.content[C.ARRAYS])
    metrics = {C.NUM_EXAMPLES: len(y), C.PARTITION_ID: pid}
    if C.STATS_REQUEST in arrays:  # FedQHDExact: ridge sufficient statistics (one "action")
        have = int(arrays[C.STATS_REQUEST][0])
        out = {C.PHI_Y: (x.T @ y)[:, None], C.ACTION_COUNTS: np.array([float(len(y))]),
               C.REWARD_RANGE: np.array([y.min(), y.max()])}
        if have < len(y):  # the server's Gram lacks our examples: send it once
            out[C.GRAM] = C.pack_upper((x.T @ x)[None])
            metrics[C.GRAM_THROUGH] = len(y)
    else:  # FedQHDAvg: our own ridge readout
        readout = ridge_fit(x, y, float(context.run_config["ridge"]))
        out = {C.READOUT: readout}
        metrics["train-mse"] = mse(x, y, readout)
    content = RecordDict({C.ARRAYS: C.to_array_record(out), C.METRICS: MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """A non-RL evaluation reply: ``num-examples`` (weight) and any numbers."""
    pid, x, y = _data(context)
    readout = C.from_array_record(msg.content[C.ARRAYS])[C.READOUT]
    metrics = {C.NUM_EXAMPLES: len(y), C.PARTITION_ID: pid, "mse": mse(x, y, readout)}
    return Message(content=RecordDict({C.METRICS: MetricRecord(metrics)}), reply_to=msg)
