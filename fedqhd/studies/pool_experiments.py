"""The paper's studies: gap vs rho (4 methods), vs H, |lambda|, w+d, M, and zones vs grid.

One repetition draws fresh costs, a fresh offline dataset and fresh noise from
``seed + rep``; every policy of a repetition is scored on the same simulated
demands as the DP reference policy (common random numbers), and the gap is
``(c - c*) / c* * 100``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from fedqhd.envs.inventory import (
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.pool.api import ZONINGS, make_zoning
from fedqhd.pool.baselines import fit_method


@dataclass(frozen=True)
class Setting:
    """One experimental configuration (w+d = 2w: one order quantity per product)."""

    w: int = 2
    horizon: int = 7
    n_zones: int = 50
    lam: float = 1.0
    rho: float = 1.0
    n_traj: int = 5000
    n_cells: int = 20
    model: str = "lost_sales"
    demand: str = "uniform"
    zoning: str = "post-decision"
    behaviour: str = "uniform"
    reward_scale: str = "common"
    threshold_sigmas: float | None = 3.0
    kernel: str = "shared"
    em_noise: str = "clipped"
    eval_episodes: int = 4000


#: the paper's learner: norm zones, norm next-state cells, the paper's E_rho threshold
PAPER: dict[str, Any] = {"zoning": "norm", "threshold_sigmas": None, "kernel": "zone"}


def run_once(s: Setting, method: str, rep: int, seed: int) -> dict:
    """Fit ``method`` once and score it; returns gap, costs and fit time."""
    model = make_inventory_model(s.w, s.horizon, s.model, s.demand, random_state=seed + rep)
    data = generate_dataset(model, s.n_traj, random_state=seed + 1000 + rep,
                            behaviour=s.behaviour)
    zones, cells = make_zoning(s.w, s.w, s.horizon, s.n_zones, s.lam, n_cells=s.n_cells,
                               zoning=s.zoning, model=model)
    ref, _ = optimal_policy(model)
    c_star = model.rollout_cost(ref, s.eval_episodes, seed + 2000 + rep)
    t0 = time.perf_counter()
    learner = fit_method(method, model, data, zones, cells, s.rho, random_state=seed + rep,
                         reward_scale=s.reward_scale, threshold_sigmas=s.threshold_sigmas,
                         kernel=s.kernel, em_noise=s.em_noise)
    fit_s = time.perf_counter() - t0
    cost = model.rollout_cost(learner.act, s.eval_episodes, seed + 2000 + rep)
    return {"gap": relative_gap(cost, c_star), "cost": cost, "c_star": c_star, "fit_s": fit_s,
            "n_zones_used": int(zones.n_zones)}


def run_grid(settings: list[tuple[str, Setting, str]], reps: int, seed: int,
             progress: bool = True) -> list[dict]:
    """Run labelled (label, setting, method) triples ``reps`` times; one summary row each."""
    rows = []
    bar = tqdm(total=len(settings) * reps, disable=not progress, desc="pool")
    for label, s, method in settings:
        res = []
        for rep in range(reps):
            res.append(run_once(s, method, rep, seed))
            bar.update()
        gaps = np.array([r["gap"] for r in res])
        fits = np.array([r["fit_s"] for r in res])
        rows.append({"label": label, "method": method, "setting": asdict(s),
                     "gap_mean": float(gaps.mean()), "gap_std": float(gaps.std()),
                     "fit_s_mean": float(fits.mean()), "n_zones": res[0]["n_zones_used"],
                     "gaps": gaps.tolist()})
    bar.close()
    return rows


def rho_study(base: Setting, rhos: list[float], methods: list[str]) -> list:
    return [(f"rho={r}", replace(base, rho=r), m) for r in rhos for m in methods]


SWEEP_FIELDS = {"H": "horizon", "lam": "lam", "wd": "w", "M": "n_zones"}


def sweep_study(base: Setting, param: str, values: list[float]) -> list:
    field = SWEEP_FIELDS[param]
    out = []
    for v in values:
        val = int(v) // 2 if param == "wd" else (int(v) if field != "lam" else float(v))
        # one field chosen at run time; its type (int or float) is matched to that field above
        changes: dict[str, Any] = {field: val}
        out.append((f"{param}={v:g}", replace(base, **changes), "pool"))
    return out


def grid_study(base: Setting, ms: list[int], zonings: tuple[str, ...] = ZONINGS) -> list:
    out = []
    for m in ms:
        for z in zonings:
            # norm zones and the grid are the paper's: its E_rho threshold
            extra: dict[str, Any] = {} if z == "post-decision" else PAPER
            out.append((f"{z} M={m}", replace(base, n_zones=m, **(extra | {"zoning": z})),
                        "pool"))
    return out
