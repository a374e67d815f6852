"""The online protocol inside the Flower apps (in process, no Ray)."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest

from fedqhd import online
from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.encoders import HETEROGENEOUS_DIMS
from fedqhd.envs import batch, get_spec
from fedqhd.learners.base import partition
from fedqhd.learners.fqi import client_encoder, encoder_scale, shared_encoder
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, FQIOnline, _new_client
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
    with pytest.raises(ConfigError, match="online-mc-mix"):
        RunConfig.from_run_config({"protocol": "online", "online-mc-mix": 1.5})
    with pytest.raises(ConfigError, match="online-mc-window"):
        RunConfig.from_run_config({"protocol": "online", "online-mc-window": 0})
    with pytest.raises(ConfigError, match="online-ucb"):
        RunConfig.from_run_config({"protocol": "online", "online-ucb": -1.0})
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
        assert cfg.online_n_step == table.get("n_step", 1)
        assert cfg.online_tail == table.get("tail", 0)
        assert (cfg.anchor_source, cfg.num_anchors) == (
            table.get("anchor_source", "rollouts"), table.get("n_anchors", 1000))
        assert cfg.online_act_local == table.get("act_local", False)
        assert (cfg.online_mc_mix, cfg.online_mc_window) == (table.get("mc_mix", 0.0),
                                                             table.get("mc_window", 100))
        assert cfg.online_ucb == table.get("ucb", 0.0)
        assert (cfg.epsilon_start, cfg.epsilon_decay, cfg.epsilon_floor) == tuple(
            float(v) for v in table["epsilon"][:3])
        assert cfg.episodes_per_round == table["episodes_per_round"]
    # manual keeps the keys as given; the offline protocol never sees the table
    cfg = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                     "hd-dim": 123, "gamma": 0.5})
    assert (cfg.hd_dim, cfg.gamma) == (123, 0.5)
    offline = RunConfig.from_run_config({"env-id": "MountainCar-v0"})
    assert (offline.hd_dim, offline.gamma, offline.local_iterations) == (2000, 0.99, 3)


def test_the_apps_clients_take_the_table():
    """online-settings = auto builds every client of the app from the task's table: its
    discount, penalties, transitions per episode, n-step, tail, advantage gap, mixed
    Monte-Carlo targets, optimism, episodes side by side, its encoder's D (D_i cycled
    500, 1000, 2000, 5000 under heterogeneous encoders) and default_capacity(D_i) slots."""
    for (env_id, encoder) in [(e, k) for e in ONLINE_SETTINGS
                              for k in ("shared", "heterogeneous")]:
        table = online.online_settings(env_id, encoder)
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                         "encoder": encoder})
        n_parts = len(HETEROGENEOUS_DIMS) if encoder == "heterogeneous" else 2
        for pid in range(n_parts):
            client, _ = _new_client(cfg, pid, n_parts)
            dim = HETEROGENEOUS_DIMS[pid] if encoder == "heterogeneous" else table["dim"]
            assert client.encoder is client_encoder(cfg, pid)
            assert client.dim == dim, (env_id, encoder, pid)
            assert (client.gamma, client.ridge, client.proximal) == (
                table["gamma"], table["ridge"], table["proximal"]), (env_id, encoder)
            assert client.per_episode == table["per_episode"]
            assert (client.n_step, client.tail, client.action_gap) == (
                table.get("n_step", 1), table.get("tail", 0), table.get("action_gap", 0.0))
            assert (client.mc_mix, client.mc_window) == (table.get("mc_mix", 0.0),
                                                         table.get("mc_window", 100))
            assert client.ucb == table.get("ucb", 0.0), (env_id, encoder)
            assert client.n_parallel == table["episodes_per_round"]
            assert client.capacity == online.default_capacity(dim)
            if encoder == "shared":
                assert client.encoder.gamma == table["enc_gamma"]
            else:  # gamma_i = enc_gamma * U(0.5, 1.5)
                assert 0.5 <= client.encoder.gamma / table["enc_gamma"] <= 1.5


#: where each key of a table's ``heterogeneous`` overrides lands: an attribute of the
#: app's client, or a RunConfig field (the server's anchors, the epsilon schedule)
_CLIENT_KEYS = {"gamma": "gamma", "ridge": "ridge", "proximal": "proximal",
                "mc_mix": "mc_mix", "mc_window": "mc_window", "ucb": "ucb",
                "action_gap": "action_gap", "n_step": "n_step", "tail": "tail",
                "per_episode": "per_episode", "episodes_per_round": "n_parallel"}
_CONFIG_KEYS = {"anchor_source": "anchor_source", "n_anchors": "num_anchors",
                "act_local": "online_act_local"}
_LEFT_OUT = {"anchor_source": "rollouts", "n_anchors": 1000, "act_local": False,
             "ucb": 0.0, "mc_mix": 0.0, "mc_window": 100, "action_gap": 0.0, "n_step": 1,
             "tail": 0}


def test_a_tasks_heterogeneous_overrides_reach_only_heterogeneous_clients():
    """An entry's ``heterogeneous`` dict (Acrobot's proximal and anchors, LunarLander's
    discount and ridge, CartPole's episodes per round) changes the heterogeneous clients
    of the app and leaves the shared ones at the entry's values."""
    tasks = [e for e, t in ONLINE_SETTINGS.items() if t.get("heterogeneous")]
    assert {"Acrobot-v1", "LunarLander-v3"} <= set(tasks)
    for env_id in tasks:
        entry = ONLINE_SETTINGS[env_id]
        for encoder in ("shared", "heterogeneous"):
            cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                             "encoder": encoder})
            client, _ = _new_client(cfg, 0, 2)
            for key, value in entry["heterogeneous"].items():
                want = value if encoder == "heterogeneous" else entry.get(key, _LEFT_OUT.get(key))
                if key == "epsilon":
                    got = (cfg.epsilon_start, cfg.epsilon_decay, cfg.epsilon_floor)
                    want = tuple(float(v) for v in want[:3])
                elif key in _CLIENT_KEYS:
                    got = getattr(client, _CLIENT_KEYS[key])
                else:
                    assert key in _CONFIG_KEYS, f"{env_id}: no check for override {key!r}"
                    got = getattr(cfg, _CONFIG_KEYS[key])
                assert got == want, (env_id, encoder, key)
    assert ONLINE_SETTINGS["LunarLander-v3"]["ridge"] != (
        ONLINE_SETTINGS["LunarLander-v3"]["heterogeneous"]["ridge"])


