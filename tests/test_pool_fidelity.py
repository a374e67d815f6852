"""POOL fidelity (issue 9): common reward scale, post-decision zones, base-stock data, epsilon."""

import math

import numpy as np
import pytest

from fedqhd.envs.inventory import (
    generate_dataset,
    make_inventory_model,
    optimal_policy,
    relative_gap,
)
from fedqhd.pool import count_visits, fit_method, make_zoning
from fedqhd.privacy import PrivacyLedger, epsilon_cks, epsilon_exact, epsilon_opendp


def _gap(model, zoning, n=3000, reward_scale="common", seed=1):
    data = generate_dataset(model, n, random_state=seed)
    zones, cells = make_zoning(model.w, model.w, model.horizon, 50, zoning=zoning, model=model)
    learner = fit_method("nonprivate", model, data, zones, cells, rho=1.0,
                         reward_scale=reward_scale)
    ref, _ = optimal_policy(model)
    c_star = model.rollout_cost(ref, 3000, 5)
    return relative_gap(model.rollout_cost(learner.act, 3000, 5), c_star)


@pytest.mark.parametrize("dynamics", ["backlogged", "lost_sales"])
def test_common_reward_scale_on_stage_costs_25x_apart(dynamics):
    m = make_inventory_model(w=1, horizon=4, model=dynamics, random_state=0)
    m.holding[:] = [[0.02], [0.1], [0.02], [0.1]]  # stage cost scales differ 25x
    m.backorder[:] = [[0.004], [0.5], [0.004], [0.5]]
    lo, hi = m.common_reward_bounds()
    assert lo == min(m.reward_bounds(h)[0] for h in range(4))
    assert hi == max(m.reward_bounds(h)[1] for h in range(4))
    common = _gap(m, "post-decision")
    per_stage = _gap(m, "post-decision", reward_scale="stage")
    assert common < 6.0, common            # near the DP optimum c*
    if dynamics == "backlogged":  # the reweighted objective is not (lost sales: no harm here)
        assert per_stage > common + 10.0, (per_stage, common)


def test_post_decision_counts_keep_pool_sensitivity():
    m = make_inventory_model(w=2, horizon=5, random_state=0)
    a = generate_dataset(m, 400, random_state=0)
    b = generate_dataset(m, 400, random_state=1)
    zones, cells = make_zoning(2, 2, 5, 50, lam=0.9, zoning="post-decision", model=m)
    assert cells.kind == "grid" and zones.kind == "post-decision"
    ca = count_visits(a.states, a.actions, zones, cells)
    # one count per stage per family per observable trajectory, none otherwise
    for h in range(5):
        bh = np.concatenate([a.states[:, h], a.actions[:, h]], 1)
        seen = int(zones.observable(h, bh).sum())
        assert ca.n_sa[h].sum() == seen == ca.n_sas[h].sum()
    for i in (0, 7, 399):  # replace trajectory i by one from another dataset
        states, actions = a.states.copy(), a.actions.copy()
        states[i], actions[i] = b.states[i], b.actions[i]
        cb = count_visits(states, actions, zones, cells)
        for fa, fb in ((ca.n_sa, cb.n_sa), (ca.n_sas, cb.n_sas)):
            diff = np.abs(fa - fb)
            assert diff.max() <= 1 and diff.sum() <= 2 * 5  # <= 2H entries by one
            assert math.sqrt(np.sum(diff**2)) <= math.sqrt(2 * 5)


def test_post_decision_interpolation_reproduces_nodes_and_depends_on_y_only():
    m = make_inventory_model(w=2, horizon=2, model="backlogged")
    zones, _ = make_zoning(2, 2, 2, 50, zoning="post-decision", model=m)
    rng = np.random.default_rng(0)
    qbar = rng.random((zones.n_zones, 1))
    coef = zones.interpolator(0, qbar)
    pts = zones.base_points(0)[:, 0]
    np.testing.assert_allclose(zones.interpolate(0, coef, pts), qbar[:, 0], atol=1e-6)
    s = rng.uniform(0.3, 0.6, (100, 2))
    a = rng.uniform(0.0, 0.3, (100, 2))
    u = m.post_decision(np.concatenate([s, a], 1))
    np.testing.assert_allclose(m.post_decision(m.decision_point(u)), u, atol=1e-12)
    q1 = zones.interpolate(0, coef, np.concatenate([s, a], 1))
    q2 = zones.interpolate(0, coef, m.decision_point(u))
    np.testing.assert_allclose(q1, q2, atol=1e-6)


