"""Offline FedAvg-DQN (``learner = "dqn"``, ``protocol = "offline"``) and DP-FedAvg
(``privacy = "dp-fedavg"``: Flower's server-side fixed-clipping wrapper around it)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import ConfigRecord
from messages import reply

from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners import get_learner, parse_run_config
from fedqhd.privacy.ledger import epsilon_exact
from fedqhd.server.app import strategy_kwargs
from fedqhd.strategies import contract as C
from fedqhd.strategies.dp import DPFedAvg, noise_multiplier, rho_spent

pytest.importorskip("jax")
pytest.importorskip("optax")

DP = {"learner": "dqn", "privacy": "dp-fedavg"}


class _Grid:
    def __init__(self, n: int) -> None:
        self.nodes = list(range(1, n + 1))

    def get_node_ids(self):
        return self.nodes


def test_noise_multiplier_spends_the_runs_rho_over_its_rounds():
    assert noise_multiplier(0.5, 4) == pytest.approx(2.0)  # sqrt(4 / (2 * 0.5))
    for rho, rounds in ((0.1, 1), (2.0, 30), (7.5, 200)):
        assert rho_spent(noise_multiplier(rho, rounds), rounds) == pytest.approx(rho)
    with pytest.raises(ValueError):
        noise_multiplier(0.0, 3)
    cfg = parse_run_config({**DP, "num-server-rounds": 8, "privacy-rho": 0.25, "min-nodes": 4,
                            "privacy-clip-norm": 0.7})
    plan = get_learner("dqn").server_plan(cfg, **strategy_kwargs(cfg))
    assert isinstance(plan.strategy, DPFedAvg)
    assert plan.strategy.noise_multiplier == pytest.approx(math.sqrt(8 / 0.5))
    assert (plan.strategy.clipping_norm, plan.strategy.num_sampled_clients) == (0.7, 4)
    report = plan.run_info["dp-fedavg"]
    assert report["rho"] == pytest.approx(0.25)
    assert report["epsilon"] == pytest.approx(epsilon_exact(0.25, 1e-5))
    # the inner strategy averages uniformly, without the screening's data-dependent clipping
    inner = plan.strategy.inner
    assert inner.weighting == "uniform"
    assert (inner.safeguards.clip_factor, inner.safeguards.norm_bound_factor) == (0.0, 0.0)


@pytest.mark.parametrize("keys, match", [
    ({"learner": "fqi"}, "'dp-fedavg' needs 'learner' = 'dqn' and 'protocol' = 'offline'"),
    ({"protocol": "online"}, "'dp-fedavg' needs 'learner' = 'dqn' and 'protocol' = 'offline'"),
    ({"aggregation": "median"}, "'aggregation' must be 'mean'"),
    ({"fraction-train": 0.5}, "'fraction-train' = 1"),
    ({"strategy": "anchor"}, "needs 'strategy' = 'avg'"),
    ({"non-private": True}, "set 'privacy' = 'none'"),
])
def test_dp_fedavg_refuses_what_its_accounting_does_not_cover(keys, match):
    with pytest.raises(ConfigError, match=match):
        parse_run_config({**DP, **keys})


def test_offline_dqn_runs_fedavg_only():
    parse_run_config({"learner": "dqn"})  # offline FedAvg-DQN
    with pytest.raises(ConfigError, match="'protocol' = 'offline'.*FedAvg-DQN only"):
        parse_run_config({"learner": "dqn", "strategy": "anchor"})


@pytest.fixture(autouse=True)
def _server_identity(monkeypatch):
    """Messages are built as a ServerApp builds them (its run, node and task ids)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)


def _dp_strategy(n: int, rho: float, clip: float, rounds: int = 1) -> tuple:
    cfg = parse_run_config({**DP, "num-server-rounds": rounds, "privacy-rho": rho,
                            "min-nodes": n, "privacy-clip-norm": clip})
    plan = get_learner("dqn").server_plan(cfg, **strategy_kwargs(cfg))
    strategy = plan.strategy
    messages = list(strategy.configure_train(1, plan.initial_arrays, ConfigRecord(), _Grid(n)))
    assert len(messages) == n
    return strategy, plan.initial_arrays[C.NETWORK].numpy().astype(np.float64)


