"""The online protocol inside the Flower apps (in process, no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedqhd import online
from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.envs import batch
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100
from fedqhd.online import ONLINE_SETTINGS
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C

SMALL = {"protocol": "online", "online-settings": "manual", "hd-dim": 300, "gamma": 0.9,
         "ridge": 1.0, "proximal": 0.01,
         "local-iterations": 5, "episodes-per-round": 20, "eval-episodes": 3,
         "num-anchors": 200, "min-nodes": 2}


def _run(tmp_path, n_clients: int = 2, base: dict | None = None, **keys) -> dict:
    cfg = RunConfig.from_run_config({**(SMALL if base is None else base),
                                     "output-dir": str(tmp_path), **keys})
    _, out_dir = run_federation(InProcessGrid([client_app] * n_clients,
                                              run_config=cfg.to_run_config()), cfg)
    return json.loads((out_dir / "results.json").read_text())


@pytest.mark.parametrize("encoder", ["shared", "heterogeneous"])
def test_online_clients_collect_every_round_and_learn(tmp_path, encoder):
    rounds = _run(tmp_path, encoder=encoder, **{"num-server-rounds": 6})["rounds"]
    transitions = [r[C.NUM_TRANSITIONS] for r in rounds]
    assert all(b > a for a, b in zip(transitions, transitions[1:], strict=False))  # data grow
    first, last = rounds[0][TRAIN_RETURN_LAST100], rounds[-1][TRAIN_RETURN_LAST100]
    # epsilon-greedy starts near random (about 21); last 100 of 120 episodes: clearly better
    assert first < 40 and last > max(1.5 * first, 25.0)
    assert all(r[C.REPLIES_OK] == 2 and np.isfinite(r[C.RETURN_MEAN]) for r in rounds)


@pytest.mark.parametrize("encoder", ["shared", "heterogeneous"])
def test_an_env_that_raises_while_collecting_fails_that_clients_round_not_the_run(
        tmp_path, encoder, monkeypatch):
    """The issue's bad input: an env step that raises in round 2 (one node's collection)
    is one failed reply, counted; the other client's reply is aggregated, the next rounds
    have both clients again and the run completes."""
    step, calls = batch.CartPoleBatch.step, {"n": 0, "fail_at": 0}

    def flaky(self, actions):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise RuntimeError("the simulator crashed")
        return step(self, actions)

    monkeypatch.setattr(batch.CartPoleBatch, "step", flaky)
    _run(tmp_path / "count", encoder=encoder, **{"num-server-rounds": 1})
    calls["fail_at"], calls["n"] = calls["n"] + 1, 0  # the first step after round 1
    rounds = _run(tmp_path / "run", encoder=encoder, **{"num-server-rounds": 3})["rounds"]
    assert calls["n"] > calls["fail_at"]
    assert [r[C.REPLIES_OK] for r in rounds] == [2, 1, 2]
    assert [r[C.REPLIES_FAILED] for r in rounds] == [0, 1, 0]
    assert all(np.isfinite(r[TRAIN_RETURN_LAST100]) for r in rounds)


def test_online_keys_are_validated():
    with pytest.raises(ConfigError, match="episodes-per-round"):
        RunConfig.from_run_config({"protocol": "online", "episodes-per-round": 0})
    with pytest.raises(ConfigError, match="epsilon-decay"):
        RunConfig.from_run_config({"epsilon-decay": 1.5})
    with pytest.raises(ConfigError, match="'protocol' = 'online' needs 'learner' = 'fqi'"):
        RunConfig.from_run_config({"protocol": "online", "learner": "pool",
                                   "env-id": "fedqhd/Inventory-v0"})
    with pytest.raises(ConfigError, match="online-pessimism"):
        RunConfig.from_run_config({"protocol": "online", "online-pessimism": -1.0})
    with pytest.raises(ConfigError, match="online-sweep-tol"):
        RunConfig.from_run_config({"protocol": "online", "online-sweep-tol": -0.1})
    with pytest.raises(ConfigError, match="online-mc-mix"):
        RunConfig.from_run_config({"protocol": "online", "online-mc-mix": 1.5})
    with pytest.raises(ConfigError, match="online-mc-window"):
        RunConfig.from_run_config({"protocol": "online", "online-mc-window": 0})
    with pytest.raises(ConfigError, match="online-ucb"):
        RunConfig.from_run_config({"protocol": "online", "online-ucb": -1.0})
    with pytest.raises(ConfigError, match="online-boltzmann"):
        RunConfig.from_run_config({"protocol": "online", "online-boltzmann": -0.5})
    with pytest.raises(ConfigError, match="epsilon-until"):
        RunConfig.from_run_config({"protocol": "online", "epsilon-until": -1})
    with pytest.raises(ConfigError, match="epsilon-until"):
        RunConfig.from_run_config({"protocol": "online", "learner": "dqn",
                                   "online-settings": "manual", "epsilon-until": 500})
    with pytest.raises(ConfigError, match="floor <= start"):
        RunConfig.from_run_config({"epsilon-start": 0.1, "epsilon-floor": 0.5})


def test_online_auto_settings_follow_the_per_task_table():
    for (env_id, encoder) in [(e, k) for e in ONLINE_SETTINGS
                              for k in ("shared", "heterogeneous")]:
        table = online.online_settings(env_id, encoder)
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                         "encoder": encoder})
        assert (cfg.hd_dim, cfg.bandwidth, cfg.gamma, cfg.ridge, cfg.proximal) == (
            table["dim"], table["enc_gamma"], table["gamma"], table["ridge"], table["proximal"])
        assert (cfg.local_iterations, cfg.online_per_episode) == (table["sweeps"],
                                                                  table["per_episode"])
        assert cfg.online_action_gap == table.get("action_gap", 0.0)
        assert (cfg.online_fuse, cfg.online_n_step) == (table.get("fuse", 0.0),
                                                        table.get("n_step", 1))
        assert (cfg.online_gamma_final, cfg.online_gamma_ramp) == (
            table.get("gamma_final", 0.0), table.get("gamma_ramp", 1))
        assert cfg.online_tail == table.get("tail", 0)
        assert cfg.online_compile_ridge == table.get("compile_ridge", 1.0)
        assert cfg.online_capacity == table.get("capacity", 0)
        assert (cfg.anchor_source, cfg.num_anchors) == (
            table.get("anchor_source", "rollouts"), table.get("n_anchors", 1000))
        assert cfg.online_act_local == table.get("act_local", False)
        assert cfg.online_pessimism == table.get("pessimism", 0.0)
        assert cfg.online_sweep_tol == table.get("sweep_tol", 0.0)
        assert (cfg.online_mc_mix, cfg.online_mc_window) == (table.get("mc_mix", 0.0),
                                                             table.get("mc_window", 100))
        assert cfg.online_ucb == table.get("ucb", 0.0)
        assert cfg.online_boltzmann == table.get("boltzmann", 0.0)
        assert (cfg.epsilon_start, cfg.epsilon_decay, cfg.epsilon_floor,
                cfg.epsilon_until) == online.epsilon_tuple(table["epsilon"])
        assert cfg.episodes_per_round == table["episodes_per_round"]
    # manual keeps the keys as given; the offline protocol never sees the table
    cfg = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                     "hd-dim": 123, "gamma": 0.5})
    assert (cfg.hd_dim, cfg.gamma) == (123, 0.5)
    offline = RunConfig.from_run_config({"env-id": "MountainCar-v0"})
    assert (offline.hd_dim, offline.gamma, offline.local_iterations) == (2000, 0.99, 3)


def test_run_online_defaults_are_the_table(monkeypatch):
    seen = {}

    def fake_init(self, env_id, encoder, **kw):
        seen.update(kw, dim=encoder.omega_.shape[1])
        raise RuntimeError("stop")

    monkeypatch.setattr(online.OnlineClient, "__init__", fake_init)
    for (env_id, encoder) in [(e, k) for e in ONLINE_SETTINGS
                              for k in ("shared", "heterogeneous")]:
        table = online.online_settings(env_id, encoder)
        with pytest.raises(RuntimeError, match="stop"):
            online.run_online(env_id, encoder=encoder)
        dim = seen["dim"] if encoder == "heterogeneous" else table["dim"]  # D_i cycled
        assert (seen["dim"], seen["gamma"], seen["ridge"], seen["proximal"]) == (
            dim, table["gamma"], table["ridge"], table["proximal"])
        assert seen["per_episode"] == table["per_episode"]
        assert (seen["fuse"], seen["n_step"], seen["action_gap"]) == (
            table.get("fuse", 0.0), table.get("n_step", 1), table.get("action_gap", 0.0))
        assert seen["n_parallel"] == table["episodes_per_round"]
        assert seen["pessimism"] == table.get("pessimism", 0.0)
        assert seen["sweep_tol"] == table.get("sweep_tol", 0.0)
        assert (seen["mc_mix"], seen["mc_window"]) == (table.get("mc_mix", 0.0),
                                                       table.get("mc_window", 100))
        assert seen["ucb"] == table.get("ucb", 0.0)
        assert seen["boltzmann"] == table.get("boltzmann", 0.0)
        assert seen["capacity"] == (table.get("capacity") or online.default_capacity(dim))



def test_a_tasks_heterogeneous_overrides_reach_only_heterogeneous_clients(monkeypatch):
    """An entry's ``heterogeneous`` dict (Acrobot's proximal, LunarLander's ridge) changes
    the heterogeneous clients' settings and leaves the shared ones at the entry's values."""
    seen: dict = {}

    def fake_init(self, env_id, encoder, **kw):
        seen.update(kw)
        raise RuntimeError("stop")

    monkeypatch.setattr(online.OnlineClient, "__init__", fake_init)
    tasks = [e for e, t in ONLINE_SETTINGS.items() if t.get("heterogeneous")]
    assert {"Acrobot-v1", "LunarLander-v3"} <= set(tasks)
    for env_id in tasks:
        entry = ONLINE_SETTINGS[env_id]
        for encoder in ("shared", "heterogeneous"):
            with pytest.raises(RuntimeError, match="stop"):
                online.run_online(env_id, encoder=encoder)
            for key, value in entry["heterogeneous"].items():
                if key not in ("ridge", "proximal", "gamma", "pessimism"):  # others renamed
                    continue
                want = value if encoder == "heterogeneous" else entry[key]
                assert seen[key] == want, (env_id, encoder, key)
    assert ONLINE_SETTINGS["LunarLander-v3"]["ridge"] != (
        ONLINE_SETTINGS["LunarLander-v3"]["heterogeneous"]["ridge"])

def test_a_tasks_capacity_key_sizes_every_clients_buffer(monkeypatch):
    """The table's ``capacity`` replaces ``min(20000, 1e7 / D_i)`` for every client, in
    run_online and in the Flower app's config; an explicit argument still wins."""
    plain = {k: v for k, v in ONLINE_SETTINGS["Acrobot-v1"].items()
             if k not in ("capacity", "heterogeneous")}
    entry = {**plain, "capacity": 1234}
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1", entry)
    res = online.run_online("Acrobot-v1", encoder="heterogeneous", n_clients=4, episodes=2,
                            episodes_per_round=2, sweeps=1, n_anchors=10,
                            greedy_episodes=1)
    assert res.config["capacity"] == [1234] * 4  # D_i 500 ... 5000 alike
    res = online.run_online("Acrobot-v1", n_clients=2, episodes=2, episodes_per_round=2,
                            sweeps=1, greedy_episodes=1, capacity=77)
    assert res.config["capacity"] == [77, 77]
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                     "encoder": "heterogeneous"})
    assert cfg.online_capacity == 1234
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1", plain)
    res = online.run_online("Acrobot-v1", encoder="heterogeneous", n_clients=4, episodes=2,
                            episodes_per_round=2, sweeps=1, n_anchors=10,
                            greedy_episodes=1)
    assert res.config["capacity"] == [online.default_capacity(d)
                                      for d in (500, 1000, 2000, 5000)]