def test_a_tasks_anchor_keys_choose_the_apps_anchors(monkeypatch):
    """The table's ``anchor_source`` / ``n_anchors`` (Acrobot heterogeneous: uniform
    anchors) pick the anchors the app's server builds and sends (FedQHDAnchor); other
    tasks and the shared setting keep 1000 rollout anchors; manual settings still win."""
    from fedqhd.learners import fqi
    from fedqhd.learners.fqi_online import LEARNER

    assert online.online_settings("Acrobot-v1", "heterogeneous")["anchor_source"] == "uniform"
    asked: list[tuple[str, str, int]] = []
    made: list[np.ndarray] = []
    real = fqi.make_anchors

    def spy(source, env_id, m, seed, path=""):
        asked.append((source, env_id, m))
        made.append(real(source, env_id, m, seed=seed, path=path))
        return made[-1]

    monkeypatch.setattr(fqi, "make_anchors", spy)

    def server_anchors(**keys) -> tuple[str, int]:
        cfg = RunConfig.from_run_config({"protocol": "online", "encoder": "heterogeneous",
                                         **keys})
        plan = LEARNER.server_plan(cfg)
        np.testing.assert_array_equal(plan.strategy.anchors, made[-1])  # what it sends
        assert asked[-1][1] == cfg.env_id
        assert plan.run_info["anchors-shape"] == [asked[-1][2], get_spec(cfg.env_id).obs_dim]
        return asked[-1][0], asked[-1][2]

    assert server_anchors(**{"env-id": "Acrobot-v1"}) == ("uniform", 1000)
    assert server_anchors(**{"env-id": "CartPole-v1"}) == ("rollouts", 1000)
    assert server_anchors(**{"env-id": "Acrobot-v1", "online-settings": "manual",
                             "anchor-source": "rollouts", "num-anchors": 7}) == ("rollouts", 7)
    # the shared setting averages readouts: no anchors, and the table names none for it
    shared = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1"})
    assert (shared.anchor_source, shared.num_anchors) == ("rollouts", 1000)
    n_made = len(asked)
    assert C.ANCHORS not in LEARNER.server_plan(shared).initial_arrays
    assert len(asked) == n_made
    entry = ONLINE_SETTINGS["Acrobot-v1"]
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1", {**entry, "n_anchors": 77})
    assert server_anchors(**{"env-id": "Acrobot-v1"}) == ("uniform", 77)


