"""Kernel error of POOL's next-state estimates from one rho = 1 release (issue 9).

Mean L1 distance, over zones and stages, between the true next-state-cell law at each
post-decision zone's level (uniform demand pushed through the dynamics on a fine grid)
and (a) the shared demand kernel (``PoolLearner(kernel="shared")``, whose EM models the
mass clipping the noise at zero adds), (a') the same EM on projected counts at face value
(``em_noise="ignore"``, issue 9 round 2), (b) the per-zone estimate (projected noisy
counts normalised per zone, the paper's). Also the fit's wall time.
Run: ``OMP_NUM_THREADS=1 python benchmarks/pool_kernel_error.py``.
"""

from __future__ import annotations

import time

import numpy as np

from fedqhd.envs.inventory import generate_dataset, make_inventory_model
from fedqhd.pool import client_release, make_pool_learner, make_zoning
from fedqhd.pool.kernels import cell_map, demand_grid, push_forward
from fedqhd.pool.projection import project_counts
from fedqhd.privacy import NumpyNoise


def main() -> None:
    for model in ("lost_sales", "backlogged"):
        for n_zones in (50, 200, 400):
            m = make_inventory_model(2, 7, model, random_state=0)
            data = generate_dataset(m, 5000, random_state=1)
            zones, cells = make_zoning(2, 2, 7, n_zones, zoning="post-decision", model=m)
            counts = client_release(data, zones, cells, 1.0, NumpyNoise(0))
            learner = make_pool_learner(m, kernel="shared", threshold_sigmas=3.0)
            t0 = time.perf_counter()
            learner.fit(counts)
            fit_s = time.perf_counter() - t0
            face = make_pool_learner(m, kernel="shared", threshold_sigmas=3.0,
                                     em_noise="ignore").fit(counts)
            u = zones.post_points(0)
            fine = demand_grid(2, 10**6, 401)
            truth = push_forward(np.full(len(fine), 1 / len(fine)),
                                 cell_map(u, fine, m.next_from_post, cells), cells.n_cells)
            shared_err, face_err, zone_err = [], [], []
            cmap = cell_map(u, learner.demand_grid_, m.next_from_post, cells)
            for h in range(7):
                shared = push_forward(learner.demand_[h], cmap, cells.n_cells)
                face_err.append(np.abs(push_forward(face.demand_[h], cmap, cells.n_cells)
                                       - truth).sum(1).mean())
                x = project_counts(counts.n_sas[h], counts.n_sa[h], learner.slack_)
                zone = x / np.maximum(x.sum(1, keepdims=True), 1e-12)
                shared_err.append(np.abs(shared - truth).sum(1).mean())
                zone_err.append(np.abs(zone - truth).sum(1).mean())
            print(f"{model} M={n_zones}: shared {np.mean(shared_err):.3f} "
                  f"(face value {np.mean(face_err):.3f}) per-zone {np.mean(zone_err):.3f}  "
                  f"fit {fit_s:.2f} s")


if __name__ == "__main__":
    main()