def test_a_tasks_anchor_keys_choose_the_anchors_of_run_online_and_the_app(monkeypatch):
    """The table's ``anchor_source`` / ``n_anchors`` (Acrobot heterogeneous: uniform
    anchors) pick the anchors run_online builds and the Flower app's anchor keys; other
    tasks keep 1000 rollout anchors; explicit arguments and manual settings still win."""
    assert online.online_settings("Acrobot-v1", "heterogeneous")["anchor_source"] == "uniform"
    asked: list[tuple[str, int]] = []

    def fake_anchors(source, env_id, m, seed, path=""):
        asked.append((source, m))
        raise RuntimeError("stop")

    monkeypatch.setattr(online, "make_anchors", fake_anchors)
    for env_id, kw, want in [("Acrobot-v1", {}, ("uniform", 1000)),
                             ("CartPole-v1", {}, ("rollouts", 1000)),
                             ("Acrobot-v1", {"anchor_source": "rollouts", "n_anchors": 7},
                              ("rollouts", 7))]:
        with pytest.raises(RuntimeError, match="stop"):
            online.run_online(env_id, encoder="heterogeneous", **kw)
        assert asked[-1] == want, (env_id, kw)
    for env_id, encoder, want in [("Acrobot-v1", "heterogeneous", "uniform"),
                                  ("Acrobot-v1", "shared", "rollouts"),
                                  ("CartPole-v1", "heterogeneous", "rollouts")]:
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                         "encoder": encoder})
        assert (cfg.anchor_source, cfg.num_anchors) == (want, 1000), (env_id, encoder)
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                     "encoder": "heterogeneous", "online-settings": "manual",
                                     "anchor-source": "rollouts"})
    assert cfg.anchor_source == "rollouts"
    entry = ONLINE_SETTINGS["Acrobot-v1"]
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1", {**entry, "n_anchors": 77})
    with pytest.raises(RuntimeError, match="stop"):
        online.run_online("Acrobot-v1", encoder="heterogeneous")
    assert asked[-1] == ("uniform", 77)
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                     "encoder": "heterogeneous"})
    assert cfg.num_anchors == 77


