"""The POOL learner inside the federation: one private release per client, then only
post-processing.

A client of a ``learner = "pool"`` run owns a shard of inventory trajectories
(generated deterministically from (seed, partition-id)). On its first message it
counts them and releases the counts ONCE under its own rho-zCDP
(:func:`fedqhd.pool.client_release`), charging its :class:`PrivacyLedger`; the
noisy counts and the ledger go into the node's ``context.state`` and the raw
trajectories are dropped. Every later step -- POOL's fit, the values on the
server's anchor points, the teacher-informed policy -- is computed from that
stored release only, so it costs no further privacy (post-processing).

Anchors are (state, action) points ``b`` of shape (m, w + d) in [0, 1]^(w+d); a
client releases ``Q[k, h] = Qbar_h(b_k)``, POOL's pessimistic Q-value at stage h
in scaled reward units (rewards mapped to [0, 1] per stage, so
``0 <= Q[:, h] <= H - h``).

What a client does with the teacher (the weighted mean of every client's
anchor values): it compiles the teacher back into POOL's own function class
(per-zone least squares on the zone interpolation weights, which are linear in
the zone values), with its own values as the prior where no anchor informs a
zone, and acts greedily on ``own + trust * (compiled - own)``. The same
compilation with a zero prior (POOL's pessimistic fallback) gives the server
the federated policy.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context

from fedqhd.config import RunConfig
from fedqhd.envs.inventory import (
    InventoryModel,
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.pool import (
    NoisyCounts,
    PoolLearner,
    client_release,
    count_visits,
    exact_counts,
    make_pool_learner,
    make_zoning,
)
from fedqhd.pool.zones import GridZones, NormZones, StateCells
from fedqhd.privacy import PrivacyLedger, make_noise_source
from fedqhd.strategies import contract as C

STATE_COUNTS = "pool-noisy-counts"  #: context.state ArrayRecord: the released counts
STATE_RELEASE = "pool-release"      #: context.state ConfigRecord: release facts and ledger
COMPILE_RIDGE = 1e-3                #: ridge of the teacher compilation (toward the prior)


class NonPrivateRefusedError(RuntimeError):
    """A client with its noise switched off, in a run not marked non-private."""


# ------------------------------------------------------------------ public set-up
def inventory_model(cfg: RunConfig) -> InventoryModel:
    """The inventory MDP every client and the server share (costs drawn from the seed)."""
    return make_inventory_model(cfg.pool_products, cfg.pool_horizon, cfg.pool_dynamics,
                                cfg.pool_demand, random_state=cfg.seed)


def zoning(cfg: RunConfig) -> tuple[NormZones | GridZones, StateCells]:
    """POOL's zones and next-state cells: public, identical on every node."""
    w = cfg.pool_products
    return make_zoning(w, w, cfg.pool_horizon, cfg.pool_zones, cfg.pool_lambda,
                       n_cells=cfg.pool_cells)


def _stream(seed: int, pid: int, tag: int) -> int:
    return int(np.random.SeedSequence([seed, pid, tag]).generate_state(1)[0])


@dataclass(frozen=True)
class ClientPrivacy:
    """A client's privacy settings: run config, overridden by its node config."""

    rho: float
    budget: float
    noise: str
    delta: float

    @classmethod
    def of(cls, cfg: RunConfig, node_config: dict[str, Any]) -> ClientPrivacy:
        noise = str(node_config.get("noise", cfg.pool_noise))
        if noise not in ("numpy", "opendp", "none"):
            raise ValueError(f"node config 'noise' = {noise!r}: expected numpy, opendp or none")
        rho = float(node_config.get("rho", cfg.pool_rho))
        if not rho > 0 or not math.isfinite(rho):
            raise ValueError(f"node config 'rho' = {rho!r}: expected a positive finite number")
        return cls(rho, float(node_config.get("rho-budget", cfg.pool_rho_budget)), noise,
                   cfg.pool_delta)


# ------------------------------------------------------------ the one release
def release(cfg: RunConfig, pid: int, privacy: ClientPrivacy
            ) -> tuple[NoisyCounts, PrivacyLedger]:
    """Generate the client's shard, count it and release the counts once.

    Raises :class:`NonPrivateRefusedError` for ``noise = "none"`` unless the run is
    marked ``non-private``, and :class:`~fedqhd.privacy.BudgetExceededError` when
    rho exceeds the client's budget (checked before any noise is drawn).
    """
    if privacy.noise == "none" and not cfg.non_private:
        raise NonPrivateRefusedError(
            f"POOL client partition {pid}: noise is switched off (noise='none'), which would "
            "release exact counts of private trajectories; refused because the run is not "
            "marked non-private (set run-config non-private=true for a non-private baseline)")
    model = inventory_model(cfg)
    zones, cells = zoning(cfg)
    data = generate_dataset(model, cfg.pool_trajectories, random_state=_stream(cfg.seed, pid, 1))
    ledger = PrivacyLedger(privacy.budget, privacy.delta, client_id=f"partition-{pid}")
    if privacy.noise == "none":
        return exact_counts(count_visits(data.states, data.actions, zones, cells)), ledger
    source = make_noise_source(privacy.noise, random_state=_stream(cfg.seed, pid, 2))
    counts = client_release(data, zones, cells, privacy.rho, source, ledger)
    ledger.entries[-1]["secure"] = source.secure
    return counts, ledger


