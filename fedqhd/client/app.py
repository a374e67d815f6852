"""The fedqhd ClientApp: Flower handlers only; the run's learner does the work.

Only what the learner returns leaves the client: for ``fqi`` a readout (shared
encoder) or Q-values on the server's anchor states (heterogeneous encoders), or, for
the pooled oracle, sufficient statistics (per-action Grams, then ``Phi^T y`` per
sweep), for ``pool`` values on anchor points computed from one noisy release. Each learner
(:mod:`fedqhd.learners`) reads the node's private shard (node config
``data-dir``, else run config ``data-dir``, else generated from (seed,
partition-id)) and keeps what it needs between rounds in ``context.state``.
Under Ray, each ClientApp process first limits its BLAS threads to the CPUs Ray gave
it (:mod:`fedqhd.threads`); every train reply reports them (``blas-threads``).
A handler that raises replies an error of one line, its exception's type and message
(:func:`fedqhd.server.failures.reply_error`): Flower would log a traceback per client per
round, and the server logs the reason anyway.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedqhd.config import RunConfig
from fedqhd.learners import get_learner, parse_run_config
from fedqhd.server.failures import reply_error
from fedqhd.strategies import contract as C
from fedqhd.threads import limit_client_threads

app = ClientApp()

Handler = Callable[[Message, Context], Message]


def replies_errors(handler: Handler) -> Handler:
    """``handler``, replying :func:`reply_error` instead of raising."""
    @functools.wraps(handler)
    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except Exception as exc:  # noqa: BLE001 (every failure goes back as a reply)
            return reply_error(msg, exc)
    return wrapped


@functools.lru_cache(maxsize=4)
def _parse(items: tuple[tuple[str, Any], ...]) -> RunConfig:
    return parse_run_config(dict(items))


def run_config(context: Context) -> RunConfig:
    """The node's run config, parsed once per process and config: a Ray actor handles
    thousands of messages of one run, and parsing (every key checked) took about 1 ms
    of each. RunConfig is frozen, so the one object is shared safely."""
    try:
        return _parse(tuple(sorted(context.run_config.items())))
    except TypeError:  # an unhashable value: parse it as it is
        return parse_run_config(context.run_config)


def _arrays(msg: Message) -> dict[str, np.ndarray]:
    record = msg.content[C.ARRAYS]
    if not isinstance(record, ArrayRecord):
        raise TypeError(f"message record '{C.ARRAYS}' is not an ArrayRecord")
    return C.from_array_record(record)


def _reply(msg: Message, arrays: dict[str, np.ndarray] | None,
           metrics: dict[str, float]) -> Message:
    content = RecordDict({C.METRICS: MetricRecord(dict(metrics))})
    if arrays is not None:
        content[C.ARRAYS] = C.to_array_record(arrays)
    return Message(content, reply_to=msg)


@app.train()
@replies_errors
def train(msg: Message, context: Context) -> Message:
    """The learner's local step on the global model; reply its arrays and metrics."""
    threads = limit_client_threads()  # first message of a Ray actor: its CPUs, not the host's
    cfg = run_config(context)
    learner = get_learner(cfg.learner_key)
    step: Any = learner.train
    if _requests_evaluation(msg):  # the strategy's evaluate_with_next_train
        step = getattr(learner, "evaluate_and_train", None)
        if step is None:
            raise ValueError(f"learner {cfg.learner_key!r} cannot evaluate the model a train "
                             f"message carries (config '{C.EVALUATE_RECEIVED}')")
    arrays, metrics = step(context, cfg, _arrays(msg))
    return _reply(msg, arrays, {**metrics, C.BLAS_THREADS: threads})


def _requests_evaluation(msg: Message) -> bool:
    config = msg.content.get(C.CONFIG)
    return isinstance(config, ConfigRecord) and bool(config.get(C.EVALUATE_RECEIVED, False))


@app.train(C.POOLED_SWEEP_ACTION)
@replies_errors
def pooled_sweep(msg: Message, context: Context) -> Message:
    """One sweep of the pooled-data oracle (``strategy = "pooled"``): the learner's
    sufficient statistic for the server's readout (``phi-y``), never its rows."""
    limit_client_threads()
    cfg = run_config(context)
    learner = get_learner(cfg.learner_key)
    step = getattr(learner, "pooled_sweep", None)
    if step is None:
        raise ValueError(f"learner {cfg.learner_key!r} has no pooled sweep "
                         "(strategy = 'pooled' needs learner = 'fqi', protocol = 'online')")
    arrays, metrics = step(context, cfg, _arrays(msg))
    return _reply(msg, arrays, metrics)


@app.evaluate()
@replies_errors
def evaluate(msg: Message, context: Context) -> Message:
    """The learner's evaluation of the global model on this client (metrics only)."""
    limit_client_threads()
    cfg = run_config(context)
    return _reply(msg, None, get_learner(cfg.learner_key).evaluate(context, cfg, _arrays(msg)))