def test_a_tasks_act_local_key_reaches_run_online():
    """Acrobot's table sets ``act_local`` (clients collect with their own fit); run_online
    takes it unless told otherwise, other tasks keep acting with the global readout."""
    small = dict(n_clients=2, episodes=2, episodes_per_round=2, sweeps=1, greedy_episodes=1)
    assert online.run_online("Acrobot-v1", **small).config["act_local"] is True
    assert online.run_online("Acrobot-v1", act_local=False, **small).config["act_local"] is False
    assert online.run_online("CartPole-v1", **small).config["act_local"] is False


def test_a_tasks_obs_scale_key_rescales_every_encoder_alike(monkeypatch):
    """``obs_scale`` multiplies the task's bounds for the encoders only: run_online's
    clients and the Flower app's clients (via ``online-obs-scale``) divide by the same
    scale; bad multipliers are refused with the key named."""
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi import client_encoder
    scale = (1.0, 1.0, 1.0, 1.0, 0.5, 0.25)
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1",
                        {**ONLINE_SETTINGS["Acrobot-v1"], "obs_scale": scale})
    bound = get_spec("Acrobot-v1").obs_bound * np.array(scale)
    seen = {}

    def fake_init(self, env_id, encoder, **kw):
        seen["scale"] = encoder.scale_
        raise RuntimeError("stop")

    with monkeypatch.context() as m:
        m.setattr(online.OnlineClient, "__init__", fake_init)
        for encoder in ("shared", "heterogeneous"):
            with pytest.raises(RuntimeError, match="stop"):
                online.run_online("Acrobot-v1", encoder=encoder)
            np.testing.assert_allclose(seen["scale"], bound)
    for encoder in ("shared", "heterogeneous"):
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                         "encoder": encoder})
        assert cfg.obs_scale == scale
        np.testing.assert_allclose(client_encoder(cfg, 1).scale_, bound)
    # offline runs keep the task's bounds; wrong length or sign is refused
    offline = RunConfig.from_run_config({"env-id": "Acrobot-v1",
                                         "online-obs-scale": "1,1,1,1,0.5,0.25"})
    np.testing.assert_allclose(client_encoder(offline, 1).scale_,
                               get_spec("Acrobot-v1").obs_bound)
    for bad in ("1,2", "1,1,1,1,1,-1", "a,b"):
        with pytest.raises(ConfigError, match="online-obs-scale"):
            RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                       "env-id": "Acrobot-v1", "online-obs-scale": bad})
    with pytest.raises(ValueError, match="obs_scale"):
        online.encoder_bound("Acrobot-v1", (1.0, 0.0, 1, 1, 1, 1))


