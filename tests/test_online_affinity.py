"""A node's online client does not depend on which process serves it: Flower's Ray actor
pool sends a node's messages to whichever actor is free, so the node's state lives in its
``context.state`` and a process's copy is only a cache (:mod:`fedqhd.learners.fqi_online`).
Here two "actors" are emulated in process by swapping the learner's process cache."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.learners import fqi_online
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, run_online_kwargs
from fedqhd.online import run_online
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

KEYS = {"protocol": "online", "online-settings": "manual", "hd-dim": 300, "gamma": 0.9,
        "ridge": 1.0, "proximal": 0.01, "local-iterations": 5, "episodes-per-round": 10,
        "eval-episodes": 1, "online-capacity": 400, "seed": 7, "num-server-rounds": 5,
        "num-anchors": 100, "weight-cap-factor": 0.0}


class TwoActors:
    """The ClientApp served by two processes: before each message a seeded coin picks
    the "actor", whose process cache (``fqi_online._CLIENTS``) is swapped in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.caches: list[dict] = [{}, {}]
        self.coin = random.Random(0)
        self.monkeypatch = monkeypatch
        self.served = [0, 0]

    def __call__(self, msg, context):
        actor = self.coin.randrange(2)
        self.served[actor] += 1
        self.monkeypatch.setattr(fqi_online, "_CLIENTS", self.caches[actor])
        return client_app(msg, context)


@pytest.mark.parametrize("strategy,encoder", [("avg", "shared"),          # primal Grams
                                              ("anchor", "heterogeneous")])  # kernels, teacher
def test_online_run_is_the_same_whichever_actor_serves_a_node(tmp_path, monkeypatch,
                                                             strategy, encoder):
    """Round by round the two-actor run is the bench's in-process run (which the plain
    in-process app run equals, tests/test_online_app_baselines.py). Before the state
    lived in context.state, each actor grew its own partial copy of a node."""
    n = 3
    cfg = RunConfig.from_run_config({**KEYS, "strategy": strategy, "encoder": encoder,
                                     "min-nodes": n, "output-dir": str(tmp_path)})
    actors = TwoActors(monkeypatch)
    _, out = run_federation(InProcessGrid([actors] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    bench = run_online(n_clients=n, episodes=5 * 10, greedy_episodes=1,
                       **run_online_kwargs(cfg))
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r["train-return-last100"] for r in bench.rounds]
    assert min(actors.served) >= 5  # both actors served nodes
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)


def test_a_stale_process_copy_is_never_used(tmp_path):
    """A process whose copy of a node is older than the node's context.state rebuilds
    the node from context.state; its copy is reused only at the same version."""
    cfg = RunConfig.from_run_config({**KEYS, "min-nodes": 1, "output-dir": str(tmp_path)})
    grid = InProcessGrid([client_app], run_config=cfg.to_run_config())
    context = next(iter(grid.contexts.values()))
    arrays = {"readout": np.zeros((300, 2))}
    fqi_online._CLIENTS.clear()
    fqi_online.LEARNER.train(context, cfg, arrays)
    first, _ = fqi_online.node_client(context, cfg)
    stale = dict(fqi_online._CLIENTS)  # this "actor" saw round 1 only
    fqi_online.LEARNER.train(context, cfg, arrays)  # round 2 elsewhere
    current, _ = fqi_online.node_client(context, cfg)
    assert current is first  # same version: the process copy is used
    fqi_online._CLIENTS.clear()
    fqi_online._CLIENTS.update(stale)
    rebuilt, _ = fqi_online.node_client(context, cfg)
    assert rebuilt is not first and len(rebuilt.episode_returns) == 2 * 10
    np.testing.assert_array_equal(rebuilt.readout, current.readout)
    np.testing.assert_array_equal(rebuilt.gram, current.gram)
    assert rebuilt.rng.bit_generator.state == current.rng.bit_generator.state


def test_dqn_node_served_by_another_process_raises_instead_of_a_partial_copy(tmp_path,
                                                                              monkeypatch):
    """FedAvg-DQN keeps its replay and optimiser in the process: a node whose
    context.state is newer than this process's copy (or that it never saw) is an error."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.baselines.dqn import initial_network
    from fedqhd.learners import dqn

    cfg = RunConfig.from_run_config({"protocol": "online", "learner": "dqn", "seed": 0,
                                     "episodes-per-round": 2, "online-episodes": 4,
                                     "min-nodes": 1, "output-dir": str(tmp_path)})
    context = next(iter(InProcessGrid([client_app], run_config=cfg.to_run_config())
                        .contexts.values()))
    monkeypatch.setattr(dqn, "_CLIENTS", {})
    monkeypatch.setattr(dqn.DQNClients, "collect_and_train",  # the learning is not the point
                        lambda self, k: (np.ones(k), None))
    arrays = {"network": dqn.pack(initial_network(cfg.env_id, cfg.seed))}
    dqn.LEARNER.train(context, cfg, arrays)
    dqn.LEARNER.train(context, cfg, arrays)  # same process: its copy is current
    monkeypatch.setattr(dqn, "_CLIENTS", {})  # another "actor"
    with pytest.raises(RuntimeError, match="served by another process"):
        dqn.LEARNER.train(context, cfg, arrays)
