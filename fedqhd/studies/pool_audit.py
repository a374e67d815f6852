"""Neighbouring POOL data sets for the privacy audit (:mod:`fedqhd.privacy.audit`).

D is a client's shard of inventory trajectories as a federated run generates it;
D' differs from it in one trajectory of H steps:

* ``replace`` (the neighbouring relation POOL's calibration ``sigma^2 = 2H / rho``
  is stated for): D's first trajectory replaced by a fresh one. Among candidate
  fresh trajectories the one moving the most counts is taken, so each family moves
  by the full sensitivity ``sqrt(2H)`` when the data allow (the worst case).
* ``add``: D plus one trajectory, which moves H entries of each family (L2
  ``sqrt(H)``): half the squared sensitivity, so at most rho / 2 can be detected.
"""

from __future__ import annotations

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.envs.inventory import Trajectories, generate_dataset
from fedqhd.learners.pool_federated import inventory_model, zoning
from fedqhd.pool.counts import VisitCounts, count_visits
from fedqhd.seeding import pool_data_seed

NEIGHBOURS = ("replace", "add")  #: how D' differs from D
CANDIDATES = 64                  #: fresh trajectories tried for the replacement


def _join(a: Trajectories, b: Trajectories) -> Trajectories:
    return Trajectories(*(np.concatenate([x, y]) for x, y in
                          ((a.states, b.states), (a.actions, b.actions),
                           (a.rewards, b.rewards))))


def _counts(cfg: RunConfig, data: Trajectories) -> dict[str, np.ndarray]:
    zones, cells = zoning(cfg)
    c: VisitCounts = count_visits(data.states, data.actions, zones, cells)
    return {"n_sa": c.n_sa, "n_sas": c.n_sas}


def neighbouring_counts(cfg: RunConfig, neighbours: str = "replace"
                        ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Exact count families of D (partition 0's shard under ``cfg``) and of D'."""
    if neighbours not in NEIGHBOURS:
        raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
    model = inventory_model(cfg)
    data = generate_dataset(model, cfg.pool.trajectories,
                            random_state=pool_data_seed(cfg.seed, 0))
    fresh = generate_dataset(model, CANDIDATES, random_state=pool_data_seed(cfg.seed, 1))
    base = _counts(cfg, data)
    best: tuple[float, dict[str, np.ndarray]] = (-1.0, base)
    for i in range(CANDIDATES):
        one = Trajectories(fresh.states[i:i + 1], fresh.actions[i:i + 1],
                           fresh.rewards[i:i + 1])
        if neighbours == "add":
            other = _counts(cfg, _join(data, one))
        else:
            rest = Trajectories(data.states[1:], data.actions[1:], data.rewards[1:])
            other = _counts(cfg, _join(one, rest))
        moved = sum(float(np.sum((other[k] - base[k]) ** 2)) for k in base)
        if moved > best[0]:
            best = (moved, other)
        if moved >= (2 if neighbours == "add" else 4) * cfg.pool.horizon:
            break  # the most one trajectory can move: H (add) or 2H (replace) per family
    return base, best[1]
