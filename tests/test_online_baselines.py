"""The paper's truncate-and-average baseline and the pooled-data oracle of the online
protocol: exact aggregation, exact pooled ridge FQI, and both through the paper suite."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedqhd import online
from fedqhd.encoders import HDEncoder
from fedqhd.envs import get_spec
from fedqhd.online import OnlineClient, pooled_fit, run_online, truncate_average


def test_truncate_average_of_readouts_of_different_dims():
    rng = np.random.default_rng(0)
    readouts = [rng.normal(size=(d, 2)) for d in (4, 6, 5)]
    weights = np.array([0.2, 0.5, 0.3])
    merged = truncate_average(readouts, weights)
    mean = 0.2 * readouts[0][:4] + 0.5 * readouts[1][:4] + 0.3 * readouts[2][:4]
    for r, m in zip(readouts, merged, strict=True):
        assert m.shape == r.shape
        np.testing.assert_allclose(m[:4], mean, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(m[4:], r[4:])  # own rows beyond min D kept
    same = truncate_average(readouts[1:2] * 2, [0.25, 0.75])  # equal D: the mean
    np.testing.assert_allclose(same[0], readouts[1], rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="one weight per readout"):
        truncate_average(readouts, [1.0])


def test_truncate_clients_continue_from_the_truncated_average(monkeypatch):
    merged_by_round: list[list[np.ndarray]] = []
    fit_starts: list[np.ndarray] = []
    real_truncate, real_fit = online.truncate_average, OnlineClient.fit

    def spy_truncate(readouts, weights):
        out = real_truncate(readouts, weights)
        merged_by_round.append([m.copy() for m in out])
        return out

    def spy_fit(self, sweeps, init=None, prior=None):
        fit_starts.append(self.readout.copy())
        return real_fit(self, sweeps, init, prior)

    monkeypatch.setattr(online, "truncate_average", spy_truncate)
    monkeypatch.setattr(OnlineClient, "fit", spy_fit)
    res = run_online("CartPole-v1", n_clients=2, episodes=40, episodes_per_round=20,
                     encoder="heterogeneous", aggregate="truncate", capacity=400,
                     greedy_episodes=1)
    assert res.aggregate == "truncate" and len(merged_by_round) == 2
    first = merged_by_round[0]
    assert [m.shape[0] for m in first] == [500, 1000]  # D_i cycled from 500, 1000, ...
    np.testing.assert_array_equal(first[0], first[1][:500])
    assert np.abs(first[1][500:]).max() > 0  # the larger client keeps its own rows
    # round 2 starts each client's fit from what round 1's truncate-average gave it
    for start, merged in zip(fit_starts[2:], first, strict=True):
        np.testing.assert_array_equal(start, merged)


def test_truncate_with_the_shared_encoder_is_fedqhd_readout_averaging():
    kw = dict(n_clients=3, episodes=60, episodes_per_round=20, dim=100, seed=3,
              greedy_episodes=2)
    avg = run_online("CartPole-v1", aggregate="average", **kw)
    trunc = run_online("CartPole-v1", aggregate="truncate", **kw)
    assert [r["train-return-last100"] for r in trunc.rounds] == \
        [r["train-return-last100"] for r in avg.rounds]
    assert trunc.greedy_return == avg.greedy_return


def _client(seed: int, gamma: float = 0.9) -> OnlineClient:
    enc = HDEncoder(30, 1.0, scale=get_spec("CartPole-v1").obs_bound, random_state=1)
    enc.fit(np.zeros((1, 4)))
    return OnlineClient("CartPole-v1", enc, gamma=gamma, ridge=0.5, proximal=0.05,
                        capacity=1000, n_parallel=2, seed=seed, form="primal")


def _transitions(rng: np.random.Generator, n: int, r_lo: float, r_hi: float):
    bound = get_spec("CartPole-v1").obs_bound
    s0 = rng.uniform(-bound, bound, size=(n, 4))
    s1 = rng.uniform(-bound, bound, size=(n, 4))
    return (s0, rng.integers(2, size=n), rng.uniform(r_lo, r_hi, size=n), s1,
            rng.random(n) < 0.1)


def test_pooled_fit_is_ridge_fqi_on_the_union_of_the_buffers():
    rng = np.random.default_rng(7)
    clients = [_client(i) for i in range(3)]
    parts = [_transitions(rng, n, lo, hi)
             for n, lo, hi in ((80, 0.0, 1.0), (120, -1.0, 0.5), (60, 0.2, 2.0))]
    union = _client(99)
    for cl, part in zip(clients, parts, strict=True):
        cl.append(*part)
    union.append(*(np.concatenate(z) for z in zip(*parts, strict=True)))
    init = rng.normal(scale=30.0, size=(30, 2))  # large: the value-range clip binds
    prior = rng.normal(size=(30, 2))
    want = union.fit(3, init=init, prior=prior)
    got = pooled_fit(clients, 3, init=init, prior=prior)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)  # float32 Gram sums
    # not any one client's fit nor the average of the clients' fits
    local = [cl.fit(3, init=init, prior=prior) for cl in clients]
    assert np.abs(got - np.mean(local, axis=0)).max() > 1e-2
    assert min(np.abs(got - w).max() for w in local) > 1e-2


def test_pooled_fit_refuses_mismatched_clients():
    a, b = _client(0), _client(1, gamma=0.5)
    with pytest.raises(ValueError, match="same ridge"):
        pooled_fit([a, b], 1)


def test_pooled_mode_fits_one_readout_that_every_client_acts_with(monkeypatch):
    calls: list[tuple[list[OnlineClient], np.ndarray]] = []
    real = online.pooled_fit

    def spy(clients, sweeps, init=None, prior=None):
        out = real(clients, sweeps, init, prior)
        calls.append((list(clients), out))
        return out

    monkeypatch.setattr(online, "pooled_fit", spy)
    monkeypatch.setattr(OnlineClient, "fit", lambda *a, **k: pytest.fail("local fit"))
    res = run_online("CartPole-v1", n_clients=3, episodes=40, episodes_per_round=20,
                     dim=60, aggregate="pooled", greedy_episodes=1)
    assert res.aggregate == "pooled" and len(calls) == 2
    clients, readout = calls[-1]
    assert len(clients) == 3 and np.abs(readout).max() > 0
    for cl in clients:
        np.testing.assert_array_equal(cl.readout, readout)
    with pytest.raises(ValueError, match="needs the shared encoder"):
        run_online("CartPole-v1", encoder="heterogeneous", aggregate="pooled")


def test_paper_suite_runs_truncate_avg_and_the_oracle(tmp_path):
    from fedqhd import paper
    from fedqhd.cli import main

    rc = main(["bench", "--suite", "paper", "--envs", "CartPole-v1", "--methods",
               "truncate-avg,oracle", "--seeds", "0", "--clients", "2", "--episodes", "40",
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "paper.json").read_text())
    cells = {(c["method"], c["setting"]): c for c in data["cells"]}
    assert set(cells) == {("truncate-avg", "shared"), ("truncate-avg", "heterogeneous"),
                          ("oracle", "shared")}
    assert [cells[k]["aggregate"] for k in sorted(cells)] == ["pooled", "truncate", "truncate"]
    for c in cells.values():
        assert np.isfinite(c["train-return-last100"]) and c["curve"]
    table = (tmp_path / "paper-table.md").read_text()
    assert "| truncate-avg |" in table and "(230.8)" in table and "(112.6)" in table
    oracle_row = next(line for line in table.splitlines() if line.startswith("| oracle |"))
    assert "(" not in oracle_row and oracle_row.rstrip().endswith("| - |")
    with pytest.raises(ValueError, match="shared setting"):
        paper.run_cell("oracle", "CartPole-v1", "heterogeneous", 0)
