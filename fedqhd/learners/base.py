"""What a learner gives the federation: the contract between the apps and a learner.

A learner plays the part of ``task.py`` in Flower's examples: the ServerApp and
the ClientApp both import it and never each other. The ServerApp asks it for a
:class:`ServerPlan` (strategy, first global arrays, server-side evaluation, run
facts), a log line per round and a final report; the ClientApp hands it each
train and evaluate message's arrays and gets back the reply's arrays and metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp.strategy import Strategy

from fedqhd.config import RunConfig
from fedqhd.strategies import contract as C

Arrays = dict[str, np.ndarray]
Metrics = dict[str, float]


@dataclass
class ServerPlan:
    """Everything the ServerApp needs from a learner to run rounds.

    Attributes
    ----------
    strategy : Strategy
        A fedqhd function-space strategy, possibly wrapped (privacy screen); it
        exposes ``last_train_metrics`` and ``last_evaluate_metrics``.
    initial_arrays : ArrayRecord
        The global record sent in round 1.
    evaluate : callable or None
        Server-side evaluation of the global arrays after each round (``eval-every``).
    run_info : dict
        Facts recorded in ``run_config.json`` (shapes, anchor layout).
    round_metrics : callable or None
        Figures of the round's replies added to every round's row, whether or not the
        round evaluates (cheap: no episodes), e.g. the paper's metric.
    """

    strategy: Strategy
    initial_arrays: ArrayRecord
    evaluate: Callable[[ArrayRecord], MetricRecord | None] | None = None
    run_info: dict[str, Any] = field(default_factory=dict)
    round_metrics: Callable[[], dict[str, float]] | None = None


@dataclass(frozen=True)
class Curves:
    """What a run's ``learning_curve.png`` shows: per-round metrics of the left panel
    (``(key, legend label)``; a ``band`` key draws +- that metric around the first line),
    and the diagnostics of the right one (the first key present in the rows)."""

    ylabel: str
    lines: tuple[tuple[str, str], ...]
    band: tuple[str, str] | None = None
    diagnostics: tuple[tuple[str, str], ...] = ()


RETURN_CURVES = Curves(
    "greedy return", ((C.RETURN_MEAN, "greedy return, mean over episodes"),),
    band=(C.RETURN_STD, "+- std over evaluation episodes"),
    diagnostics=((C.BELLMAN_RESIDUAL, "RMS Bellman residual (clients)"),
                 (C.PROJECTION_RESIDUAL, "teacher projection residual")))


class Learner(Protocol):
    """One entry of the learner registry (:mod:`fedqhd.learners`)."""

    name: str
    log_label: str  #: how the round's log line starts ("fedqhd round 3/20: ...")
    curves: Curves  #: what the run's learning-curve figure plots

    def title(self, cfg: RunConfig) -> str:
        """The figure's title: the task and what learned it."""

    def check_config(self, cfg: RunConfig) -> str | None:
        """A problem with ``cfg`` for this learner (names the key), or ``None``."""

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        """Strategy, first arrays and server evaluation of a run."""

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        """The log line of a finished round (its results row)."""

    def final_report(self, cfg: RunConfig, plan: ServerPlan, rows: list[dict[str, Any]]
                     ) -> dict[str, Any] | None:
        """Extra entries for ``results.json``'s ``final`` (e.g. privacy ledgers)."""

    def final_line(self, final: dict[str, Any]) -> str:
        """The log line of the run's end (its ``final`` entry)."""

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        """A client's train step: the reply's arrays and metrics."""

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        """A client's evaluation of the global model: the reply's metrics."""


def reply_counts_text(row: dict[str, Any]) -> str:
    """The reply counts that end a round's log line."""
    return (f"replies ok {row.get(C.REPLIES_OK, 0)} failed {row.get(C.REPLIES_FAILED, 0)} "
            f"rejected {row.get(C.REPLIES_REJECTED, 0)}")


def greedy_final_line(final: dict[str, Any]) -> str:
    """The end-of-run log line of learners whose ``final`` is a greedy return."""
    def value(key: str) -> float:  # 0.0 is a value (one evaluation episode: std 0)
        got = final.get(key)
        return float("nan") if got is None else float(got)

    line = (f"final greedy return {value('return-mean'):.1f} +- "
            f"{value('return-std'):.1f} after {final.get('round')} rounds")
    ref = final.get(REFERENCE)
    if isinstance(ref, dict):
        line += (f" (references: uniform random {float(ref['random-mean']):.1f}, best constant "
                 f"action {ref['best-constant-action']} {float(ref['best-constant-mean']):.1f})")
    return line


#: ``results.json``'s ``final`` entry: returns of a uniform-random and of every
#: constant-action policy on the task (:func:`fedqhd.envs.reference.reference_returns`)
REFERENCE = "reference"
#: episodes of each reference policy
REFERENCE_EPISODES = 20


def reference_report(cfg: RunConfig) -> dict[str, Any]:
    """The run's reference returns (``final["reference"]``): what a uniform-random policy
    and the best constant action score on the task, on the server's evaluation episode
    seeds (the greedy policy's first ``eval-episodes`` are the same episodes), so a user of
    any env can tell whether the learned policy is any good."""
    from fedqhd.envs.reference import reference_returns
    from fedqhd.seeding import SERVER, evaluation_seed

    ref = reference_returns(cfg.env_id, REFERENCE_EPISODES,
                            seed=evaluation_seed(cfg.seed, SERVER))
    return {REFERENCE: ref.to_dict()}


def env_problem(learner: str, env_ids: tuple[str, ...], env_id: str) -> str | None:
    """The config error of a learner run on a task it does not support, or ``None``."""
    if env_id in env_ids:
        return None
    return (f"run-config key 'learner' = {learner!r} needs 'env-id' in {list(env_ids)}, "
            f"got {env_id!r}")


def partition(context: Context) -> tuple[int, int]:
    """This node's (partition-id, num-partitions) from its node config."""
    return int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