def node_release(context: Context, cfg: RunConfig) -> tuple[NoisyCounts, dict[str, float]]:
    """This node's released counts and ledger metrics, released on first use and then
    read back from ``context.state`` (the raw shard is never regenerated)."""
    if STATE_COUNTS not in context.state:
        pid = int(context.node_config["partition-id"])
        counts, ledger = release(cfg, pid, ClientPrivacy.of(cfg, dict(context.node_config)))
        context.state[STATE_COUNTS] = C.to_array_record({"n_sa": counts.n_sa,
                                                         "n_sas": counts.n_sas})
        context.state[STATE_RELEASE] = ConfigRecord({
            "rho": counts.rho if counts.private else -1.0, "sigma": counts.sigma,
            "noise": counts.noise, "partition-id": pid,
            "metrics": json.dumps(ledger_metrics(counts, ledger, pid, cfg)),
            "ledger": ledger.to_json()})
    return stored_counts(context.state[STATE_COUNTS], context.state[STATE_RELEASE], cfg)


def stored_counts(arrays: ArrayRecord, facts: ConfigRecord, cfg: RunConfig
                  ) -> tuple[NoisyCounts, dict[str, float]]:
    """Rebuild :class:`NoisyCounts` from the node state (zones and cells are public)."""
    zones, cells = zoning(cfg)
    a = C.from_array_record(arrays)
    expected = (cfg.pool_horizon, zones.n_zones, cells.n_cells)
    if a["n_sas"].shape != expected:
        raise ValueError(f"stored POOL counts have shape {a['n_sas'].shape}, the run config "
                         f"needs {expected}")
    rho = float(facts["rho"])
    counts = NoisyCounts(a["n_sa"], a["n_sas"], zones, cells, rho if rho > 0 else math.inf,
                         float(facts["sigma"]), str(facts["noise"]))
    return counts, json.loads(str(facts["metrics"]))


def ledger_metrics(counts: NoisyCounts, ledger: PrivacyLedger, pid: int, cfg: RunConfig
                   ) -> dict[str, float]:
    """What a reply says about the client's privacy (numbers only, as metrics must be).

    A non-private client reports ``private = 0`` and no epsilon (it has none).
    ``num-transitions`` is n * H: n is public under replace-one neighbouring datasets.
    ``noise-secure`` is 1 only if every release used a secure sampler.
    """
    out: dict[str, float] = {C.PARTITION_ID: pid, C.PRIVATE: int(counts.private),
                             C.NUM_TRANSITIONS: cfg.pool_trajectories * cfg.pool_horizon}
    if counts.private:
        out.update({C.RHO_SPENT: ledger.rho_spent, C.RHO_BUDGET: ledger.budget_rho,
                    C.DELTA: ledger.delta, C.EPSILON_CKS: ledger.epsilon_cks(),
                    C.EPSILON_EXACT: ledger.epsilon_exact(), C.NOISE_SIGMA: counts.sigma,
                    C.NOISE_SECURE: int(all(e.get("secure", False) for e in ledger.entries))})
    return out


# ------------------------------------------------------------- post-processing
def fit(cfg: RunConfig, counts: NoisyCounts) -> PoolLearner:
    """POOL on the released counts (post-processing)."""
    return make_pool_learner(inventory_model(cfg), delta=cfg.pool_delta,
                             random_state=cfg.seed).fit(counts)


def anchor_values(learner: PoolLearner, anchors: np.ndarray) -> np.ndarray:
    """``Q[k, h] = Qbar_h(anchors[k])``, shape (m, H): what a client releases."""
    return np.stack([learner.q_values(h, anchors) for h in range(learner.horizon_)], axis=1)


def empty_learner(cfg: RunConfig) -> PoolLearner:
    """POOL fitted on zero counts: every zone unknown, Q = 0 (the pessimistic prior)."""
    zones, cells = zoning(cfg)
    H = cfg.pool_horizon
    zero = NoisyCounts(np.zeros((H, zones.n_zones)), np.zeros((H, zones.n_zones, cells.n_cells)),
                       zones, cells, math.inf, 0.0, "none")
    return fit(cfg, zero)