def test_dp_fedavg_adds_noise_of_the_claimed_std_to_the_mean():
    """Updates inside the clip norm: the aggregate is their plain mean plus Gaussian noise of
    std z C / n per coordinate (z = 2 here: rho 0.5 over 4 rounds)."""
    np.random.seed(0)
    n, clip = 3, 1.0
    strategy, start = _dp_strategy(n, rho=0.5, clip=clip, rounds=4)
    rng = np.random.default_rng(1)
    replies_arrays = []
    for _ in range(n):
        step = rng.normal(size=start.shape)
        replies_arrays.append(start + 0.5 * clip * step / np.linalg.norm(step))
    arrays, _ = strategy.aggregate_train(1, [
        reply(i + 1, {C.NETWORK: a.astype(np.float32)}, {C.NUM_TRANSITIONS: 10 * (i + 1)})
        for i, a in enumerate(replies_arrays)])
    noise = arrays[C.NETWORK].numpy() - np.mean(replies_arrays, axis=0)
    claimed = 2.0 * clip / n
    assert abs(noise.mean()) < 0.05 * claimed
    assert noise.std() == pytest.approx(claimed, rel=0.03)
    assert strategy.last_train_metrics[C.REPLIES_OK] == n


def test_dp_fedavg_clips_every_update_to_the_clip_norm():
    """Updates of norm 100: each is scaled to norm C before the uniform mean (noise
    negligible at rho 1e6)."""
    np.random.seed(0)
    n, clip = 3, 0.5
    strategy, start = _dp_strategy(n, rho=1e6, clip=clip)
    rng = np.random.default_rng(2)
    steps = [100.0 * s / np.linalg.norm(s) for s in rng.normal(size=(n, start.size))]
    arrays, _ = strategy.aggregate_train(1, [
        reply(i + 1, {C.NETWORK: (start + s).astype(np.float32)}, {C.NUM_TRANSITIONS: 10})
        for i, s in enumerate(steps)])
    update = arrays[C.NETWORK].numpy() - start
    expected = np.mean([clip * s / 100.0 for s in steps], axis=0)
    np.testing.assert_allclose(update, expected, atol=1e-3)
    assert np.linalg.norm(update) <= clip * 1.01


def test_a_round_with_an_error_reply_aggregates_nothing_and_says_so():
    strategy, start = _dp_strategy(2, rho=1.0, clip=1.0)
    arrays, _ = strategy.aggregate_train(1, [
        reply(1, {C.NETWORK: start.astype(np.float32)}, {C.NUM_TRANSITIONS: 10}),
        reply(2, error="boom")])
    assert arrays is None
    metrics = strategy.last_train_metrics
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_FAILED]) == (0, 1)


def _run(tmp_path, **keys):
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig.from_run_config({"learner": "dqn", "env-id": "CartPole-v1", "seed": 0,
                                     "gamma": 0.95, "min-nodes": 2, "eval-episodes": 5,
                                     "output-dir": str(tmp_path), **keys})
    _, out = run_federation(InProcessGrid([client_app] * 2, run_config=cfg.to_run_config()),
                            cfg)
    return json.loads((out / "results.json").read_text())


def test_offline_fedavg_dqn_learns_cartpole_from_small_shards(tmp_path):
    """Two clients of 100 mostly random episodes, 5 rounds x 200 Adam steps: the global
    network's greedy return goes from 9-10 after round 1 to far above uniform random's 23
    after round 5 (seeds 0-3: 379, 184, 208, 197), and every round's TD loss falls within
    the round. About 2 s CPU."""
    results = _run(tmp_path, **{"episodes-per-client": 100, "num-server-rounds": 5,
                                "local-iterations": 200})
    rounds = results["rounds"]
    assert all(r[C.REPLIES_OK] == 2 for r in rounds)
    assert all(r["td-loss-end"] < r["td-loss-start"] for r in rounds)
    assert rounds[0][C.RETURN_MEAN] < 20.0
    assert rounds[-1][C.RETURN_MEAN] > 100.0, [r[C.RETURN_MEAN] for r in rounds]
    assert results["final"]["status"] == "completed"


def test_dp_fedavg_run_reports_its_epsilon(tmp_path):
    results = _run(tmp_path, **{**DP, "episodes-per-client": 10, "num-server-rounds": 2,
                                "local-iterations": 20, "privacy-rho": 2.0})
    final = results["final"]
    assert final["status"] == "completed"
    assert all(r[C.REPLIES_OK] == 2 for r in results["rounds"])
    dp = final["dp-fedavg"]
    assert dp["noise-multiplier"] == pytest.approx(math.sqrt(2 / 4.0))
    assert dp["epsilon"] == pytest.approx(epsilon_exact(2.0, 1e-5))
    assert "client" in dp["unit"]
