"""The four methods of the paper's comparison, end to end from raw trajectories.

* ``pool`` -- noisy counts (sigma^2 = 2H/rho per family), projection, E_rho.
* ``nonprivate`` -- exact counts, no threshold. NOT private.
* ``input`` -- input perturbation: each trajectory's states and actions get
  Gaussian noise with the trajectory's L2 sensitivity sqrt((H+1) w + H d)
  (every coordinate lies in [0, 1]) for rho-zCDP, are clipped to [0, 1], and the
  non-private learner runs on the result.
* ``output`` -- output perturbation: the non-private Qbar table is released
  with Gaussian noise. No tighter sensitivity than "every entry may move over
  its whole range [0, H - h + 1]" is known, so Delta^2 = sum over entries of
  (H - h + 1)^2.

All private methods use the same rho and the seeded numpy noise source.
"""

from __future__ import annotations

import math

import numpy as np

from fedqhd.envs.inventory import InventoryModel, Trajectories
from fedqhd.pool.api import client_release, make_pool_learner
from fedqhd.pool.counts import Zoning, count_visits, exact_counts
from fedqhd.pool.learner import PoolLearner
from fedqhd.pool.zones import StateCells
from fedqhd.privacy import NumpyNoise, gaussian_sigma

METHODS = ("nonprivate", "pool", "input", "output")


def fit_method(method: str, model: InventoryModel, data: Trajectories,
               zones: Zoning, cells: StateCells, rho: float,
               random_state: int = 0, **learner_kw) -> PoolLearner:
    """Fit one method; returns a fitted learner (``act``, ``q_values``)."""
    noise = NumpyNoise(random_state)
    if method == "pool":
        return make_pool_learner(model, **learner_kw).fit(
            client_release(data, zones, cells, rho, noise))
    if method == "input":
        H, w, d = model.horizon, model.w, model.w
        sigma = gaussian_sigma(math.sqrt((H + 1) * w + H * d), rho)
        data = Trajectories(np.clip(noise.add_noise(data.states, sigma), 0, 1),
                            np.clip(noise.add_noise(data.actions, sigma), 0, 1), data.rewards)
    elif method not in ("nonprivate", "output"):
        raise ValueError(f"unknown method {method!r}; expected one of {METHODS}")
    kw = dict(learner_kw, threshold=0.0)
    learner = make_pool_learner(model, **kw).fit(
        exact_counts(count_visits(data.states, data.actions, zones, cells)))
    if method == "output":
        H = learner.horizon_
        sens = math.sqrt(sum(q.size * (H - h) ** 2 for h, q in enumerate(learner.qbar_)))
        sigma = gaussian_sigma(sens, rho)
        for h in range(H):
            q = np.clip(noise.add_noise(learner.qbar_[h], sigma), 0.0, H - h)
            learner.qbar_[h] = q
            learner.coef_[h] = learner.zones_.interpolator(h, q)
    return learner
