"""FedAvg-DQN and distillation FedDQN (fedqhd.baselines.dqn); skipped without JAX."""

import sys

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

from fedqhd.baselines import dqn  # noqa: E402
from fedqhd.baselines.dqn import DQNClients  # noqa: E402


def test_missing_jax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ImportError, match=r"fedqhd\[dqn\]"):
        dqn._require_jax()


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


def test_short_fedavg_dqn_run_learns_cartpole(tmp_path):
    """FedAvg-DQN in the Flower app, 2 clients x 100 episodes in process."""
    import json

    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig.from_run_config({
        "protocol": "online", "learner": "dqn", "online-episodes": 100, "seed": 0,
        "weighting": "uniform", "eval-episodes": 5, "min-nodes": 2,
        "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * 2, run_config=cfg.to_run_config()),
                            cfg)
    rows = json.loads((out / "results.json").read_text())["rounds"]
    assert len(rows) == 4
    # seed 0: last-100 20.9 -> 26.8 over the rounds, greedy 171 (uniform random: 21)
    assert rows[-1]["train-return-last100"] > rows[0]["train-return-last100"] + 3.0
    assert rows[-1]["return-mean"] > 80.0
