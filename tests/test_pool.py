"""POOL: projection vs LP, zones, interpolation, privacy boundary, learned policy."""

import math

import numpy as np
import pytest
from scipy.optimize import linprog

from fedqhd.envs.inventory import (
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.pool import (
    METHODS,
    NoisyCounts,
    PoolLearner,
    client_release,
    count_visits,
    e_rho,
    exact_counts,
    fit_method,
    make_pool_learner,
    make_zoning,
    project_counts,
)
from fedqhd.privacy import BudgetExceededError, NumpyNoise, PrivacyLedger


def _lp_value(v, n, e):
    s = v.size  # variables x (s), t; minimise t
    c = np.r_[np.zeros(s), 1.0]
    eye = np.eye(s)
    a_ub = np.vstack([np.c_[eye, -np.ones(s)], np.c_[-eye, -np.ones(s)],
                      np.r_[np.ones(s), 0.0], np.r_[-np.ones(s), 0.0]])
    b_ub = np.r_[v, -v, n + e / 2, -(n - e / 2)]
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, bounds=[(0, None)] * s + [(None, None)],
                  method="highs")
    assert res.status == 0
    return res.fun


def test_projection_matches_linprog_on_random_instances():
    rng = np.random.default_rng(0)
    for _ in range(60):
        s = rng.integers(1, 12)
        v = np.maximum(rng.normal(rng.uniform(0, 5), 3, size=s), 0)
        n = max(0.0, v.sum() + rng.normal(0, 8))
        e = rng.uniform(0, 6)
        x = project_counts(v[None], np.array([n]), e)[0]
        assert x.min() >= -1e-12
        assert abs(x.sum() - n) <= e / 2 + 1e-9  # feasible
        assert np.max(np.abs(x - v)) == pytest.approx(_lp_value(v, n, e), abs=1e-7)


def test_norm_zones_interpolation_and_boundary():
    zones, _ = make_zoning(2, 2, 3, n_zones=40, lam=0.8)
    rng = np.random.default_rng(1)
    b = rng.uniform(0, 0.8, size=(500, 4))
    z = zones.zone_of(0, b)
    assert z.min() >= 0 and z.max() < 40 and len(np.unique(z)) > 20
    assert np.all(zones.zone_of(0, np.array([[0.9, 0.1, 0.1, 0.1]])) == -1)
    pts = zones.base_points(0)
    assert np.all(zones.zone_of(0, pts.reshape(-1, 4)) == np.repeat(np.arange(40), 4))
    # interpolation reproduces the base values and constants, and is linear in-zone
    qbar = rng.random((40, 4))
    coef = zones.interpolator(0, qbar)
    np.testing.assert_allclose(zones.interpolate(0, coef, pts), qbar, atol=1e-9)
    const = zones.interpolator(0, np.full((40, 4), 2.5))
    np.testing.assert_allclose(zones.interpolate(0, const, b), 2.5, atol=1e-9)
    # outside the observable region: value at the nearest boundary point
    out, edge = np.array([[0.95, 0.1, 0.2, 0.3]]), np.array([[0.8 * (1 - 1e-9), 0.1, 0.2, 0.3]])
    assert zones.interpolate(0, coef, out) == pytest.approx(zones.interpolate(0, coef, edge))


def test_higher_feedback_observes_the_other_side():
    zones, _ = make_zoning(1, 1, 2, n_zones=10, lam=0.3, feedback="higher")
    assert zones.zone_of(0, np.array([[0.5, 0.6]]))[0] >= 0
    assert zones.zone_of(0, np.array([[0.2, 0.6]]))[0] == -1


