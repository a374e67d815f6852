"""A node's online client does not depend on which process serves it: Flower's Ray actor
pool sends a node's messages to whichever actor is free, so the node's state lives in its
``context.state`` and a process's copy is only a cache (:mod:`fedqhd.learners.fqi_online`).
Here two "actors" are emulated in process by swapping the learner's process cache."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
from presets_util import write_preset

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.envs.batch import CartPoleBatch
from fedqhd.learners import fqi_online
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid

KEYS = {"protocol": "online", "preset": "manual", "hd-dim": 300, "gamma": 0.9,
        "ridge": 1.0, "proximal": 0.01, "local-iterations": 5, "episodes-per-round": 10,
        "eval-episodes": 1, "seed": 7, "num-server-rounds": 5,
        "num-anchors": 100, "weight-cap-factor": 0.0}


def _one_node(tmp_path, keys: dict):
    """The run config of ``keys`` with one node, and that node's Context."""
    cfg = RunConfig.from_run_config({**keys, "min-nodes": 1, "output-dir": str(tmp_path)})
    grid = InProcessGrid([client_app], run_config=cfg.to_run_config())
    return cfg, next(iter(grid.contexts.values()))


class TwoActors:
    """The ClientApp served by two processes: before each message a seeded coin picks
    the "actor", whose process cache (``owner.attribute``, by default
    ``fqi_online._CLIENTS``) is swapped in."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: object = fqi_online,
                 attribute: str = "_CLIENTS", coin: int = 0) -> None:
        self.caches: list[dict] = [{}, {}]
        self.coin = random.Random(coin)
        self.monkeypatch = monkeypatch
        self.owner, self.attribute = owner, attribute
        self.served = [0, 0]
        self.by_node: dict[int, list[int]] = {}  #: the actors that served each node, in order

    def __call__(self, msg, context):
        actor = self.coin.randrange(2)
        self.served[actor] += 1
        self.by_node.setdefault(context.node_id, []).append(actor)
        self.monkeypatch.setattr(self.owner, self.attribute, self.caches[actor])
        return client_app(msg, context)


@pytest.mark.parametrize("strategy,encoder", [("avg", "shared"),          # primal Grams
                                              ("anchor", "heterogeneous")])  # kernels, teacher
def test_online_run_is_the_same_whichever_actor_serves_a_node(tmp_path, monkeypatch,
                                                             strategy, encoder):
    """Round by round the two-actor run is the plain in-process run (one process serving
    every message). Before the state lived in context.state, each actor grew its own
    partial copy of a node."""
    n = 3
    cfg = RunConfig.from_run_config({**KEYS, "strategy": strategy, "encoder": encoder,
                                     "min-nodes": n, "output-dir": str(tmp_path)})
    actors = TwoActors(monkeypatch)
    _, out = run_federation(InProcessGrid([actors] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    monkeypatch.setattr(fqi_online, "_CLIENTS", {})
    plain_cfg = cfg.replace(output_dir=str(tmp_path / "plain"))
    _, plain_out = run_federation(
        InProcessGrid([client_app] * n, run_config=plain_cfg.to_run_config()), plain_cfg)
    plain = json.loads((plain_out / "results.json").read_text())["rounds"]
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r[TRAIN_RETURN_LAST100] for r in plain]
    assert min(actors.served) >= 5  # both actors served nodes
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)


def test_a_replaying_td_run_is_the_same_whichever_actor_serves_a_node(tmp_path, monkeypatch):
    """A TD client's replay ring travels in its node state: a client rebuilt in another
    process draws from the same transitions in the same slots."""
    n = 3
    preset = write_preset(tmp_path, "replay", **{
        "hd-dim": 300, "gamma": 0.9, "update": "td", "td-rate": 0.2, "td-replay": 2.0,
        "td-replay-size": 150, "episodes-per-round": 2})
    cfg = RunConfig.from_run_config({
        "protocol": "online", "preset": preset, "online-episodes": 16, "eval-episodes": 1,
        "seed": 7, "min-nodes": n, "output-dir": str(tmp_path)})
    actors = TwoActors(monkeypatch)
    _, out = run_federation(InProcessGrid([actors] * n, run_config=cfg.to_run_config()),
                            cfg)
    monkeypatch.setattr(fqi_online, "_CLIENTS", {})
    plain_cfg = cfg.replace(output_dir=str(tmp_path / "plain"))
    _, plain_out = run_federation(
        InProcessGrid([client_app] * n, run_config=plain_cfg.to_run_config()), plain_cfg)
    curves = [[r[TRAIN_RETURN_LAST100] for r in json.loads((o / "results.json").read_text())
               ["rounds"]] for o in (out, plain_out)]
    assert min(actors.served) >= 5 and len(curves[0]) == 8
    np.testing.assert_allclose(curves[0], curves[1], rtol=1e-9, atol=0)


def test_a_stale_process_copy_is_never_used(tmp_path):
    """A process whose copy of a node is older than the node's context.state rebuilds
    the node from context.state; its copy is reused only at the same version."""
    cfg, context = _one_node(tmp_path, KEYS)
    arrays = {"readout": np.zeros((300, 2))}
    fqi_online._CLIENTS.clear()
    fqi_online.LEARNER.train(context, cfg, arrays)
    first, _ = fqi_online.node_client(context, cfg)
    # this "actor" saw round 1 only: its own copy of the client (another process's object)
    stale = {k: (copy.deepcopy(v[0]), dict(v[1]), *v[2:])
             for k, v in fqi_online._CLIENTS.items()}
    fqi_online.LEARNER.train(context, cfg, arrays)  # round 2 elsewhere
    current, _ = fqi_online.node_client(context, cfg)
    assert current is first  # same version: the process copy is used
    fqi_online._CLIENTS.clear()
    fqi_online._CLIENTS.update(stale)
    old = next(iter(stale.values()))[0]
    assert len(old.episode_returns) == 10 and old.size < current.size
    rebuilt, _ = fqi_online.node_client(context, cfg)
    # brought forward in place (nothing allocated), to the node's state bit for bit
    assert rebuilt is old and rebuilt is not first and len(rebuilt.episode_returns) == 2 * 10
    for name in ("readout", "gram", "states", "next_states", "features", "next_features",
                 "rewards", "returns_to_go", "row_episode"):
        np.testing.assert_array_equal(getattr(rebuilt, name), getattr(current, name), name)
    assert rebuilt.rng.bit_generator.state == current.rng.bit_generator.state
    # a copy ahead of the node's state (a reply that never arrived) is not reused in place
    fqi_online._CLIENTS[next(iter(stale))] = (current, {"dynamics": {}}, "elsewhere", True)
    current.size += 1
    ahead, _ = fqi_online.node_client(context, cfg)
    current.size -= 1
    assert ahead is not current and ahead.size == current.size
    np.testing.assert_array_equal(ahead.features, current.features)


def test_a_copy_a_failed_round_left_is_never_used(tmp_path, monkeypatch):
    """A train message whose collection raises midway leaves this process's copy ahead of
    context.state (its env and generator moved on); the next message rebuilds the node
    from context.state, so this process and any other continue with the same client."""
    cfg, context = _one_node(tmp_path, KEYS)
    arrays = {"readout": np.zeros((300, 2))}
    fqi_online._CLIENTS.clear()
    fqi_online.LEARNER.train(context, cfg, arrays)  # round 1, saved
    version = fqi_online.state_version(context)
    step, calls = CartPoleBatch.step, {"n": 0}

    def flaky(self, actions):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("the simulator crashed")
        return step(self, actions)

    monkeypatch.setattr(CartPoleBatch, "step", flaky)
    with pytest.raises(RuntimeError, match="crashed"):
        fqi_online.LEARNER.train(context, cfg, arrays)
    monkeypatch.setattr(CartPoleBatch, "step", step)
    assert fqi_online.state_version(context) == version  # nothing saved
    here, _ = fqi_online.node_client(context, cfg)
    fqi_online._CLIENTS.clear()
    elsewhere, _ = fqi_online.node_client(context, cfg)  # another process
    assert len(here.episode_returns) == len(elsewhere.episode_returns) == 10
    assert here.rng.bit_generator.state == elsewhere.rng.bit_generator.state
    np.testing.assert_array_equal(here.env.state, elsewhere.env.state)
    np.testing.assert_array_equal(here.gram, elsewhere.gram)


def test_a_dqn_copy_a_failed_round_left_is_never_used(tmp_path, monkeypatch):
    """The same for the deep baselines: a failed train message drops the process copy."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.baselines import dqn as deep
    from fedqhd.learners import dqn

    cfg, context = _one_node(tmp_path, {**dqn_keys(tmp_path), "strategy": "avg"})
    dqn.STATES.cache.clear()
    dqn.LEARNER.train(context, cfg, {})
    first = dqn.node_client(context, cfg)
    real = deep.DQNClients.collect_and_train

    def crash(self, n_episodes):
        raise RuntimeError("the simulator crashed")

    monkeypatch.setattr(deep.DQNClients, "collect_and_train", crash)
    with pytest.raises(RuntimeError, match="crashed"):
        dqn.LEARNER.train(context, cfg, {})
    monkeypatch.setattr(deep.DQNClients, "collect_and_train", real)
    assert dqn.node_client(context, cfg) is not first  # rebuilt from context.state


