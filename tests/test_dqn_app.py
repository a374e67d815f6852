"""FedAvg-DQN in the Flower app (``learner = "dqn"``, in process, no Ray)."""

from __future__ import annotations

import importlib.util
import inspect
import json

import numpy as np
import pytest

from fedqhd.baselines.dqn import DQN_SETTINGS, initial_network, network_shapes
from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners import parse_run_config
from fedqhd.learners.dqn import pack, unpack
from fedqhd.seeding import dqn_client_rngs


def test_missing_jax_refuses_the_run_config_with_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "jax" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'learner' = 'dqn' needs jax.*fedqhd\[dqn\]"):
        parse_run_config({"protocol": "online", "learner": "dqn"})


def test_dqn_config_takes_the_papers_settings_and_distillation_needs_the_online_protocol():
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    cfg = RunConfig.from_run_config({"protocol": "online", "learner": "dqn"})
    assert (cfg.gamma, cfg.episodes_per_round) == (0.99, 25)
    assert cfg.online.epsilon == (1.0, 0.995, 0.001)
    assert cfg.num_server_rounds == 24  # 600 episodes per client, as the paper
    assert parse_run_config({"learner": "dqn"}).protocol == "offline"  # offline FedAvg-DQN
    with pytest.raises(ConfigError, match="distillation FedDQN.*needs 'protocol' = 'online'"):
        parse_run_config({"learner": "dqn", "encoder": "heterogeneous"})
    assert cfg.num_anchors == 200  # the paper's, for distillation
    for strategy, encoder in (("anchor", "shared"), ("auto", "heterogeneous")):
        distill = RunConfig.from_run_config({"protocol": "online", "learner": "dqn",
                                             "strategy": strategy, "encoder": encoder})
        assert distill.resolved_strategy == "anchor" and distill.num_anchors == 200
    with pytest.raises(ConfigError, match="'strategy' = 'independent'"):
        parse_run_config({"protocol": "online", "learner": "dqn", "strategy": "independent"})


def test_dqn_settings_are_the_in_process_baselines_defaults():
    from fedqhd.baselines.dqn import DQNClients

    init = inspect.signature(DQNClients).parameters
    assert DQN_SETTINGS["gamma"] == init["gamma"].default
    assert DQN_SETTINGS["epsilon"] == (init["eps_start"].default, init["eps_decay"].default,
                                       init["eps_min"].default)


def test_network_packing_round_trips_and_a_node_explores_as_its_in_process_client():
    params = initial_network("Acrobot-v1", 3)
    shapes = network_shapes(6, 3)
    assert [p.shape for p in params] == shapes
    back = unpack(pack(params), shapes)
    for a, b in zip(params, back, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="parameters"):
        unpack(pack(params)[1:], shapes)
    # a node holding partition 2 alone draws what client 2 of five draws in process
    np.testing.assert_array_equal(dqn_client_rngs(7, 1, first=2)[0].random(5),
                                  dqn_client_rngs(7, 5)[2].random(5))


def test_fedavg_dqn_app_run_learns_cartpole(tmp_path):
    """Two clients x 4 rounds x 25 episodes (seeds 0-3 checked: the global network's
    greedy return 171-313 after round 4, from about 10 at init; the clients' training
    return over their 100 episodes 26-34, from 18-22 in round 1). About 12 s CPU."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = RunConfig.from_run_config({"protocol": "online", "learner": "dqn",
                                     "online-episodes": 100, "weighting": "uniform", "seed": 0,
                                     "eval-episodes": 5, "min-nodes": 2,
                                     "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * 2, run_config=cfg.to_run_config()),
                            cfg)
    results = json.loads((out / "results.json").read_text())
    rounds = results["rounds"]
    assert len(rounds) == 4 and all(r["replies-ok"] == 2 for r in rounds)
    transitions = [r["num-transitions"] for r in rounds]
    assert all(b > a for a, b in zip(transitions, transitions[1:], strict=False))
    assert rounds[-1]["return-mean"] > 80.0, rounds[-1]["return-mean"]
    assert rounds[-1]["train-return-last100"] > rounds[0]["train-return-last100"] + 3.0
    assert results["final"]["status"] == "completed"
    with np.load(out / "final_model.npz") as model:  # the global network, flattened
        assert model["network"].shape == (sum(int(np.prod(s)) for s in network_shapes(4, 2)),)


def test_a_paper_suite_dqn_cell_runs_to_its_numbers():
    """``fedqhd bench --suite paper --methods fedavg-dqn``: a DQN cell reports no value bias
    (its clients have no start-state Q to compare), and the cell still ends with its
    numbers and an empty value-bias curve rather than a KeyError after the whole run."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.studies import paper

    cell = paper.run_app_cell("fedavg-dqn", "CartPole-v1", "shared", seed=0, episodes=50,
                              clients=2)
    assert np.isfinite(cell["train-return-last100"]) and cell["curve"]
    assert cell["value-bias"] == []
