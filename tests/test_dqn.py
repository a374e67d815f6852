"""FedAvg-DQN and distillation FedDQN (fedqhd.baselines.dqn); skipped without JAX."""

import sys

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

from fedqhd.baselines import dqn  # noqa: E402
from fedqhd.baselines.dqn import DQNClients, fedavg, run_fedavg_dqn  # noqa: E402


def test_missing_jax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ImportError, match=r"fedqhd\[dqn\]"):
        dqn._require_jax()


def test_fedavg_is_the_elementwise_weighted_mean():
    rng = np.random.default_rng(0)
    clients = [[rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4)]
               for _ in range(3)]
    w = np.array([1.0, 2.0, 5.0])
    out = fedavg(clients, w)
    for k in range(2):
        expected = sum(wi * c[k] for wi, c in zip(w / w.sum(), clients, strict=True))
        np.testing.assert_allclose(out[k], expected, rtol=1e-6)
        assert out[k].dtype == clients[0][k].dtype
    np.testing.assert_allclose(fedavg(clients)[1], np.mean([c[1] for c in clients], axis=0))
    with pytest.raises(ValueError):
        fedavg(clients, [1.0, -1.0, 1.0])


def test_parameters_round_trip_and_padded_widths_compute_the_narrow_network():
    c = DQNClients("CartPole-v1", 3, seed=1, hidden=[(128, 256), (32, 64), (48, 16)])
    try:
        states = np.random.default_rng(2).normal(size=(50, 4)).astype(np.float32)
        q = c.q_values(states)
        for i, (h1, h2) in enumerate(c.hidden):
            p = c.get_parameters(i)
            assert [a.shape for a in p] == [(4, h1), (h1,), (h1, h2), (h2,), (h2, 2), (2,)]
            w1, b1, w2, b2, w3, b3 = p
            ref = np.maximum(np.maximum(states @ w1 + b1, 0) @ w2 + b2, 0) @ w3 + b3
            np.testing.assert_allclose(q[i], ref, rtol=1e-4, atol=1e-5)
        c.collect_and_train(3)
        teacher = c.q_values(states).mean(axis=0)
        c.distill(states, teacher, steps=5)
        # masked units neither act nor move: the padding is still exactly zero
        w1 = np.asarray(c._params[0])
        assert np.all(w1[1, :, 32:] == 0) and np.all(w1[2, :, 48:] == 0)
        # and the masks make the padding inert even when it is not zero
        narrow = c.q_values(states)
        rng = np.random.default_rng(5)
        c._params = tuple(p + rng.normal(size=p.shape).astype(np.float32) * (p == 0)
                          for p in c._params)
        np.testing.assert_allclose(c.q_values(states)[1:], narrow[1:], rtol=1e-4, atol=1e-5)
        new = [a + 1.0 for a in c.get_parameters(1)]
        c.set_parameters(new, 1)
        for a, b in zip(c.get_parameters(1), new, strict=True):
            np.testing.assert_array_equal(a, b)
        with pytest.raises(ValueError, match="expects arrays of shapes"):
            c.set_parameters(c.get_parameters(0), 1)
    finally:
        c.close()


def test_distillation_step_reduces_the_kl_to_the_teacher():
    c = DQNClients("CartPole-v1", 4, seed=3, hidden=[(128, 256), (64, 128), (96, 192), (48, 96)])
    try:
        c.collect_and_train(5)
        anchors = np.random.default_rng(4).uniform(-1, 1, size=(200, 4)) * [2.4, 3.0, 0.2, 2.0]
        teacher = 5.0 * c.q_values(anchors).mean(axis=0)  # sharper than any client
        kl0 = c.kl_to_teacher(anchors, teacher)
        before, after = c.distill(anchors, teacher, tau=1.0, steps=10)
        np.testing.assert_allclose(before, kl0, rtol=1e-4)
        assert np.all(before > 0)
        assert np.all(after < 0.8 * before), (before, after)
        np.testing.assert_allclose(after, c.kl_to_teacher(anchors, teacher), rtol=1e-4)
    finally:
        c.close()


def test_short_fedavg_dqn_run_learns_cartpole():
    # checked on seeds 0-4: last-20 training return 37-45 (first-20: 18-24;
    # uniform random policy: 21), greedy return of the global network 138-236
    r = run_fedavg_dqn("CartPole-v1", n_clients=2, episodes=100, aggregate_every=25, seed=0,
                       eval_episodes=5)
    ret = r["returns"]
    assert ret.shape == (2, 100) and len(r["rounds"]) == 4
    assert ret[:, -20:].mean() > 30.0, ret[:, -20:].mean()
    assert r["greedy-return"] > 80.0, r["greedy-return"]
    assert r["cpu-s"] > 0 and r["wall-s"] > 0