def test_evaluation_rebuilds_without_the_buffer_and_never_lends_it_to_training(tmp_path):
    """A stale process evaluates a node from its readout alone (no rows re-encoded, no
    statistics copied), with the same metrics as the process holding the full copy, and
    reuses its earlier anchor factor; a train message there still rebuilds the buffer."""
    cfg, context = _one_node(tmp_path, {**KEYS, "strategy": "anchor",
                                        "encoder": "heterogeneous"})
    rng = np.random.default_rng(0)
    anchors = rng.uniform(-0.1, 0.1, size=(100, 4))
    teachers = [{"anchors": anchors, "teacher": rng.normal(size=(100, 2))} for _ in range(2)]
    fqi_online._CLIENTS.clear()
    fqi_online.LEARNER.train(context, cfg, teachers[0])
    stale = dict(fqi_online._CLIENTS)  # this "actor" saw round 1 only
    old_client = next(iter(stale.values()))[0]
    fqi_online.LEARNER.train(context, cfg, teachers[1])  # round 2 elsewhere
    full = dict(fqi_online._CLIENTS)
    expected = fqi_online.LEARNER.evaluate(context, cfg, teachers[1])
    fqi_online._CLIENTS.clear()
    fqi_online._CLIENTS.update(stale)
    assert fqi_online.LEARNER.evaluate(context, cfg, teachers[1]) == expected
    light, _, version, complete = next(iter(fqi_online._CLIENTS.values()))
    assert version == fqi_online.state_version(context) and not complete
    assert light.size == 0 and light._anchor_factor is old_client._anchor_factor
    trained, _ = fqi_online.node_client(context, cfg)
    reference = next(iter(full.values()))[0]
    assert trained is not light and trained.size == reference.size > 0
    np.testing.assert_array_equal(trained.kernel if trained.form == "dual" else trained.gram,
                                  reference.kernel if trained.form == "dual"
                                  else reference.gram)


