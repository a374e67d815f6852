"""Entry points for a client: build the discretisation, release counts once, learn."""

from __future__ import annotations

import numpy as np

from fedqhd.envs.inventory import InventoryModel, Trajectories
from fedqhd.pool.counts import NoisyCounts, Zoning, count_visits, privatize
from fedqhd.pool.learner import PoolLearner
from fedqhd.pool.zones import GridZones, NormZones, PostDecisionZones, StateCells
from fedqhd.privacy import NoiseSource, PrivacyLedger

ZONINGS = ("post-decision", "norm", "grid")  #: discretisations; "norm" is the paper's


def make_zoning(w: int, d: int, horizon: int, n_zones: int = 200, lam: float | np.ndarray = 1.0,
                feedback: str = "lower", n_cells: int = 20, zoning: str = "norm",
                max_cells: int = 2**16, model: InventoryModel | None = None,
                cells: str = "auto", discretization: str | None = None
                ) -> tuple[Zoning, StateCells]:
    """Zones of the observable region and next-state cells.

    ``lam`` is the observable boundary: a scalar (``|lambda|`` per coordinate, the
    paper's sweep variable), a vector (w+d,) or an array (H, w+d).

    ``zoning``: ``"norm"`` -- the paper's M l2-norm shells (:class:`NormZones`);
    ``"post-decision"`` -- zones over the order-up-to level ``y = s + a``
    (:class:`PostDecisionZones`; needs ``model`` for the map ``b -> y``);
    ``"grid"`` -- the axis-aligned baseline with :meth:`GridZones.bins_for` bins
    per axis (at most ``max_cells`` cells). ``discretization`` is the old name
    (``"zones"`` = ``"norm"``).

    ``cells``: next-state cells, ``"norm"`` (the paper's shells), ``"grid"`` or
    ``"auto"`` (grid for post-decision zones, norm otherwise).
    """
    if discretization is not None:
        zoning = {"zones": "norm"}.get(discretization, discretization)
    lam_arr = np.broadcast_to(np.asarray(lam, dtype=float), (horizon, w + d)).copy()
    zones: Zoning
    if zoning == "norm":
        zones = NormZones(n_zones, lam_arr, feedback)
    elif zoning == "grid":
        zones = GridZones(GridZones.bins_for(n_zones, w + d, max_cells), lam_arr, feedback)
    elif zoning == "post-decision":
        if model is None:
            raise ValueError("zoning='post-decision' needs the model (its post-decision map)")
        zones = PostDecisionZones(n_zones, lam_arr, model.post_decision, model.decision_point,
                                  model.w, feedback)
    else:
        raise ValueError(f"unknown zoning {zoning!r}; expected one of {ZONINGS}")
    if cells == "auto":
        cells = "grid" if zoning == "post-decision" else "norm"
    return zones, StateCells(n_cells, w, cells)


def client_release(trajectories: Trajectories, zones: Zoning, cells: StateCells,
                   rho: float, source: NoiseSource, ledger: PrivacyLedger | None = None
                   ) -> NoisyCounts:
    """Count a client's raw trajectories and release them under rho-zCDP, once.

    The returned :class:`NoisyCounts` is safe to keep and to learn from; the raw
    trajectories should not be used again.
    """
    return privatize(count_visits(trajectories.states, trajectories.actions, zones, cells),
                     rho, source, ledger)


def make_pool_learner(model: InventoryModel, **kwargs) -> PoolLearner:
    """A :class:`PoolLearner` with the inventory model's known reward (and, for
    ``kernel="shared"``, its demand structure ``s' = g(u, D)``)."""
    if kwargs.get("kernel") == "shared":
        kwargs.setdefault("transition", model.next_from_post)
    return PoolLearner(model.known_reward, model.reward_bounds, model.w, **kwargs)