def test_lunarlander_default_encoder_tells_a_soft_touchdown_from_a_crash(monkeypatch):
    """The table's LunarLander ``obs_scale`` narrows the kernel along the velocities: two
    states near the pad that differ only in vertical speed (0.1 vs 0.5, a soft touchdown
    vs a crash) must look different to the encoder (at the task's full bounds their
    kernel similarity is ~0.96, so one readout cannot value them apart)."""
    seen = {}

    def fake_init(self, env_id, encoder, **kw):
        seen["encoder"] = encoder
        raise RuntimeError("stop")

    monkeypatch.setattr(online.OnlineClient, "__init__", fake_init)
    with pytest.raises(RuntimeError, match="stop"):
        online.run_online("LunarLander-v3", seed=0)
    soft = np.array([[0.0, 0.1, 0.0, -0.1, 0.0, 0.0, 0.0, 0.0]])
    crash = soft.copy()
    crash[0, 3] = -0.5
    phi = seen["encoder"].transform(np.vstack([soft, crash]))
    similarity = float(phi[0] @ phi[1] / np.linalg.norm(phi[0]) / np.linalg.norm(phi[1]))
    assert similarity < 0.8


@pytest.mark.parametrize("encoder", ["shared", "heterogeneous"])
def test_online_app_runs_with_the_per_task_settings(tmp_path, encoder):
    # online-settings = "auto": the table's CartPole settings (tail, epsilon, K) in the app
    k = online.online_settings("CartPole-v1", encoder)["episodes_per_round"]
    auto = {"protocol": "online", "eval-episodes": 3, "min-nodes": 2}  # the table's keys
    rounds = _run(tmp_path, base=auto, encoder=encoder,
                  **{"online-settings": "auto", "online-episodes": 2 * k})["rounds"]
    assert len(rounds) == 2 and all(r[C.REPLIES_OK] == 2 for r in rounds)
    assert all(np.isfinite(r[TRAIN_RETURN_LAST100]) for r in rounds)
    assert rounds[-1][C.NUM_TRANSITIONS] >= 2 * 2 * k * 8  # 2 clients x 2 rounds x k episodes


