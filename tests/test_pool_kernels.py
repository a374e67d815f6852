"""The shared demand kernel (issue 9): borrowing strength across zones from one release."""

import math

import numpy as np
import pytest

from fedqhd.envs.inventory import (
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.pool import client_release, fit_method, make_pool_learner, make_zoning
from fedqhd.pool.kernels import cell_map, demand_grid, fit_shared_demand, push_forward
from fedqhd.pool.projection import project_counts
from fedqhd.privacy import NumpyNoise, PrivacyLedger


def _skewed_model(horizon=3, model="lost_sales", seed=0):
    """Demand far from uniform (Beta(2, 5) per product), so a uniform q is wrong."""
    rng = np.random.default_rng(seed)
    samples = [rng.beta(2.0, 5.0, size=(4000, 2)) for _ in range(horizon)]
    return make_inventory_model(2, horizon, model, samples, random_state=seed)


def test_em_recovers_the_kernel_of_exact_counts():
    m = _skewed_model()
    zones, cells = make_zoning(2, 2, 3, 50, zoning="post-decision", model=m)
    dem = demand_grid(2)
    cmap = cell_map(zones.post_points(0), dem, m.next_from_post, cells)
    q_true = np.prod(dem * (1 - dem) ** 4, axis=1)  # Beta(2, 5) per product on the grid
    q_true /= q_true.sum()
    p_true = push_forward(q_true, cmap, cells.n_cells)
    np.testing.assert_allclose(p_true.sum(1), 1.0)
    q = fit_shared_demand(1000.0 * p_true, cmap, cells.n_cells, iters=2000)
    assert np.abs(push_forward(q, cmap, cells.n_cells) - p_true).max() < 0.02
    assert np.abs(push_forward(np.full(len(dem), 1 / len(dem)), cmap, cells.n_cells)
                  - p_true).max() > 0.05  # the uniform start is not already the answer


def test_shared_kernel_beats_per_zone_estimates_on_noisy_counts():
    m = _skewed_model()
    zones, cells = make_zoning(2, 2, 3, 50, zoning="post-decision", model=m)
    data = generate_dataset(m, 3000, random_state=2)
    counts = client_release(data, zones, cells, 1.0, NumpyNoise(3))
    learner = make_pool_learner(m, kernel="shared", threshold_sigmas=3.0).fit(counts)
    # truth: each zone's node pushed through the stage's empirical demand law
    u = zones.post_points(0)
    err_shared, err_zone = [], []
    for h in range(3):
        truth = push_forward(np.full(len(m.demand_samples[h]), 1 / len(m.demand_samples[h])),
                             cell_map(u, m.demand_samples[h], m.next_from_post, cells),
                             cells.n_cells)
        shared = push_forward(learner.demand_[h], cell_map(u, learner.demand_grid_,
                                                           m.next_from_post, cells),
                              cells.n_cells)
        x = project_counts(counts.n_sas[h], counts.n_sa[h], learner.slack_)
        zone = x / np.maximum(x.sum(1, keepdims=True), 1e-12)
        err_shared.append(np.abs(shared - truth).sum(1).mean())
        err_zone.append(np.abs(zone - truth).sum(1).mean())
    assert max(err_shared) < 0.3 and np.mean(err_shared) < 0.4 * np.mean(err_zone), (
        err_shared, err_zone)


def test_release_and_ledger_do_not_depend_on_the_kernel():
    m = make_inventory_model(2, 3, random_state=0)
    zones, cells = make_zoning(2, 2, 3, 50, zoning="post-decision", model=m)
    data = generate_dataset(m, 500, random_state=0)
    releases, ledgers = [], []
    for kernel in ("zone", "shared"):
        ledger = PrivacyLedger(10.0, 1e-5)
        counts = client_release(data, zones, cells, 1.0, NumpyNoise(5), ledger)
        before = (counts.n_sa.copy(), counts.n_sas.copy())
        make_pool_learner(m, kernel=kernel, threshold_sigmas=3.0).fit(counts)
        np.testing.assert_array_equal(counts.n_sa, before[0])   # fit only reads
        np.testing.assert_array_equal(counts.n_sas, before[1])
        assert [e["label"] for e in ledger.entries] == ["n_sa", "n_sas"]
        assert ledger.rho_spent == 1.0
        ledgers.append(ledger.entries)
        assert counts.sigma == pytest.approx(math.sqrt(2 * 3 / 1.0))
        releases.append(counts)
    np.testing.assert_array_equal(releases[0].n_sas, releases[1].n_sas)
    assert ledgers[0] == ledgers[1]


@pytest.mark.parametrize(("dynamics", "margin"), [("lost_sales", 2.0), ("backlogged", 0.5)])
def test_private_shared_kernel_near_nonprivate_and_better_than_per_zone(dynamics, margin):
    m = make_inventory_model(2, 4, dynamics, random_state=1)
    zones, cells = make_zoning(2, 2, 4, 50, zoning="post-decision", model=m)
    data = generate_dataset(m, 3000, random_state=4)
    ref, _ = optimal_policy(m)
    c_star = m.rollout_cost(ref, 3000, 9)

    def gap(method, kernel):
        learner = fit_method(method, m, data, zones, cells, 1.0, random_state=0,
                             kernel=kernel, threshold_sigmas=3.0)
        return relative_gap(m.rollout_cost(learner.act, 3000, 9), c_star)

    shared, zone, nonprivate = gap("pool", "shared"), gap("pool", "zone"), gap("nonprivate",
                                                                               "shared")
    assert shared < 4.0 and shared < nonprivate + 3.0, (shared, nonprivate)
    assert shared < zone - margin, (shared, zone)


def test_shared_kernel_needs_post_decision_zones_and_a_transition():
    m = make_inventory_model(2, 3, random_state=0)
    zones, cells = make_zoning(2, 2, 3, 50, zoning="norm")
    counts = client_release(generate_dataset(m, 50), zones, cells, 1.0, NumpyNoise(0))
    with pytest.raises(ValueError, match="post-decision"):
        make_pool_learner(m, kernel="shared").fit(counts)
    from fedqhd.pool import PoolLearner
    with pytest.raises(ValueError, match="transition"):
        PoolLearner(m.known_reward, m.reward_bounds, 2, kernel="shared")
    with pytest.raises(ValueError, match="kernel"):
        PoolLearner(m.known_reward, m.reward_bounds, 2, kernel="bogus")


def test_cli_defaults_to_the_shared_kernel_and_keeps_the_paper_one_flag_away():
    import argparse

    from fedqhd.pool import cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["pool", "rho"])
    assert cli._base(a).kernel == "shared" and cli._tag(a) == ""
    a = p.parse_args(["pool", "rho", "--zoning", "norm"])
    assert cli._base(a).kernel == "zone" and cli._tag(a) == "_norm"
    a = p.parse_args(["pool", "rho", "--kernel", "zone"])
    assert cli._base(a).kernel == "zone" and cli._tag(a) == "_zone-kernel"