def _federate(tmp_path, n_clients: int = 2, base: dict | None = None, **keys
              ) -> tuple[list[dict], InProcessGrid]:
    """An in-process run: its rounds' rows and its grid (the nodes' contexts)."""
    cfg = RunConfig.from_run_config({**(SMALL if base is None else base),
                                     "output-dir": str(tmp_path), **keys})
    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    final, out_dir = run_federation(grid, cfg)
    assert final["status"] == "completed", final
    return json.loads((out_dir / "results.json").read_text())["rounds"], grid


def test_a_tasks_act_local_key_makes_the_apps_clients_collect_with_their_own_fit(
        tmp_path, monkeypatch):
    """Acrobot's table sets ``act_local`` (readout averaging: each client collects with its
    own last fit); other tasks act with the global readout. In the app, round 2 of a client
    collects with its own round-1 fit under online-act-local, and with the average of the
    round-1 fits (the global readout, the same for every client) without."""
    assert RunConfig.from_run_config({"protocol": "online",
                                      "env-id": "Acrobot-v1"}).online_act_local is True
    assert RunConfig.from_run_config({"protocol": "online",
                                      "env-id": "CartPole-v1"}).online_act_local is False
    acted: dict[int, list[np.ndarray]] = defaultdict(list)
    fitted: dict[int, list[tuple[np.ndarray, int]]] = defaultdict(list)
    node: dict[str, int] = {}
    real_train = FQIOnline.train
    real_collect, real_fit = online.OnlineClient.collect, online.OnlineClient.fit

    def train(self, context, cfg, arrays):
        node["pid"] = partition(context)[0]
        return real_train(self, context, cfg, arrays)

    def collect(self, *args, **kwargs):
        acted[node["pid"]].append(self.readout.copy())
        return real_collect(self, *args, **kwargs)

    def fit(self, *args, **kwargs):
        out = real_fit(self, *args, **kwargs)
        fitted[node["pid"]].append((self.readout.copy(), self.n_transitions))
        return out

    monkeypatch.setattr(FQIOnline, "train", train)
    monkeypatch.setattr(online.OnlineClient, "collect", collect)
    monkeypatch.setattr(online.OnlineClient, "fit", fit)
    for act_local in (True, False):
        acted.clear()
        fitted.clear()
        _federate(tmp_path / str(act_local), strategy="avg", **{
            "num-server-rounds": 2, "hd-dim": 60, "online-act-local": act_local,
            "weight-cap-factor": 0.0})
        own = [fitted[pid][0][0] for pid in (0, 1)]
        second = [acted[pid][1] for pid in (0, 1)]
        assert np.abs(own[0] - own[1]).max() > 1e-6  # two different fits
        if act_local:
            for pid in (0, 1):
                np.testing.assert_array_equal(second[pid], own[pid])
        else:
            np.testing.assert_array_equal(second[0], second[1])
            n = np.array([fitted[pid][0][1] for pid in (0, 1)], dtype=float)
            np.testing.assert_allclose(second[0], (n[0] * own[0] + n[1] * own[1]) / n.sum(),
                                       rtol=1e-12, atol=1e-12)