def test_online_auto_runs_the_papers_600_episodes_per_client():
    shared = RunConfig.from_run_config({"protocol": "online", "env-id": "CartPole-v1"})
    assert shared.num_server_rounds * shared.episodes_per_round == 600
    het = RunConfig.from_run_config({"protocol": "online", "encoder": "heterogeneous"})
    assert het.num_server_rounds * het.episodes_per_round == 600
    short = RunConfig.from_run_config({"protocol": "online", "online-episodes": 100})
    assert short.num_server_rounds == 5  # ceil(100 / 20)
    assert RunConfig().num_server_rounds == 20  # offline runs keep their own rounds


def test_rounds_that_disagree_with_the_auto_episodes_are_refused():
    """Under online-settings = auto the rounds come from online-episodes; a
    num-server-rounds that says otherwise is refused, not silently replaced."""
    with pytest.raises(ConfigError, match=r"'num-server-rounds' = 5 disagrees.*"
                                          r"'online-episodes' = 100 for 5 rounds"):
        RunConfig.from_run_config({"protocol": "online", "num-server-rounds": 5})
    with pytest.raises(ConfigError, match="'num-server-rounds' = 7 disagrees"):
        RunConfig.from_run_config({"protocol": "online", "learner": "dqn",
                                   "num-server-rounds": 7})
    agreeing = RunConfig.from_run_config({"protocol": "online", "num-server-rounds": 30})
    assert agreeing.num_server_rounds == 30
    parsed_again = RunConfig.from_run_config(agreeing.to_run_config())  # what nodes parse
    assert parsed_again == agreeing
    manual = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                        "num-server-rounds": 5})
    assert manual.num_server_rounds == 5


