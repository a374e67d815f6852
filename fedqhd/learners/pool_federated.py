"""POOL as a federated learner, without Flower: the run's inventory MDP and zoning, a
client's one private release, its values on anchor points, teacher adoption, and
the gap evaluation. :mod:`fedqhd.learners.pool` wires these into Flower messages.

A client of a ``learner = "pool"`` run owns a shard of inventory trajectories
(generated deterministically from (seed, partition-id)). It counts them and
releases the counts ONCE under its own rho-zCDP (:func:`release`), charging its
:class:`~fedqhd.privacy.PrivacyLedger`; every later step -- POOL's fit, the values on
the server's anchor points, the teacher-informed policy -- is computed from that
release only, so it costs no further privacy (post-processing).

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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.envs.inventory import (
    InventoryModel,
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.node_config import NodeSettings
from fedqhd.pool.api import client_release, make_pool_learner, make_zoning
from fedqhd.pool.counts import NoisyCounts, Zoning, count_visits, exact_counts
from fedqhd.pool.learner import PoolLearner
from fedqhd.pool.zones import PostDecisionZones, StateCells
from fedqhd.privacy import PrivacyLedger, make_noise_source
from fedqhd.privacy.store import LedgerStore, data_fingerprint, ledger_dir
from fedqhd.seeding import (
    pool_anchor_rng,
    pool_data_seed,
    pool_evaluation_seed,
    pool_noise_seed,
)
from fedqhd.strategies import contract as C

COMPILE_RIDGE = 1e-3                #: ridge of the teacher compilation (toward the prior)
#: ridge of the server's compilation, toward the zero prior. The teacher is a mean of
#: Q-functions of the same (public) zoning, so it is representable; a ridge of 1e-3 pulled
#: zones that few anchors touch (anchor weight ~0.5, e.g. the post-decision corner
#: y = (0, 0)) by ~0.7 toward zero and their neighbours overshot to compensate, while
#: the zone values differ by ~0.1: the greedy policy then ordered too little (gap 23 %
#: and 19 % on seeds 6 and 9 of the 5-client study). Zones no anchor touches still get 0.
SERVER_RIDGE = 1e-8


class NonPrivateRefusedError(RuntimeError):
    """A client with its noise switched off, in a run not marked non-private."""


# ------------------------------------------------------------------ public set-up
def inventory_model(cfg: RunConfig) -> InventoryModel:
    """The inventory MDP every client and the server share (costs drawn from the seed)."""
    return make_inventory_model(cfg.pool.products, cfg.pool.horizon, cfg.pool.dynamics,
                                cfg.pool.demand, random_state=cfg.seed)


def zoning(cfg: RunConfig) -> tuple[Zoning, StateCells]:
    """POOL's zones and next-state cells: public, identical on every node."""
    w = cfg.pool.products
    return make_zoning(w, w, cfg.pool.horizon, cfg.pool.zones, cfg.pool.boundary,
                       n_cells=cfg.pool.cells, zoning=cfg.pool.zoning,
                       model=inventory_model(cfg))


def learner_options(cfg: RunConfig) -> dict[str, Any]:
    """Kernel and known-zone threshold of the run's learner, as the ``fedqhd pool`` studies
    choose them: post-decision zones get the shared demand kernel and a threshold of 3
    noise sigmas; the paper's zonings its per-zone kernel and E_rho."""
    post = cfg.pool.zoning == "post-decision"
    kernel = ("shared" if post else "zone") if cfg.pool.kernel == "auto" else cfg.pool.kernel
    return {"kernel": kernel, "threshold_sigmas": 3.0 if post else None}


@dataclass(frozen=True)
class ClientPrivacy:
    """A client's privacy settings, the node's own (:class:`~fedqhd.node_config.NodeSettings`:
    ``noise``, ``rho-budget``, ``rho``, ``reproducible-noise``; safe defaults: OpenDP noise,
    budget 10, at most rho 1 a release, noise nobody can regenerate).

    The run config may only ask for more privacy: a release spends
    ``min(run privacy-rho, node rho)``, so the node's ``rho`` is a per-release maximum. Its
    ``non-private`` key cannot switch a node's noise off (only node ``noise = "none"``
    does, and then only in a run marked non-private), and seeded noise needs the node's
    ``reproducible-noise = true``.
    """

    rho: float
    budget: float
    noise: str
    delta: float
    ledger_dir: Path
    reproducible: bool = False

    @classmethod
    def of(cls, cfg: RunConfig, node_config: dict[str, Any]) -> ClientPrivacy:
        """The node's settings (:class:`~fedqhd.node_config.NodeConfigError` for a bad
        one) with the run's ``privacy-rho`` where it is the smaller."""
        node = NodeSettings.of(node_config)
        return cls(min(cfg.privacy_rho, node.rho), node.rho_budget, node.noise, cfg.pool.delta,
                   ledger_dir(node_config), node.reproducible_noise)


