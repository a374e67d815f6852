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
from fedqhd.pool.counts import count_visits
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

    from fedqhd.commands import pool as cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="cmd"))
    a = p.parse_args(["pool", "rho"])
    assert cli._base(a).kernel == "shared" and cli._tag(a) == ""
    a = p.parse_args(["pool", "rho", "--zoning", "norm"])
    assert cli._base(a).kernel == "zone" and cli._tag(a) == "_norm"
    a = p.parse_args(["pool", "rho", "--kernel", "zone"])
    assert cli._base(a).kernel == "zone" and cli._tag(a) == "_zone-kernel"


def test_clipped_excess_is_the_mass_clipping_adds():
    from fedqhd.pool.kernels import clipped_excess

    rng = np.random.default_rng(0)
    for mu in (0.0, 2.0, 10.0):
        mc = np.maximum(mu + 3.7 * rng.standard_normal(400_000), 0.0).mean() - mu
        assert clipped_excess(np.array(mu), 3.7) == pytest.approx(mc, abs=0.02)
    assert clipped_excess(np.array(0.0), 3.7) == pytest.approx(3.7 / math.sqrt(2 * math.pi))
    assert clipped_excess(np.array(5.0), 0.0) == 0.0


def _clipped_release(n_zones, per_zone, seed, sigma=3.7):
    """Counts of ``per_zone`` transitions per zone, Gaussian noise, clipped at zero."""
    m = _skewed_model()
    zones, cells = make_zoning(2, 2, 3, n_zones, zoning="post-decision", model=m)
    dem = demand_grid(2)
    cmap = cell_map(zones.post_points(0), dem, m.next_from_post, cells)
    q_true = np.prod(dem * (1 - dem) ** 4, axis=1)
    q_true /= q_true.sum()
    p_true = push_forward(q_true, cmap, cells.n_cells)
    rng = np.random.default_rng(seed)
    exact = np.stack([rng.multinomial(per_zone, p) for p in p_true]).astype(float)
    noisy = np.maximum(exact + sigma * rng.standard_normal(exact.shape), 0.0)
    return noisy, exact, cmap, cells.n_cells, p_true


def test_em_models_clipped_noise_with_many_empty_cells():
    """400 zones x 25 cells, ~12 transitions per zone (5000 in all), sigma 3.7: most cells
    are empty and clipping adds ~3x the real mass. Modelling it beats face value."""
    noisy, exact, cmap, n_cells, p_true = _clipped_release(400, 12, seed=1)
    assert noisy.sum() > 2.5 * exact.sum()  # the regime of issue 9's M = 400

    def err(q):
        return np.abs(push_forward(q, cmap, n_cells) - p_true).sum(1).mean()

    face = err(fit_shared_demand(noisy, cmap, n_cells))
    modelled = err(fit_shared_demand(noisy, cmap, n_cells, sigma=3.7))
    assert modelled < 0.6 * face, (modelled, face)
    from fedqhd.pool.kernels import fit_demand_and_mass

    _, mass = fit_demand_and_mass(noisy, cmap, n_cells, sigma=3.7)
    assert abs(mass - exact.sum()) < 0.25 * exact.sum(), (mass, exact.sum())
    # sigma = 0 is the plain EM, whose mass is the counts' total
    q0, mass0 = fit_demand_and_mass(exact, cmap, n_cells)
    assert mass0 == pytest.approx(exact.sum())
    np.testing.assert_allclose(q0, fit_shared_demand(exact, cmap, n_cells))


def test_learner_models_the_clipping_by_default():
    """The learner's EM gets the release's sigma and Gamma the fitted real mass; 'ignore'
    keeps round 2's face-value fit (kernel error and phantom mass both larger)."""
    m = _skewed_model()
    zones, cells = make_zoning(2, 2, 3, 200, zoning="post-decision", model=m)
    data = generate_dataset(m, 3000, random_state=2)
    counts = client_release(data, zones, cells, 1.0, NumpyNoise(3))
    u = zones.post_points(0)
    fits = {e: make_pool_learner(m, kernel="shared", threshold_sigmas=3.0, em_noise=e)
            .fit(counts) for e in ("clipped", "ignore")}
    assert make_pool_learner(m, kernel="shared").em_noise == "clipped"
    err = {}
    for e, learner in fits.items():
        errs = []
        for h in range(3):
            truth = push_forward(np.full(len(m.demand_samples[h]), 1 / len(m.demand_samples[h])),
                                 cell_map(u, m.demand_samples[h], m.next_from_post, cells),
                                 cells.n_cells)
            est = push_forward(learner.demand_[h], cell_map(u, learner.demand_grid_,
                                                            m.next_from_post, cells),
                               cells.n_cells)
            errs.append(np.abs(est - truth).sum(1).mean())
        err[e] = np.mean(errs)
    assert err["clipped"] < 0.8 * err["ignore"], err
    real = count_visits(data.states, data.actions, zones, cells).n_sas.sum((1, 2))
    for h in range(3):
        assert abs(fits["clipped"].mass_[h] - real[h]) < 0.15 * real[h]
    with pytest.raises(ValueError, match="em_noise"):
        make_pool_learner(m, kernel="shared", em_noise="bogus")


def test_cli_em_noise_flag_reproduces_round_two():
    import argparse

    from fedqhd.commands import pool as cli

    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers(dest="cmd"))
    assert cli._base(p.parse_args(["pool", "sweep", "--param", "M", "--values", "50"])
                     ).em_noise == "clipped"
    a = p.parse_args(["pool", "rho", "--em-noise", "ignore"])
    assert cli._base(a).em_noise == "ignore" and cli._tag(a) == "_em-ignore"
