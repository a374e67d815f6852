"""Visit counts per (stage, zone, next-state cell), exact and privatised.

The privacy boundary of POOL. :func:`count_visits` turns raw trajectories into
:class:`VisitCounts` (sensitive, stays with the client); :func:`privatize`
adds the Gaussian noise once and returns :class:`NoisyCounts`, which is all the
learner ever sees. Everything computed from a ``NoisyCounts`` is
post-processing and costs no further privacy.

Calibration (paper, Lemma 5): replacing one trajectory changes at most 2H
entries of each family by one, so each family has L2 sensitivity sqrt(2H);
each gets rho/2, i.e. ``sigma^2 = 2H / rho``, rho in total.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedqhd.pool.zones import GridZones, NormZones, PostDecisionZones, StateCells
from fedqhd.privacy import NoiseSource, PrivacyLedger, release_counts

Zoning = NormZones | GridZones | PostDecisionZones


@dataclass(frozen=True)
class VisitCounts:
    """Exact counts (sensitive). n_sa (H, Z) and n_sas (H, Z, C)."""

    n_sa: np.ndarray
    n_sas: np.ndarray
    zones: Zoning
    cells: StateCells


@dataclass(frozen=True)
class NoisyCounts:
    """Released counts: the only input of :class:`~fedqhd.pool.PoolLearner`.

    Attributes
    ----------
    n_sa, n_sas : ndarray
        Noisy counts clipped at zero (exact when ``rho`` is infinite).
    rho : float
        zCDP cost of this release (``math.inf`` for the non-private baseline).
    sigma : float
        Noise scale used for every entry.
    noise : str
        Label of the noise source.
    """

    n_sa: np.ndarray
    n_sas: np.ndarray
    zones: Zoning
    cells: StateCells
    rho: float
    sigma: float
    noise: str

    @property
    def private(self) -> bool:
        return math.isfinite(self.rho)

    @property
    def horizon(self) -> int:
        return self.n_sa.shape[0]


def count_visits(states: np.ndarray, actions: np.ndarray, zones: Zoning,
                 cells: StateCells) -> VisitCounts:
    """Count observable transitions of trajectories ``states`` (n, H+1, w), ``actions`` (n, H, d).

    Transitions outside the observable region are dropped (one-sided feedback).
    """
    n, H, _ = actions.shape
    n_sa = np.zeros((H, zones.n_zones))
    n_sas = np.zeros((H, zones.n_zones, cells.n_cells))
    for h in range(H):
        b = np.concatenate([states[:, h], actions[:, h]], axis=1)
        z = zones.zone_of(h, b)
        ok = z >= 0
        c = cells.cell_of(states[ok, h + 1])
        n_sa[h] = np.bincount(z[ok], minlength=zones.n_zones)
        n_sas[h] = np.bincount(z[ok] * cells.n_cells + c,
                               minlength=zones.n_zones * cells.n_cells).reshape(n_sas[h].shape)
    return VisitCounts(n_sa, n_sas, zones, cells)


def count_sensitivity(horizon: int) -> float:
    """L2 sensitivity of each count family: replacing one trajectory of ``horizon`` steps
    moves at most 2H entries by one."""
    return math.sqrt(2 * horizon)


def privatize(counts: VisitCounts, rho: float, source: NoiseSource,
              ledger: PrivacyLedger | None = None) -> NoisyCounts:
    """Release ``counts`` under rho-zCDP (charged to ``ledger``), clipped at zero."""
    sens = count_sensitivity(counts.n_sa.shape[0])
    out = release_counts({"n_sa": counts.n_sa.astype(np.int64),
                          "n_sas": counts.n_sas.astype(np.int64)}, rho, sens, source, ledger)
    # sigma = sqrt(2H / rho): rho/2 per family
    return NoisyCounts(out.values["n_sa"], out.values["n_sas"], counts.zones, counts.cells, rho,
                       out.sigma, source.label)


def exact_counts(counts: VisitCounts) -> NoisyCounts:
    """Non-private release (rho = inf): for the NonPrivate baseline only."""
    return NoisyCounts(counts.n_sa.astype(float), counts.n_sas.astype(float), counts.zones,
                       counts.cells, math.inf, 0.0, "none (NOT private)")