# ------------------------------------------------------------ the one release
def release(cfg: RunConfig, pid: int, privacy: ClientPrivacy
            ) -> tuple[NoisyCounts, PrivacyLedger]:
    """Generate the client's shard, count it and release the counts once.

    The release is charged to the node's on-disk ledger of this shard (keyed by its
    fingerprint, in ``privacy.ledger_dir``), so every earlier release of the same data,
    in any run, counts against the budget. numpy noise is seeded from (seed, partition)
    only when the node sets ``reproducible-noise``; otherwise from fresh entropy.

    Raises :class:`NonPrivateRefusedError` for ``noise = "none"`` unless the run is
    marked ``non-private``, and :class:`~fedqhd.privacy.BudgetExceededError` when
    rho would take the shard's ledger past the client's budget (checked before any
    noise is drawn).
    """
    if privacy.noise == "none" and not cfg.non_private:
        raise NonPrivateRefusedError(
            f"POOL client partition {pid}: noise is switched off (noise='none'), which would "
            "release exact counts of private trajectories; refused because the run is not "
            "marked non-private (set run-config non-private=true for a non-private baseline)")
    model = inventory_model(cfg)
    zones, cells = zoning(cfg)
    data = generate_dataset(model, cfg.pool.trajectories,
                            random_state=pool_data_seed(cfg.seed, pid))
    client_id = f"partition-{pid}"
    if privacy.noise == "none":
        ledger = PrivacyLedger(privacy.budget, privacy.delta, client_id=client_id)
        return exact_counts(count_visits(data.states, data.actions, zones, cells)), ledger
    seed = pool_noise_seed(cfg.seed, pid) if privacy.reproducible else None
    source = make_noise_source(privacy.noise, random_state=seed)
    fingerprint = data_fingerprint(data.states, data.actions, data.rewards)
    with LedgerStore(privacy.ledger_dir).open(fingerprint, privacy.budget, privacy.delta,
                                              client_id) as ledger:
        counts = client_release(data, zones, cells, privacy.rho, source, ledger)
    return counts, ledger


def ledger_metrics(counts: NoisyCounts, ledger: PrivacyLedger, pid: int, cfg: RunConfig
                   ) -> dict[str, float]:
    """What a reply says about the client's privacy (numbers only, as metrics must be).

    A non-private client reports ``private = 0`` and no epsilon (it has none).
    ``num-transitions`` is n * H: n is public under replace-one neighbouring datasets.
    ``noise-secure`` is 1 only if every release used a secure sampler;
    ``noise-reproducible`` is 1 if any release's noise was seeded from the run config,
    and then every epsilon is ``inf`` (regenerable noise hides nothing; a MetricRecord
    carries ``inf`` as it is). ``rho-spent`` is the shard's total over every run (the
    on-disk ledger).
    """
    out: dict[str, float] = {C.PARTITION_ID: pid, C.PRIVATE: int(counts.private),
                             C.NUM_TRANSITIONS: cfg.pool.trajectories * cfg.pool.horizon}
    if counts.private:
        out.update({C.RHO_SPENT: ledger.rho_spent, C.RHO_BUDGET: ledger.budget_rho,
                    C.DELTA: ledger.delta, C.EPSILON_CKS: ledger.epsilon_cks(),
                    C.EPSILON_EXACT: ledger.epsilon_exact(), C.EPSILON: ledger.epsilon(),
                    C.NOISE_SIGMA: counts.sigma,
                    C.NOISE_SECURE: int(all(e.get("secure", False) for e in ledger.entries)),
                    C.NOISE_REPRODUCIBLE: int(ledger.regenerable)})
    return out


# ------------------------------------------------------------- post-processing
def fit(cfg: RunConfig, counts: NoisyCounts) -> PoolLearner:
    """POOL on the released counts (post-processing)."""
    return make_pool_learner(inventory_model(cfg), delta=cfg.pool.delta,
                             random_state=cfg.seed, **learner_options(cfg)).fit(counts)


def anchor_values(learner: PoolLearner, anchors: np.ndarray) -> np.ndarray:
    """``Q[k, h] = Qbar_h(anchors[k])``, shape (m, H): what a client releases."""
    return np.stack([learner.q_values(h, anchors) for h in range(learner.horizon_)], axis=1)


def empty_learner(cfg: RunConfig) -> PoolLearner:
    """POOL fitted on zero counts: every zone unknown, Q = 0 (the pessimistic prior)."""
    zones, cells = zoning(cfg)
    H = cfg.pool.horizon
    zero = NoisyCounts(np.zeros((H, zones.n_zones)), np.zeros((H, zones.n_zones, cells.n_cells)),
                       zones, cells, math.inf, 0.0, "none")
    return fit(cfg, zero)