# ------------------------------------------------------------------ the deep baselines
def dqn_keys(folder) -> dict:
    """Short deep-baseline runs that act mostly greedily (epsilon from 0.2): 4 rounds of 5
    episodes, from a preset file in ``folder``."""
    preset = write_preset(folder, "dqn-small", **{
        "episodes-per-round": 5, "epsilon": [0.2, 0.9, 0.01], "num-anchors": 30})
    return {"protocol": "online", "learner": "dqn", "preset": preset,
            "online-episodes": 20, "weighting": "uniform", "eval-episodes": 1, "seed": 5}


@pytest.mark.parametrize("strategy", ["avg", "anchor"])  # FedAvg-DQN, distillation FedDQN
def test_dqn_run_is_the_same_whichever_actor_serves_a_node(tmp_path, monkeypatch, strategy):
    """A two-actor run of the deep baselines gives, round by round, the numbers of a run
    whose nodes never moved (the global network of FedAvg bit for bit; distillation: the
    clients' greedy returns and KLs, which a half-restored client would change). Before
    the state lived in context.state, a node served by another actor raised."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.learners import dqn

    n = 2
    runs = []
    # coin 3: each node changes actor every round (train messages 0, 1, 0, 1)
    for actors in (None, TwoActors(monkeypatch, dqn.STATES, "cache", coin=3)):
        cfg = RunConfig.from_run_config({**dqn_keys(tmp_path), "strategy": strategy, "min-nodes": n,
                                         "output-dir": str(tmp_path / str(len(runs)))})
        monkeypatch.setattr(dqn.STATES, "cache", {})
        apps = [actors or client_app] * n
        _, out = run_federation(InProcessGrid(apps, run_config=cfg.to_run_config()), cfg)
        rows = json.loads((out / "results.json").read_text())["rounds"]
        with np.load(out / "final_model.npz") as model:
            runs.append((rows, {k: model[k] for k in model.files}))
    # every node moved between actors, and back (the copy it returns to is stale)
    assert all(sum(a != b for a, b in zip(seq, seq[1:], strict=False)) >= 2
               for seq in actors.by_node.values()), actors.by_node
    (rows, model), (rows2, model2) = runs
    keys = [TRAIN_RETURN_LAST100, "return-mean", "num-transitions"]
    if strategy == "anchor":
        keys += [dqn.DISTILL_KL_BEFORE, dqn.DISTILL_KL_AFTER]
    assert [[r.get(k) for k in keys] for r in rows2] == [[r.get(k) for k in keys] for r in rows]
    assert all(r.get(k) is not None for k in keys for r in rows[1:])
    assert model.keys() == model2.keys()
    for k in model:
        np.testing.assert_array_equal(model2[k], model[k])


def test_a_stale_dqn_copy_is_never_used(tmp_path):
    """A process whose copy of a DQN node is older than the node's context.state rebuilds
    it from context.state: networks, target, both Adam states, replay, RNG streams,
    epsilon, counters and episode returns the same numbers as the copy that never moved."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    import jax

    from fedqhd.learners import dqn

    cfg, context = _one_node(tmp_path, {**dqn_keys(tmp_path), "strategy": "anchor"})
    dqn.STATES.cache.clear()
    anchors = np.random.default_rng(0).uniform(-0.1, 0.1, size=(30, 4))
    dqn.LEARNER.train(context, cfg, {"anchors": anchors})
    first = dqn.node_client(context, cfg)
    stale = dict(dqn.STATES.cache)  # this "actor" saw round 1 only
    teacher = {"anchors": anchors, "teacher": np.zeros((30, 2))}
    dqn.LEARNER.evaluate(context, cfg, teacher)  # distils: a second Adam state moves
    dqn.LEARNER.train(context, cfg, teacher)  # round 2 elsewhere
    current = dqn.node_client(context, cfg)
    assert current is first  # same version: the process copy is used
    dqn.STATES.cache.clear()
    dqn.STATES.cache.update(stale)
    rebuilt = dqn.node_client(context, cfg)
    assert rebuilt is not first and len(rebuilt.returns) == 2 * 5
    assert rebuilt.returns == current.returns and rebuilt.info == current.info
    a, b = rebuilt.client, current.client
    for name in ("_params", "_target", "_opt", "_distill_opt"):
        leaves_a = jax.tree_util.tree_leaves(getattr(a, name))
        leaves_b = jax.tree_util.tree_leaves(getattr(b, name))
        assert len(leaves_a) == len(leaves_b) > 0
        for x, y in zip(leaves_a, leaves_b, strict=True):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(b.grad_steps[0]) > 0 and int(np.asarray(b._distill_opt[0].count)[0]) == 10
    for name in ("s", "s2", "a", "r", "term", "ptr", "size"):
        np.testing.assert_array_equal(getattr(a.replay, name), getattr(b.replay, name))
    for name in ("epsilon", "episodes_done", "transitions", "grad_steps"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert [g.bit_generator.state for g in a._rngs + a._batch_rng] == \
        [g.bit_generator.state for g in b._rngs + b._batch_rng]
    # and it goes on as the copy that never moved
    np.testing.assert_array_equal(a.collect_and_train(2), b.collect_and_train(2))
    np.testing.assert_array_equal(a.get_parameters(0)[0], b.get_parameters(0)[0])