def test_counts_drop_unobservable_and_noise_is_charged():
    m = make_inventory_model(w=1, horizon=3)
    data = generate_dataset(m, 400, random_state=0)
    zones, cells = make_zoning(1, 1, 3, n_zones=10, lam=0.5, n_cells=5)
    raw = count_visits(data.states, data.actions, zones, cells)
    seen = np.all(np.stack([data.states[:, :3, 0], data.actions[:, :, 0]], -1) < 0.5, -1)
    np.testing.assert_array_equal(raw.n_sa.sum(1), seen.sum(0))
    np.testing.assert_array_equal(raw.n_sas.sum(2), raw.n_sa)
    led = PrivacyLedger(budget_rho=1.5, client_id="c")
    noisy = client_release(data, zones, cells, 1.0, NumpyNoise(0), led)
    assert isinstance(noisy, NoisyCounts) and noisy.private
    assert noisy.sigma == pytest.approx(math.sqrt(2 * 3 / 1.0))
    assert led.rho_spent == pytest.approx(1.0)
    assert not np.array_equal(noisy.n_sas, raw.n_sas)  # noise was added
    with pytest.raises(BudgetExceededError):
        client_release(data, zones, cells, 1.0, NumpyNoise(0), led)
    assert not exact_counts(raw).private


def test_learner_refuses_raw_data_and_is_post_processing():
    m = make_inventory_model(w=1, horizon=3)
    zones, cells = make_zoning(1, 1, 3, n_zones=10, n_cells=5)
    a = generate_dataset(m, 300, random_state=0)
    with pytest.raises(TypeError):
        make_pool_learner(m).fit(a)
    b = generate_dataset(m, 300, random_state=1)
    raw_a, raw_b = (count_visits(d.states, d.actions, zones, cells) for d in (a, b))
    assert not np.array_equal(raw_a.n_sas, raw_b.n_sas)  # two different private datasets

    class SameRelease:  # "noise" that lands any dataset on raw_a's counts plus 2
        secure, label = False, "fixed (test)"

        def add_noise(self, values, sigma):
            target = raw_a.n_sa if values.shape == raw_a.n_sa.shape else raw_a.n_sas
            return target + 2.0

    release_a = client_release(a, zones, cells, 1.0, SameRelease())
    release_b = client_release(b, zones, cells, 1.0, SameRelease())
    # identical released counts give identical outputs, whatever raw data produced them
    pts = np.random.default_rng(0).random((50, 2))
    q1 = make_pool_learner(m).fit(release_a).q_values(0, pts)
    q2 = make_pool_learner(m).fit(release_b).q_values(0, pts)
    np.testing.assert_array_equal(q1, q2)
    assert np.all((q1 >= 0) & (q1 <= 3)) and np.ptp(q1) > 0


def test_e_rho_formula():
    assert e_rho(7, 200, 4, 2, 1.0, 1e-5) == pytest.approx(
        4 * math.sqrt(7 * math.log(4 * 7 * 200**2 * 4 * 2 / 1e-5)))
    assert e_rho(7, 200, 4, 2, math.inf, 1e-5) == 0.0


@pytest.mark.parametrize("model", ["lost_sales", "backlogged"])
def test_learned_policy_beats_naive_baselines(model):
    m = make_inventory_model(w=1, horizon=5, model=model, random_state=2)
    data = generate_dataset(m, 3000, random_state=1)
    zones, cells = make_zoning(1, 1, 5, n_zones=50)
    pol, _ = optimal_policy(m)
    c_star = m.rollout_cost(pol, 4000, 3)
    rand = m.rollout_cost(lambda h, s: np.random.default_rng(h).random(s.shape), 4000, 3)
    zero = m.rollout_cost(lambda h, s: np.zeros_like(s), 4000, 3)
    for method in ("nonprivate", "pool"):
        learner = fit_method(method, m, data, zones, cells, rho=5.0, random_state=0)
        cost = m.rollout_cost(learner.act, 4000, 3)
        assert cost < min(rand, zero), method
        assert relative_gap(cost, c_star) > -2.0


def test_all_methods_run():
    m = make_inventory_model(w=2, horizon=7)
    data = generate_dataset(m, 2000, random_state=0)
    zones, cells = make_zoning(2, 2, 7, n_zones=200)
    for method in METHODS:
        learner = fit_method(method, m, data, zones, cells, rho=1.0)
        assert learner.act(0, np.full((3, 2), 0.2)).shape == (3, 2)
    with pytest.raises(ValueError):
        fit_method("bogus", m, data, zones, cells, rho=1.0)
    assert isinstance(make_pool_learner(m), PoolLearner)