def test_keys_the_auto_settings_would_replace_are_refused():
    """online-settings = auto takes the learner keys from the task's table; a key given
    with another value would be dropped without a word, so it is refused, naming the
    key, its value and the table's; the default or the table's own value passes."""
    with pytest.raises(ConfigError, match=r"'gamma' = 0.95 \(auto: 0.9\).*'manual'"):
        RunConfig.from_run_config({"protocol": "online", "gamma": 0.95})
    with pytest.raises(ConfigError, match=r"'epsilon-floor' = 0.1 \(auto: 0.0\)"):
        RunConfig.from_run_config({"protocol": "online", "epsilon-floor": 0.1})
    with pytest.raises(ConfigError, match="'online-obs-scale'"):
        RunConfig.from_run_config({"protocol": "online", "env-id": "LunarLander-v3",
                                   "online-obs-scale": "1,1,1,1,1,1,1,1"})
    with pytest.raises(ConfigError, match=r"'gamma' = 0.9 \(auto: 0.99\)"):
        RunConfig.from_run_config({"protocol": "online", "learner": "dqn", "gamma": 0.9})
    same = RunConfig.from_run_config({"protocol": "online", "gamma": 0.9, "hd-dim": 500})
    assert (same.gamma, same.hd_dim) == (0.9, 500)
    manual = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                        "gamma": 0.95})
    assert manual.gamma == 0.95


@pytest.mark.parametrize("encoder", ["shared", "heterogeneous"])
def test_round_train_return_is_the_papers_plain_mean_over_clients(encoder):
    # the strategy weights clients by transitions (long episodes count more); the paper's
    # metric averages the clients' last-100 returns with equal weight
    from fedqhd.learners.fqi_online import LEARNER

    cfg = RunConfig.from_run_config({**SMALL, "encoder": encoder})
    plan = LEARNER.server_plan(cfg)
    plan.strategy.last_client_metrics = {
        7: {TRAIN_RETURN_LAST100: 10.0, C.NUM_TRANSITIONS: 1000},
        8: {TRAIN_RETURN_LAST100: 30.0, C.NUM_TRANSITIONS: 10}}
    assert plan.evaluate(plan.initial_arrays)[TRAIN_RETURN_LAST100] == 20.0


def test_the_app_and_its_bench_twin_give_clients_the_sweep_tolerance():
    from fedqhd.learners.fqi_online import _new_client, run_online_kwargs
    cfg = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                     "online-sweep-tol": 1e-3, "hd-dim": 20})
    client, _ = _new_client(cfg, 0, 2)
    assert client.sweep_tol == 1e-3
    assert run_online_kwargs(cfg)["sweep_tol"] == 1e-3


def test_a_table_sweep_tolerance_reaches_the_bench_and_the_app(monkeypatch):
    """No task sets ``sweep_tol`` today; one that did would reach both."""
    entry = dict(ONLINE_SETTINGS["CartPole-v1"], sweep_tol=1e-3)
    monkeypatch.setitem(ONLINE_SETTINGS, "CartPole-v1", entry)
    cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "CartPole-v1"})
    assert cfg.online_sweep_tol == 1e-3
    seen = {}

    def fake_init(self, env_id, encoder, **kw):
        seen.update(kw)
        raise RuntimeError("stop")

    monkeypatch.setattr(online.OnlineClient, "__init__", fake_init)
    with pytest.raises(RuntimeError, match="stop"):
        online.run_online("CartPole-v1")
    assert seen["sweep_tol"] == 1e-3


def test_the_app_and_its_bench_twin_give_clients_the_monte_carlo_mix():
    from fedqhd.learners.fqi_online import _new_client, run_online_kwargs
    cfg = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                     "online-mc-mix": 0.4, "online-mc-window": 30,
                                     "hd-dim": 20})
    client, _ = _new_client(cfg, 0, 2)
    assert (client.mc_mix, client.mc_window) == (0.4, 30)
    kwargs = run_online_kwargs(cfg)
    assert (kwargs["mc_mix"], kwargs["mc_window"]) == (0.4, 30)
