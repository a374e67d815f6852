"""Entry points for a client: build the discretisation, release counts once, learn."""

from __future__ import annotations

import numpy as np

from fedqhd.envs.inventory import InventoryModel, Trajectories
from fedqhd.pool.counts import NoisyCounts, count_visits, privatize
from fedqhd.pool.learner import PoolLearner
from fedqhd.pool.zones import GridZones, NormZones, StateCells
from fedqhd.privacy import NoiseSource, PrivacyLedger


def make_zoning(w: int, d: int, horizon: int, n_zones: int = 200, lam: float | np.ndarray = 1.0,
                feedback: str = "lower", n_cells: int = 20, discretization: str = "zones",
                max_cells: int = 2**16) -> tuple[NormZones | GridZones, StateCells]:
    """Zones of the observable region and next-state cells.

    ``lam`` is the observable boundary: a scalar (``|lambda|`` per coordinate, the
    paper's sweep variable), a vector (w+d,) or an array (H, w+d).
    ``discretization="grid"`` gives the axis-aligned baseline with
    :meth:`GridZones.bins_for` bins per axis (at most ``max_cells`` cells).
    """
    lam_arr = np.broadcast_to(np.asarray(lam, dtype=float), (horizon, w + d)).copy()
    zones: NormZones | GridZones
    if discretization == "zones":
        zones = NormZones(n_zones, lam_arr, feedback)
    elif discretization == "grid":
        zones = GridZones(GridZones.bins_for(n_zones, w + d, max_cells), lam_arr, feedback)
    else:
        raise ValueError(f"unknown discretization {discretization!r}")
    return zones, StateCells(n_cells, w)


def client_release(trajectories: Trajectories, zones: NormZones | GridZones, cells: StateCells,
                   rho: float, source: NoiseSource, ledger: PrivacyLedger | None = None
                   ) -> NoisyCounts:
    """Count a client's raw trajectories and release them under rho-zCDP, once.

    The returned :class:`NoisyCounts` is safe to keep and to learn from; the raw
    trajectories should not be used again.
    """
    return privatize(count_visits(trajectories.states, trajectories.actions, zones, cells),
                     rho, source, ledger)


def make_pool_learner(model: InventoryModel, **kwargs) -> PoolLearner:
    """A :class:`PoolLearner` with the inventory model's known reward."""
    return PoolLearner(model.known_reward, model.reward_bounds, model.w, **kwargs)