def test_a_tasks_obs_scale_key_rescales_every_encoder_alike(monkeypatch):
    """``obs_scale`` multiplies the task's bounds for the encoders only: every client of
    the app (shared and heterogeneous encoders, via ``online-obs-scale``) and the server's
    evaluation encoder divide by the same scale; bad multipliers are refused with the key
    named."""
    scale = (1.0, 1.0, 1.0, 1.0, 0.5, 0.25)
    monkeypatch.setitem(ONLINE_SETTINGS, "Acrobot-v1",
                        {**ONLINE_SETTINGS["Acrobot-v1"], "obs_scale": scale})
    bound = get_spec("Acrobot-v1").obs_bound * np.array(scale)
    for encoder in ("shared", "heterogeneous"):
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                         "encoder": encoder})
        assert cfg.obs_scale == scale
        np.testing.assert_allclose(encoder_scale(cfg), bound)
        for pid in range(len(HETEROGENEOUS_DIMS)):
            client, _ = _new_client(cfg, pid, len(HETEROGENEOUS_DIMS))
            np.testing.assert_allclose(client.encoder.scale_, bound)
        np.testing.assert_allclose(shared_encoder(cfg).scale_, bound)  # server's evaluation
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


def test_lunarlander_default_encoder_tells_a_soft_touchdown_from_a_crash():
    """The table's LunarLander ``obs_scale`` narrows the kernel along the velocities: two
    states near the pad that differ only in vertical speed (0.1 vs 0.5, a soft touchdown
    vs a crash) must look different to every client's encoder in the app (at the task's
    full bounds their kernel similarity is ~0.95, so one readout cannot value them
    apart)."""
    soft = np.array([[0.0, 0.1, 0.0, -0.1, 0.0, 0.0, 0.0, 0.0]])
    crash = soft.copy()
    crash[0, 3] = -0.5

    def similarity(cfg: RunConfig, pid: int) -> float:
        client, _ = _new_client(cfg, pid, len(HETEROGENEOUS_DIMS))
        phi = client.encoder.transform(np.vstack([soft, crash]))
        return float(phi[0] @ phi[1] / np.linalg.norm(phi[0]) / np.linalg.norm(phi[1]))

    for encoder in ("shared", "heterogeneous"):
        auto = RunConfig.from_run_config({"protocol": "online", "env-id": "LunarLander-v3",
                                          "encoder": encoder, "seed": 0})
        full = RunConfig.from_run_config({"protocol": "online", "online-settings": "manual",
                                          "env-id": "LunarLander-v3", "encoder": encoder,
                                          "hd-dim": auto.hd_dim, "bandwidth": auto.bandwidth,
                                          "seed": 0})
        for pid in range(len(HETEROGENEOUS_DIMS) if encoder == "heterogeneous" else 1):
            assert similarity(auto, pid) < 0.8, (encoder, pid)
            assert similarity(full, pid) > 0.9, (encoder, pid)

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


def test_manual_keys_reach_the_apps_clients():
    """online-settings = manual: the app's client takes every learner key as given."""
    cfg = RunConfig.from_run_config({
        "protocol": "online", "online-settings": "manual", "hd-dim": 20, "gamma": 0.8,
        "ridge": 2.0, "proximal": 0.05, "episodes-per-round": 4, "online-per-episode": 7,
        "online-n-step": 3, "online-tail": 5, "online-action-gap": 0.3,
        "online-mc-mix": 0.4, "online-mc-window": 30, "online-ucb": 1.5})
    client, _ = _new_client(cfg, 0, 2)
    assert (client.dim, client.gamma, client.ridge, client.proximal) == (20, 0.8, 2.0, 0.05)
    assert (client.n_parallel, client.per_episode, client.n_step, client.tail) == (4, 7, 3, 5)
    assert (client.action_gap, client.mc_mix, client.mc_window, client.ucb) == (
        0.3, 0.4, 30, 1.5)
    assert client.capacity == online.default_capacity(20)