def adopt_teacher(learner: PoolLearner, anchors: np.ndarray, teacher: np.ndarray,
                  trust: float = 1.0, ridge: float = COMPILE_RIDGE
                  ) -> tuple[PoolLearner, float]:
    """A copy of ``learner`` whose zone values follow ``teacher`` (m, H) on ``anchors``.

    Q inside a zone is ``sum_j c_j(b) qbar_j`` with weights ``c_j`` that do not depend
    on ``qbar``; so per stage and zone, ``qbar = argmin sum_k (c(b_k) . qbar - T_k)^2
    + ridge ||qbar - qbar_own||^2`` is a small linear solve. Zones without anchors
    keep the learner's own values. Returns (the copy, RMS residual on the anchors).
    """
    out = copy.copy(learner)
    out.qbar_, out.coef_ = list(learner.qbar_), list(learner.coef_)
    zones = learner.zones_
    sq = 0.0
    for h in range(learner.horizon_):
        own = learner.qbar_[h]
        n_z, n_p = own.shape
        weights = np.stack([zones.interpolate(h, zones.interpolator(h, np.eye(n_p)[j]
                                                                    * np.ones((n_z, 1))),
                                              anchors) for j in range(n_p)], axis=1)
        ids = np.arange(n_z, dtype=float)[:, None] * np.ones((1, n_p))
        zone = np.rint(zones.interpolate(h, zones.interpolator(h, ids), anchors)).astype(int)
        gram = np.zeros((n_z, n_p, n_p))
        rhs = np.zeros((n_z, n_p))
        np.add.at(gram, zone, weights[:, :, None] * weights[:, None, :])
        np.add.at(rhs, zone, weights * teacher[:, h, None])
        solved = np.linalg.solve(gram + ridge * np.eye(n_p), (rhs + ridge * own)[..., None])[..., 0]
        qbar = np.clip(own + trust * (solved - own), 0.0, learner.horizon_ - h)
        out.qbar_[h] = qbar
        out.coef_[h] = zones.interpolator(h, qbar)
        sq += float(np.sum((out.q_values(h, anchors) - teacher[:, h]) ** 2))
    return out, math.sqrt(sq / teacher.size)


# ------------------------------------------------------------------ evaluation
class GapEvaluator:
    """Relative gap ``(c - c*) / c*`` in % of policies on the shared inventory MDP,
    all scored on the same simulated demands (common random numbers)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.model = inventory_model(cfg)
        self.episodes = cfg.pool_eval_episodes
        self.seed = _stream(cfg.seed, 2**31 - 1, 3)
        reference, _ = optimal_policy(self.model)
        self.c_star = self.model.rollout_cost(reference, self.episodes, self.seed)

    def __call__(self, learner: PoolLearner) -> dict[str, float]:
        cost = self.model.rollout_cost(learner.act, self.episodes, self.seed)
        return {C.GAP: relative_gap(cost, self.c_star), C.COST: cost, C.C_STAR: self.c_star,
                C.RETURN_MEAN: -cost}


# --------------------------------------------------------------- message handlers
def train_reply(context: Context, cfg: RunConfig, arrays: dict[str, np.ndarray]
                ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Arrays and metrics of a train reply: the client's own anchor values (never the
    teacher-informed ones, so a release depends on its noisy counts alone) and its
    ledger; with a teacher, also how closely the client's compiled policy follows it."""
    counts, metrics = node_release(context, cfg)
    learner = fit(cfg, counts)
    anchors = arrays[C.ANCHORS]
    if C.TEACHER in arrays:
        _, residual = adopt_teacher(learner, anchors, arrays[C.TEACHER], cfg.pool_trust)
        metrics[C.PROJECTION_RESIDUAL] = residual
    return {C.Q_ANCHORS: anchor_values(learner, anchors)}, metrics


def evaluate_metrics(context: Context, cfg: RunConfig, arrays: dict[str, np.ndarray]
                     ) -> dict[str, float]:
    """Gap of the client's own POOL policy (alone) and of its teacher-informed policy.

    Needs the simulator, so it is a simulation-only measurement; nothing private is
    used beyond the stored release.
    """
    counts, metrics = node_release(context, cfg)
    learner = fit(cfg, counts)
    evaluator = _evaluator(cfg)
    out = {C.NUM_TRANSITIONS: metrics[C.NUM_TRANSITIONS], C.PRIVATE: metrics[C.PRIVATE],
           C.GAP_OWN: evaluator(learner)[C.GAP]}
    if C.TEACHER in arrays:
        informed, _ = adopt_teacher(learner, arrays[C.ANCHORS], arrays[C.TEACHER],
                                    cfg.pool_trust)
        out[C.GAP_INFORMED] = evaluator(informed)[C.GAP]
    return out


_EVALUATORS: dict[RunConfig, GapEvaluator] = {}


def _evaluator(cfg: RunConfig) -> GapEvaluator:
    """One evaluator (c* and its demands) per run config and process."""
    if cfg not in _EVALUATORS:
        _EVALUATORS.clear()
        _EVALUATORS[cfg] = GapEvaluator(cfg)
    return _EVALUATORS[cfg]
