"""Inventory MDP: gymnasium contract, dynamics, reference optimum, data loaders."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from fedqhd.envs.inventory import (
    ENV_ID,
    InventoryEnv,
    generate_dataset,
    load_bike_sharing,
    load_rossmann,
    make_inventory_model,
    optimal_policy,
    weekly_demand_samples,
)


@pytest.mark.parametrize("model", ["lost_sales", "backlogged"])
def test_check_env_and_registration(model):
    check_env(InventoryEnv(w=3, model=model))
    env = gym.make(ENV_ID, w=2, horizon=7)
    obs, _ = env.reset(seed=0)
    steps, done = 0, False
    while not done:
        obs, r, done, trunc, info = env.step(env.action_space.sample())
        assert r <= 0 and obs.shape == (2,)
        steps += 1
    assert steps == 7


def test_lost_sales_dynamics_and_observable_reward():
    m = make_inventory_model(w=1, horizon=1, model="lost_sales")
    s, a, d = np.array([[0.2]]), np.array([[0.3]]), np.array([[0.4]])
    s2, cost, r = m.step_batch(0, s, a, d)
    assert s2[0, 0] == pytest.approx(0.1)
    hh, bb = m.holding[0, 0], m.backorder[0, 0]
    assert cost[0] == pytest.approx(0.1 * hh)
    # reward = revenue - holding = -cost + b*D  (policy-independent shift)
    assert r[0] == pytest.approx(-cost[0] + bb * 0.4)
    s2, cost, r = m.step_batch(0, s, a, np.array([[0.9]]))  # censored demand
    assert s2[0, 0] == 0 and cost[0] == pytest.approx(0.4 * bb)
    assert r[0] == pytest.approx(0.5 * bb)  # sales only: demand above y unseen


def test_backlogged_state_scaling():
    m = make_inventory_model(w=1, horizon=1, model="backlogged")
    s2, cost, r = m.step_batch(0, np.array([[0.5]]), np.array([[0.2]]), np.array([[0.7]]))
    assert m.stock(s2)[0, 0] == pytest.approx(-0.5)
    assert r[0] == pytest.approx(-cost[0])


@pytest.mark.parametrize("model,demand", [("lost_sales", "uniform"), ("backlogged", "bike")])
def test_reference_optimum_is_consistent_and_beats_heuristics(model, demand):
    m = make_inventory_model(w=2, horizon=5, model=model, demand=demand, random_state=3)
    pol, c_star = optimal_policy(m)
    mc = m.rollout_cost(pol, 20000, 1)
    assert mc == pytest.approx(c_star, rel=0.02)
    for level in (0.0, 0.3, 0.6, 0.9):
        heur = m.rollout_cost(lambda h, s, v=level: np.clip(v - m.stock(s), 0, 1), 20000, 1)
        assert heur >= mc - 1e-9


def test_dataset_is_deterministic():
    m = make_inventory_model(w=2, horizon=4)
    a, b = generate_dataset(m, 50, random_state=7), generate_dataset(m, 50, random_state=7)
    np.testing.assert_array_equal(a.states, b.states)
    assert a.states.shape == (50, 5, 2) and a.states.min() >= 0 and a.states.max() <= 1
    assert not np.array_equal(a.states, generate_dataset(m, 50, random_state=8).states)


def test_bike_data_ships_with_package():
    vals, wd = load_bike_sharing(["casual", "registered"])
    assert vals.shape == (731, 2) and set(wd) == set(range(7))
    samples = weekly_demand_samples(vals, wd)
    assert len(samples) == 7 and all(0 <= s.min() and s.max() <= 1 for s in samples)


def test_rossmann_loader(tmp_path):
    p = tmp_path / "train.csv"
    p.write_text(
        "Store,DayOfWeek,Date,Sales,Customers,Open,Promo,StateHoliday,SchoolHoliday\n"
        "1,2,2015-07-28,5000,500,1,1,0,0\n"
        "1,1,2015-07-27,6000,600,1,1,0,0\n"
        "2,1,2015-07-27,9000,700,1,1,0,0\n"
        "1,7,2015-07-26,0,0,0,0,0,0\n"
    )
    sales, wd = load_rossmann(p, store=1)
    np.testing.assert_array_equal(sales[:, 0], [6000, 5000])  # date order, open days only
    np.testing.assert_array_equal(wd, [1, 2])
    bad = tmp_path / "bad.csv"
    bad.write_text("Store,Date,Sales\n1,2015-07-27,5\n")
    with pytest.raises(ValueError, match="lacks column"):
        load_rossmann(bad)
    bad.write_text("Store,DayOfWeek,Date,Sales,Open\n1,9,2015-07-27,5,1\n")
    with pytest.raises(ValueError, match="malformed"):
        load_rossmann(bad)
    bad.write_text("Store,DayOfWeek,Date,Sales,Open\n1,x,2015-07-27,5,1\n")
    with pytest.raises(ValueError, match="malformed"):
        load_rossmann(bad)