def server_policy(prior: PoolLearner, anchors: np.ndarray, teacher: np.ndarray
                  ) -> tuple[PoolLearner, float]:
    """The federated policy: the teacher compiled into POOL's zones with the zero
    (pessimistic) prior of :func:`empty_learner`, at :data:`SERVER_RIDGE`."""
    return adopt_teacher(prior, anchors, teacher, ridge=SERVER_RIDGE)


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
        if isinstance(zones, PostDecisionZones):
            solved = _compile_shared(zones, h, anchors, teacher[:, h], own, ridge)
        else:
            solved = _compile_per_zone(zones, h, anchors, teacher[:, h], own, ridge)
        qbar = np.clip(own + trust * (solved - own), 0.0, learner.horizon_ - h)
        out.qbar_[h] = qbar
        out.coef_[h] = zones.interpolator(h, qbar)
        sq += float(np.sum((out.q_values(h, anchors) - teacher[:, h]) ** 2))
    return out, math.sqrt(sq / teacher.size)


def _compile_per_zone(zones: Zoning, h: int, anchors: np.ndarray, target: np.ndarray,
                      own: np.ndarray, ridge: float) -> np.ndarray:
    """Zonings with one zone per point (norm shells, grid): a small solve per zone."""
    n_z, n_p = own.shape
    weights = np.stack([zones.interpolate(h, zones.interpolator(h, np.eye(n_p)[j]
                                                                * np.ones((n_z, 1))),
                                          anchors) for j in range(n_p)], axis=1)
    ids = np.arange(n_z, dtype=float)[:, None] * np.ones((1, n_p))
    zone = np.rint(zones.interpolate(h, zones.interpolator(h, ids), anchors)).astype(int)
    gram = np.zeros((n_z, n_p, n_p))
    rhs = np.zeros((n_z, n_p))
    np.add.at(gram, zone, weights[:, :, None] * weights[:, None, :])
    np.add.at(rhs, zone, weights * target[:, None])
    return np.linalg.solve(gram + ridge * np.eye(n_p), (rhs + ridge * own)[..., None])[..., 0]


def _compile_shared(zones: PostDecisionZones, h: int, anchors: np.ndarray, target: np.ndarray,
                    own: np.ndarray, ridge: float) -> np.ndarray:
    """Post-decision zones: Q at a point mixes 2^p zone values (multilinear weights), so the
    zones are solved jointly, ``(A^T A + ridge I) q = A^T T + ridge q_own``."""
    ids, wts = zones.weights(h, anchors)  # (m, 2^p)
    design = np.zeros((anchors.shape[0], zones.n_zones))
    np.add.at(design, (np.arange(anchors.shape[0])[:, None], ids), wts)
    gram = design.T @ design + ridge * np.eye(zones.n_zones)
    return np.linalg.solve(gram, design.T @ target + ridge * own[:, 0])[:, None]


# ------------------------------------------------------------------ evaluation
class GapEvaluator:
    """Relative gap ``(c - c*) / c*`` in % of policies on the shared inventory MDP,
    all scored on the same simulated demands (common random numbers)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.model = inventory_model(cfg)
        self.episodes = cfg.pool.eval_episodes
        self.seed = pool_evaluation_seed(cfg.seed)
        reference, _ = optimal_policy(self.model)
        self.c_star = self.model.rollout_cost(reference, self.episodes, self.seed)

    def __call__(self, learner: PoolLearner) -> dict[str, float]:
        cost = self.model.rollout_cost(learner.act, self.episodes, self.seed)
        return {C.GAP: relative_gap(cost, self.c_star), C.COST: cost, C.C_STAR: self.c_star,
                C.RETURN_MEAN: -cost}


def pool_anchors(cfg: RunConfig) -> np.ndarray:
    """``num-anchors`` (state, action) points in [0, 1]^(w+d).

    ``uniform``: uniform in the cube; ``rollouts``: (s, a) pairs of uniform-random
    orders in the public simulator (the behaviour distribution, no client data);
    a path: a .npy array of shape (m, w + d) with values in [0, 1].
    """
    w, m = cfg.pool.products, cfg.num_anchors
    rng = pool_anchor_rng(cfg.seed)
    if cfg.anchor_source == "uniform":
        return rng.random((m, 2 * w))
    if cfg.anchor_source == "rollouts":
        per = math.ceil(m / cfg.pool.horizon)
        data = generate_dataset(inventory_model(cfg), per, random_state=int(rng.integers(2**31)))
        b = np.concatenate([data.states[:, :-1], data.actions], axis=-1).reshape(-1, 2 * w)
        return b[rng.permutation(len(b))[:m]]
    anchors = np.load(cfg.anchor_source, allow_pickle=False).astype(np.float64)
    if anchors.ndim != 2 or anchors.shape[1] != 2 * w or not np.all((anchors >= 0)
                                                                    & (anchors <= 1)):
        raise ValueError(f"anchor file {cfg.anchor_source}: expected (m, {2 * w}) values in "
                         f"[0, 1] for the POOL setting products = {w}, got shape {anchors.shape}")
    return anchors