def test_nonprivate_post_decision_near_optimal_where_norm_zones_are_not():
    m = make_inventory_model(w=2, horizon=3, model="backlogged", random_state=0)
    new, old = _gap(m, "post-decision"), _gap(m, "norm")
    assert new < 8.0, new
    assert old > 30.0, old


def test_base_stock_behaviour():
    m = make_inventory_model(w=2, horizon=4, random_state=0)
    levels = m.newsvendor_levels()
    np.testing.assert_allclose(levels, m.backorder / (m.backorder + m.holding))
    exact = generate_dataset(m, 200, random_state=3, behaviour="base-stock", noise=0.0)
    for h in range(4):
        y = m.order_up_to(exact.states[:, h], exact.actions[:, h])
        np.testing.assert_allclose(y, np.maximum(m.stock(exact.states[:, h]), levels[h]))
    noisy = generate_dataset(m, 4000, random_state=3, behaviour="base-stock")
    again = generate_dataset(m, 4000, random_state=3, behaviour="base-stock")
    np.testing.assert_array_equal(noisy.actions, again.actions)
    i = int(np.argmax(levels[0]))
    assert levels[0, i] > 0.5
    x = m.stock(noisy.states[:, 0, i])  # U[0, 1] at the first stage
    below = x < levels[0, i] - 0.45      # 3 noise sigmas below: orders almost never clipped
    y = np.minimum(x + noisy.actions[:, 0, i], 1.0)[below]
    assert below.sum() > 100
    assert abs(y.mean() - levels[0, i]) < 0.03 and 0.12 < y.std() < 0.18
    with pytest.raises(ValueError, match="behaviour"):
        generate_dataset(m, 10, behaviour="bogus")


def test_opendp_epsilon_beyond_its_map_is_cks_bound_not_an_error():
    """OpenDP's zCDP-to-approxDP map overflows at large rho (a ledger may total up to 10^6);
    the reported epsilon is then CKS's, valid for any rho-zCDP release, never below OpenDP's."""
    d = 1e-5
    eps = {rho: epsilon_opendp(rho, d) for rho in (1e4, 1e5, 1e6)}
    assert eps[1e5] == epsilon_cks(1e5, d) and eps[1e6] == epsilon_cks(1e6, d)
    assert eps[1e4] < epsilon_cks(1e4, d) < eps[1e5] < eps[1e6]
    ledger = PrivacyLedger(1e6, d)
    ledger.spend(5e5, noise="opendp-discrete-gaussian")
    assert ledger.conversion == "opendp" and ledger.epsilon() == epsilon_cks(5e5, d)


def test_epsilon_uses_the_conversion_valid_for_the_noise():
    d = 1e-5
    num, odp, mixed = (PrivacyLedger(100.0, d) for _ in range(3))
    num.spend(10.0, noise="numpy-seeded (NOT secure)")
    odp.spend(10.0, noise="opendp-discrete-gaussian")
    mixed.spend(5.0, noise="numpy-seeded (NOT secure)")
    mixed.spend(5.0, noise="opendp-discrete-gaussian")
    assert num.conversion == "exact-gaussian" and num.epsilon() == epsilon_exact(10.0, d)
    assert odp.conversion == "opendp" and odp.epsilon() == epsilon_opendp(10.0, d)
    assert mixed.conversion == "cks" and mixed.epsilon() == epsilon_cks(10.0, d)
    # the continuous curve under-reports for the discrete Gaussian; OpenDP's map does not
    assert epsilon_opendp(10.0, d) > epsilon_exact(10.0, d)
    assert epsilon_opendp(10.0, d) <= epsilon_cks(10.0, d) + 1e-9
    by = mixed.epsilon_by_noise()
    assert by["opendp-discrete-gaussian"]["conversion"] == "opendp"
    assert by["opendp-discrete-gaussian"]["rho"] == 5.0
    assert mixed.to_dict()["epsilon_conversion"] == "cks"
