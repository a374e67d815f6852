"""POOL: zCDP-private offline RL with one-sided feedback (numeric core, no Flower).

API for a client (e.g. a Flower ClientApp)::

    from fedqhd.pool import (client_release, make_pool_learner, NoisyCounts)
    counts = client_release(trajectories, zones, cells, rho, noise_source, ledger)
    learner = make_pool_learner(model).fit(counts)   # post-processing only
    q = learner.q_values(h, points)                   # points (m, w+d) -> (m,)

:func:`client_release` noises a client's raw trajectories once (charging
``ledger``) and returns :class:`NoisyCounts`; keep that object and release only
values computed from it (``q_values`` on shared anchor points, ``act``).
:func:`make_zoning` builds the zones and cells; :func:`fit_method` runs one of
the four methods (``pool``, ``nonprivate``, ``input``, ``output``) end to end.
"""

from fedqhd.pool.api import client_release, make_pool_learner, make_zoning
from fedqhd.pool.baselines import METHODS, fit_method
from fedqhd.pool.counts import NoisyCounts, VisitCounts, count_visits, exact_counts, privatize
from fedqhd.pool.learner import PoolLearner, candidate_actions, e_rho
from fedqhd.pool.projection import project_counts
from fedqhd.pool.zones import GridZones, NormZones, StateCells

__all__ = [
    "METHODS",
    "GridZones",
    "NoisyCounts",
    "NormZones",
    "PoolLearner",
    "StateCells",
    "VisitCounts",
    "candidate_actions",
    "client_release",
    "count_visits",
    "e_rho",
    "exact_counts",
    "fit_method",
    "make_pool_learner",
    "make_zoning",
    "privatize",
    "project_counts",
]
