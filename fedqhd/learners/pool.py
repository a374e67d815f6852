"""The POOL learner inside the federation: one private release per client, then only
post-processing (registry entry ``pool``).

The numeric side is :mod:`fedqhd.learners.pool_federated`; this module keeps the release in
the node's ``context.state`` (raw trajectories are dropped after it), answers
train and evaluate messages, and gives the server its plan: FedQHDAnchor on
(state, action) anchor points behind a :class:`~fedqhd.strategies.PrivacyScreen`,
with the federated policy's gap against c* as the server-side evaluation and
every client's privacy ledger in the final report.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord

from fedqhd.config import RunConfig
from fedqhd.envs.inventory import ENV_ID
from fedqhd.learners.base import (
    Arrays,
    Curves,
    Metrics,
    ServerPlan,
    env_problem,
    partition,
)
from fedqhd.learners.pool_federated import (
    ClientPrivacy,
    GapEvaluator,
    adopt_teacher,
    anchor_values,
    empty_learner,
    fit,
    ledger_metrics,
    pool_anchors,
    release,
    server_policy,
    zoning,
)
from fedqhd.pool.counts import NoisyCounts
from fedqhd.strategies import FedQHDAnchor, PrivacyScreen
from fedqhd.strategies import contract as C

#: the epsilons of a reply, infinite for a client whose noise can be regenerated
EPSILON_KEYS = (C.EPSILON, C.EPSILON_CKS, C.EPSILON_EXACT)
STATE_COUNTS = "pool-noisy-counts"  #: context.state ArrayRecord: the released counts
STATE_RELEASE = "pool-release"      #: context.state ConfigRecord: release facts and ledger
ENV_IDS: tuple[str, ...] = (ENV_ID,)  #: the tasks this learner runs on


def node_release(context: Context, cfg: RunConfig) -> tuple[NoisyCounts, Metrics]:
    """This node's released counts and ledger metrics, released on first use and then
    read back from ``context.state`` (the raw shard is never regenerated)."""
    if STATE_COUNTS not in context.state:
        pid = partition(context)[0]
        counts, ledger = release(cfg, pid, ClientPrivacy.of(cfg, dict(context.node_config)))
        context.state[STATE_COUNTS] = C.to_array_record({"n_sa": counts.n_sa,
                                                         "n_sas": counts.n_sas})
        context.state[STATE_RELEASE] = ConfigRecord({
            "rho": counts.rho if counts.private else -1.0, "sigma": counts.sigma,
            "noise": counts.noise, "partition-id": pid,
            "metrics": json.dumps(ledger_metrics(counts, ledger, pid, cfg)),
            "ledger": ledger.to_json()})
    arrays, facts = context.state[STATE_COUNTS], context.state[STATE_RELEASE]
    assert isinstance(arrays, ArrayRecord) and isinstance(facts, ConfigRecord)
    return stored_counts(arrays, facts, cfg)


def stored_counts(arrays: ArrayRecord, facts: ConfigRecord, cfg: RunConfig
                  ) -> tuple[NoisyCounts, Metrics]:
    """Rebuild :class:`NoisyCounts` from the node state (zones and cells are public)."""
    zones, cells = zoning(cfg)
    a = C.from_array_record(arrays)
    expected = (cfg.pool.horizon, zones.n_zones, cells.n_cells)
    if a["n_sas"].shape != expected:
        raise ValueError(f"stored POOL counts have shape {a['n_sas'].shape}, the run config "
                         f"needs {expected}")
    rho = float(facts["rho"])  # type: ignore[arg-type]
    counts = NoisyCounts(a["n_sa"], a["n_sas"], zones, cells, rho if rho > 0 else math.inf,
                         float(facts["sigma"]), str(facts["noise"]))  # type: ignore[arg-type]
    return counts, json.loads(str(facts["metrics"]))


def reply_metrics(metrics: Metrics) -> Metrics:
    """A train reply's metrics: the ledger's, less an infinite epsilon.

    Regenerable (seeded) noise has ``epsilon = inf`` (:mod:`fedqhd.privacy.ledger`). A
    MetricRecord carries ``inf``, but fedqhd's strategies refuse a reply with any
    non-finite metric (a crafted one would poison the weighted means), so an infinite
    epsilon leaves the reply as an absent key: the reply's ``noise-reproducible = 1``
    says why, and :func:`report_ledger` writes it back as ``inf`` in the run's report.
    """
    return {k: v for k, v in metrics.items() if not (k in EPSILON_KEYS and v == math.inf)}


def report_ledger(entry: dict[str, Any]) -> dict[str, Any]:
    """A client's ledger as the run reports it: ``inf`` for the epsilons of a private
    client whose noise is regenerable (left out of its replies by :func:`reply_metrics`)."""
    if entry.get(C.PRIVATE) and entry.get(C.NOISE_REPRODUCIBLE):
        return {**entry, **dict.fromkeys(EPSILON_KEYS, math.inf)}
    return entry


_EVALUATORS: dict[RunConfig, GapEvaluator] = {}


def gap_evaluator(cfg: RunConfig) -> GapEvaluator:
    """One evaluator (c* and its demands) per run config and process."""
    if cfg not in _EVALUATORS:
        _EVALUATORS.clear()
        _EVALUATORS[cfg] = GapEvaluator(cfg)
    return _EVALUATORS[cfg]


class TeacherEvaluator:
    """Gap of the federated policy: the teacher compiled into POOL's zones with a zero
    (pessimistic) prior."""

    def __init__(self, cfg: RunConfig, anchors: np.ndarray) -> None:
        self.anchors = anchors
        self.prior = empty_learner(cfg)
        self.gap = gap_evaluator(cfg)

    def __call__(self, arrays: ArrayRecord) -> MetricRecord | None:
        if C.TEACHER not in arrays:
            return None
        policy, residual = server_policy(self.prior, self.anchors, arrays[C.TEACHER].numpy())
        return MetricRecord({**self.gap(policy), C.PROJECTION_RESIDUAL: residual})


class Pool:
    """Registry entry ``pool``."""

    name = "pool"
    log_label = "fedqhd pool"
    curves = Curves("gap to the optimal cost c* (%), lower is better",
                    ((C.GAP, "federated policy (teacher compiled)"),
                     (C.GAP_INFORMED, "clients, teacher-informed"),
                     (C.GAP_OWN, "clients alone")),
                    diagnostics=((C.PROJECTION_RESIDUAL, "teacher projection residual"),))

    def title(self, cfg: RunConfig) -> str:
        privacy = "non-private" if cfg.non_private else f"rho = {cfg.privacy_rho:g}"
        return f"{cfg.env_id}: POOL ({privacy}), {cfg.resolved_strategy} teacher"

    def final_line(self, final: dict[str, Any]) -> str:
        gap = final.get("gap-percent")
        return (f"final federated gap {gap if gap is not None else float('nan'):.1f}% after "
                f"{final.get('round')} rounds")

    def check_config(self, cfg: RunConfig) -> str | None:
        problem = env_problem(self.name, ENV_IDS, cfg.env_id)
        if problem is None and cfg.strategy == "avg":
            return ("run-config key 'learner' = 'pool' needs 'strategy' = 'anchor' or 'auto': "
                    "POOL clients release values on anchors")
        return problem

    def server_plan(self, cfg: RunConfig, **strategy_kwargs: Any) -> ServerPlan:
        anchors = pool_anchors(cfg)
        anchor = FedQHDAnchor(anchors, n_values=cfg.pool.horizon, fraction_evaluate=1.0,
                              **strategy_kwargs)
        info = {"anchors-shape": list(anchors.shape),
                "anchor-columns": "(state, action) in [0, 1]^(w+d); q-anchors[:, h] = Qbar_h",
                "non-private-run": cfg.non_private}
        return ServerPlan(PrivacyScreen(anchor, cfg.non_private), anchor.initial_arrays(),
                          TeacherEvaluator(cfg, anchors), info)

    def round_line(self, cfg: RunConfig, row: dict[str, Any]) -> str:
        nan = float("nan")
        return (f"federated gap {row.get(C.GAP, nan):.1f}% | clients alone "
                f"{row.get(C.GAP_OWN, nan):.1f}%, teacher-informed "
                f"{row.get(C.GAP_INFORMED, nan):.1f}% | replies ok {row.get(C.REPLIES_OK, 0)} "
                f"failed {row.get(C.REPLIES_FAILED, 0)} refused non-private "
                f"{row.get(C.REPLIES_REFUSED_NON_PRIVATE, 0)}")

    def final_report(self, cfg: RunConfig, plan: ServerPlan, rows: list[dict[str, Any]]
                     ) -> dict[str, Any] | None:
        screen = plan.strategy
        assert isinstance(screen, PrivacyScreen)
        ledgers = {str(pid): report_ledger(entry) for pid, entry in sorted(screen.ledgers.items())}
        return {"privacy-ledgers": ledgers, "gap-percent": rows[-1].get(C.GAP) if rows else None}

    def train(self, context: Context, cfg: RunConfig, arrays: Arrays
              ) -> tuple[Arrays | None, Metrics]:
        """The client's own anchor values (never the teacher-informed ones, so a release
        depends on its noisy counts alone) and its ledger; with a teacher, also how
        closely the client's compiled policy follows it."""
        counts, metrics = node_release(context, cfg)
        learner = fit(cfg, counts)
        anchors = arrays[C.ANCHORS]
        if C.TEACHER in arrays:
            _, residual = adopt_teacher(learner, anchors, arrays[C.TEACHER], cfg.pool.trust)
            metrics[C.PROJECTION_RESIDUAL] = residual
        return {C.Q_ANCHORS: anchor_values(learner, anchors)}, reply_metrics(metrics)

    def evaluate(self, context: Context, cfg: RunConfig, arrays: Arrays) -> Metrics:
        """Gap of the client's own POOL policy (alone) and of its teacher-informed policy.

        Needs the simulator, so it is a simulation-only measurement; nothing private is
        used beyond the stored release.
        """
        counts, metrics = node_release(context, cfg)
        learner = fit(cfg, counts)
        evaluator = gap_evaluator(cfg)
        out = {C.NUM_TRANSITIONS: metrics[C.NUM_TRANSITIONS], C.PRIVATE: metrics[C.PRIVATE],
               C.GAP_OWN: evaluator(learner)[C.GAP]}
        if C.TEACHER in arrays:
            informed, _ = adopt_teacher(learner, arrays[C.ANCHORS], arrays[C.TEACHER],
                                        cfg.pool.trust)
            out[C.GAP_INFORMED] = evaluator(informed)[C.GAP]
        return out


LEARNER = Pool()
