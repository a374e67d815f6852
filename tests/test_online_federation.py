"""The online protocol inside the Flower apps (in process, no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from presets_util import write_preset

from fedqhd import online
from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.encoders import HETEROGENEOUS_DIMS, HDEncoder
from fedqhd.envs import batch, get_spec
from fedqhd.learners.fqi import client_encoder, encoder_scale, shared_encoder
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, VALUE_BIAS, _new_client
from fedqhd.presets import REMOVED_KEYS, OnlineSettings, builtin_preset, load_preset, resolve_preset
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C
from fedqhd.strategies.base import FunctionSpaceStrategy

#: the tasks with a built-in online preset
TASKS = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3")


def _preset(env_id: str, encoder: str):
    """The run-config keys and learner settings the task's preset gives ``encoder``."""
    return resolve_preset(load_preset(builtin_preset(env_id)), encoder, env_id)


SMALL = {"protocol": "online", "preset": "manual", "hd-dim": 300, "gamma": 0.9,
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


@pytest.mark.parametrize(("strategy", "every"), [("anchor", 1), ("independent", 1),
                                                 ("anchor", 2)])
def test_a_rounds_evaluation_rides_on_the_next_train_messages_with_the_same_numbers(
        tmp_path, strategy, every, monkeypatch, caplog):
    """Online clients evaluate round r's model when round r + 1's train message brings it
    (evaluate_and_train): evaluate messages go out after the last round only, and every
    round's row holds the numbers evaluate messages give, bit for bit (train metrics,
    evaluation, counts)."""
    sent: list[tuple[int, str]] = []
    handle = InProcessGrid._handle

    def counted(self, msg):
        sent.append((int(msg.content[C.CONFIG][C.SERVER_ROUND]), msg.metadata.message_type))
        return handle(self, msg)

    monkeypatch.setattr(InProcessGrid, "_handle", counted)
    keys = {"encoder": "heterogeneous", "strategy": strategy, "num-server-rounds": 4,
            "episodes-per-round": 10, "fraction-train": 1.0, "eval-every": every}
    with caplog.at_level("INFO"):
        deferred = _run(tmp_path / "deferred", n_clients=3, **keys)
    console = [r.getMessage() for r in caplog.records
               if r.getMessage().startswith("fedqhd round")]
    with_deferral = list(sent)
    sent.clear()
    monkeypatch.setattr(FunctionSpaceStrategy, "_defers", lambda self, r: False)
    messages = _run(tmp_path / "messages", n_clients=3, **keys)
    evaluated = [r for r in range(1, 5) if r % every == 0 or r == 4]
    assert [r for r, kind in with_deferral if kind == "evaluate"] == [4, 4, 4]
    assert [r for r, kind in sent if kind == "evaluate"] == [r for r in evaluated
                                                              for _ in range(3)]
    for a, b in zip(deferred["rounds"], messages["rounds"], strict=True):
        a.pop("wall-time-s"), b.pop("wall-time-s")
        assert a == b
        assert (C.RETURN_MEAN in a) == (a["round"] in evaluated)
        assert a.get("evaluate-replies-ok", 3) == 3 and np.isfinite(a.get(C.RETURN_MEAN, 0.0))
    assert deferred["final"]["return-mean"] == messages["final"]["return-mean"]
    lines = (sorted((tmp_path / "deferred").glob("*/*/rounds.jsonl"))[0]
             .read_text().splitlines())
    amended = [r for r in evaluated if r < 4]  # each a line again, after the next round's
    # the console: a round's own line says "return -" until its evaluation comes
    first = deferred["rounds"][evaluated[0] - 1]
    assert any(x.startswith(f"fedqhd round {evaluated[0]}/4: ") and "return - |" in x
               for x in console)
    assert any(x.startswith(f"fedqhd round {evaluated[0]}/4, evaluated with round "
                            f"{evaluated[0] + 1}'s messages") and
               f"return {first[C.RETURN_MEAN]:.1f} +- " in x for x in console)
    assert [json.loads(x)["round"] for x in lines] == sorted([1, 2, 3, 4, *amended])


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
    with pytest.raises(ConfigError, match="'protocol' = 'online' needs 'learner' = 'fqi'"):
        RunConfig.from_run_config({"protocol": "online", "learner": "pool",
                                   "env-id": "fedqhd/Inventory-v0"})
    with pytest.raises(ConfigError, match="preset"):
        RunConfig.from_run_config({"protocol": "online", "preset": "best"})


@pytest.mark.parametrize("body,key", [
    ("mc-mix = 1.5", "mc-mix"), ("mc-window = 0", "mc-window"), ("tail = -1", "tail"),
    ("epsilon = [0.1, 0.9, 0.5]", "epsilon"), ("per-episode = 2.5", "per-episode"),
    ("act-local = true", "act-local"), ("obs-scale = [1, -1]", "obs-scale"),
    ("gamma = 1.5", "gamma"), ("hd-dim = 0", "hd-dim"), ("hd-dim = 'big'", "hd-dim"),
    ("pessimism = 10", "pessimism"), ("[heterogeneous]\nsweeps = 3", "sweeps"),
    ("[other]\ntail = 1", "other"), ("tail = ", "TOML")])
def test_a_bad_preset_is_refused_naming_the_file_and_the_key(tmp_path, body, key):
    """The issue's bad input: a preset that names an unknown key or gives a value out of
    range is refused; the error names the file and the key."""
    path = tmp_path / "mine.toml"
    path.write_text(body + "\n")
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"protocol": "online", "preset": str(path)})
    assert str(path) in str(err.value) and key in str(err.value)


@pytest.mark.parametrize("key", sorted(REMOVED_KEYS))
def test_a_removed_learner_key_is_refused_saying_it_was_removed(tmp_path, key):
    """``act-local``, ``n-step``, ``action-gap`` and ``ucb`` were deleted with their code: a preset
    (top level or an encoder table) or a run config that still names one is refused, and
    the error says the key was removed rather than guessing a similar one."""
    assert key not in OnlineSettings.keys()
    for i, body in enumerate((f"{key} = 1\n", f"tail = 1\n[heterogeneous]\n{key} = 1\n")):
        path = tmp_path / f"old{i}.toml"
        path.write_text(body)
        with pytest.raises(ConfigError, match=f"'{key}' .* was removed"):
            RunConfig.from_run_config({"protocol": "online", "preset": str(path)})
    with pytest.raises(ConfigError) as err:
        RunConfig.from_run_config({"protocol": "online", key: 1})
    assert f"'{key}' (" in str(err.value) and "was removed" in str(err.value)
    assert "did you mean" not in str(err.value)


def test_a_missing_preset_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.toml.*not a readable TOML"):
        RunConfig.from_run_config({"protocol": "online",
                                   "preset": str(tmp_path / "nowhere.toml")})


def test_online_auto_settings_follow_the_tasks_preset_file():
    for env_id in TASKS:
        for encoder in ("shared", "heterogeneous"):
            run_keys, settings = _preset(env_id, encoder)
            cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                             "encoder": encoder})
            assert cfg.online == settings
            for key, value in run_keys.items():
                assert getattr(cfg, key.replace("-", "_")) == value, (env_id, encoder, key)
            assert cfg.record()["online"] == settings.to_dict()  # what results record
    # the paper's settings, as BENCHMARKS.md "Online presets" gives them
    cartpole = RunConfig.from_run_config({"protocol": "online"})
    assert (cartpole.hd_dim, cartpole.gamma, cartpole.local_iterations,
            cartpole.episodes_per_round) == (500, 0.9, 5, 20)
    assert cartpole.online.epsilon == (1.0, 0.99, 0.0) and cartpole.online.tail == 20
    lunar = RunConfig.from_run_config({"protocol": "online", "env-id": "LunarLander-v3"})
    assert (lunar.gamma, lunar.online.update, lunar.online.td_rate, lunar.online.obs_scale[2]) == (
        0.99, "td", 0.2, 0.75)
    dqn = RunConfig.from_run_config({"protocol": "online", "learner": "dqn"})
    assert (dqn.episodes_per_round, dqn.online.epsilon) == (25, (1.0, 0.995, 0.001))
    # manual keeps the keys as given; the offline protocol never sees a preset
    cfg = RunConfig.from_run_config({"protocol": "online", "preset": "manual",
                                     "hd-dim": 123, "gamma": 0.5})
    assert (cfg.hd_dim, cfg.gamma) == (123, 0.5)
    assert cfg.online == RunConfig().online  # the learner's defaults
    offline = RunConfig.from_run_config({"env-id": "MountainCar-v0"})
    assert (offline.hd_dim, offline.gamma, offline.local_iterations) == (2000, 0.99, 3)


def test_a_presets_strategy_is_what_auto_stands_for(tmp_path):
    """MountainCar's shared clients compile their average on anchors, toward zero (its
    preset's ``strategy = "anchor"``; BENCHMARKS.md, "Online presets"). A preset's strategy
    replaces only ``auto``: the paper's baselines and a user's own strategy keep theirs,
    and nothing is refused."""
    mc = {"protocol": "online", "env-id": "MountainCar-v0"}
    cfg = RunConfig.from_run_config(mc)
    assert (cfg.resolved_strategy, cfg.hd_dim, cfg.online.update,
            cfg.online.compile_toward) == ("anchor", 2000, "td", "zero")
    again = RunConfig.from_run_config(cfg.to_run_config())  # what every ClientApp parses
    assert again.resolved_strategy == "anchor" and again.online == cfg.online
    for strategy in ("avg", "independent", "truncate"):
        assert RunConfig.from_run_config({**mc, "strategy": strategy}).resolved_strategy == (
            strategy)
    assert RunConfig.from_run_config({"protocol": "online"}).resolved_strategy == "avg"
    # a private client's one release is a readout with a shared encoder: auto stays avg
    assert RunConfig.from_run_config({**mc, "privacy": "zcdp"}).resolved_strategy == "avg"
    mine = write_preset(tmp_path, **{"hd-dim": 50, "strategy": "anchor"})
    ours = RunConfig.from_run_config({"protocol": "online", "preset": mine})
    assert ours.resolved_strategy == "anchor"
    with pytest.raises(ConfigError, match="strategy"):
        RunConfig.from_run_config({"protocol": "online",
                                   "preset": write_preset(tmp_path, "bad", strategy="best")})


def test_the_apps_clients_take_the_table():
    """preset = auto builds every client of the app from the task's table: its
    discount, penalties, transitions per episode, tail, mixed
    Monte-Carlo targets, optimism, episodes side by side, its encoder's D (D_i cycled
    500, 1000, 2000, 5000 under heterogeneous encoders) and default_capacity(D_i) slots."""
    for (env_id, encoder) in [(e, k) for e in TASKS for k in ("shared", "heterogeneous")]:
        run_keys, settings = _preset(env_id, encoder)
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                         "encoder": encoder})
        n_parts = len(HETEROGENEOUS_DIMS) if encoder == "heterogeneous" else 2
        for pid in range(n_parts):
            client, _ = _new_client(cfg, pid, n_parts)
            dim = (HETEROGENEOUS_DIMS[pid] if encoder == "heterogeneous"
                   else run_keys["hd-dim"])
            assert client.encoder is client_encoder(cfg, pid)
            assert client.dim == dim, (env_id, encoder, pid)
            assert (client.gamma, client.ridge, client.proximal) == (
                run_keys["gamma"], run_keys["ridge"],
                run_keys.get("proximal", RunConfig().proximal)), (env_id, encoder)
            assert client.per_episode == settings.per_episode
            assert client.tail == settings.tail
            assert (client.mc_mix, client.mc_window) == (settings.mc_mix, settings.mc_window)
            if settings.update == "td":  # one episode at a time, learning at every step
                assert (client.update, client.td_rate) == ("td", settings.td_rate)
                assert (client.replay, client.replay_rate, client.replay_start) == (
                    settings.td_replay, settings.td_replay_rate, settings.td_replay_start)
                assert (client.replay_ring is None) == (settings.td_replay == 0)
                assert (client.n_parallel, client.capacity) == (1, 0)
            else:
                assert client.n_parallel == run_keys["episodes-per-round"]
                assert client.capacity == online.default_capacity(dim)
            if encoder == "shared":
                assert client.encoder.bandwidth == run_keys["bandwidth"]
            else:  # bandwidth_i = bandwidth * U(0.5, 1.5)
                assert 0.5 <= client.encoder.bandwidth / run_keys["bandwidth"] <= 1.5


#: where each key of a preset's ``[heterogeneous]`` table lands: an attribute of the
#: app's client, or the run config (the server's anchors, the learner settings)
_CLIENT_KEYS = {"gamma": "gamma", "ridge": "ridge", "proximal": "proximal",
                "mc-mix": "mc_mix", "mc-window": "mc_window", "tail": "tail",
                "per-episode": "per_episode", "td-rate": "td_rate"}


def test_a_tasks_heterogeneous_overrides_reach_only_heterogeneous_clients():
    """A preset's ``[heterogeneous]`` table (Acrobot's anchors, LunarLander's
    kernel width and TD step, CartPole's episodes per round) changes the heterogeneous clients
    of the app and leaves the shared ones at the top-level values."""
    tasks = [e for e in TASKS if load_preset(builtin_preset(e)).get("heterogeneous")]
    assert {"Acrobot-v1", "LunarLander-v3", "CartPole-v1"} <= set(tasks)
    for env_id in tasks:
        data = load_preset(builtin_preset(env_id))
        for encoder in ("shared", "heterogeneous"):
            cfg = RunConfig.from_run_config({"protocol": "online", "env-id": env_id,
                                             "encoder": encoder})
            client, _ = _new_client(cfg, 0, 2)
            default = RunConfig.from_run_config({"protocol": "online",
                                                 "preset": "manual"})
            for key, value in data["heterogeneous"].items():
                top = data.get(key, getattr(default.online, key.replace("-", "_"), None)
                               if key not in ("anchor-source", "num-anchors")
                               else getattr(default, key.replace("-", "_")))
                want = value if encoder == "heterogeneous" else top
                if key in _CLIENT_KEYS:
                    got = getattr(client, _CLIENT_KEYS[key])
                elif hasattr(cfg.online, key.replace("-", "_")):
                    got = getattr(cfg.online, key.replace("-", "_"))
                    want = tuple(want) if isinstance(want, list) else want
                else:
                    got = getattr(cfg, key.replace("-", "_"))
                assert got == want, (env_id, encoder, key)
    lunar = load_preset(builtin_preset("LunarLander-v3"))
    assert lunar["td-rate"] != lunar["heterogeneous"]["td-rate"]


def test_a_tasks_anchor_keys_choose_the_apps_anchors(tmp_path, monkeypatch):
    """The table's ``anchor_source`` / ``n_anchors`` (Acrobot heterogeneous: uniform
    anchors) pick the anchors the app's server builds and sends (FedQHDAnchor); other
    tasks and the shared setting keep 1000 rollout anchors; manual settings still win."""
    from fedqhd.learners import fqi
    from fedqhd.learners.fqi_online import LEARNER

    assert _preset("Acrobot-v1", "heterogeneous")[0]["anchor-source"] == "uniform"
    asked: list[tuple[str, str, int]] = []
    made: list[np.ndarray] = []
    real = fqi.make_anchors

    def spy(source, env_id, m, seed):
        asked.append((source, env_id, m))
        made.append(real(source, env_id, m, seed=seed))
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
    assert server_anchors(**{"env-id": "Acrobot-v1", "preset": "manual",
                             "anchor-source": "rollouts", "num-anchors": 7}) == ("rollouts", 7)
    # the shared setting averages readouts: no anchors, and the table names none for it
    shared = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1"})
    assert (shared.anchor_source, shared.num_anchors) == ("rollouts", 1000)
    n_made = len(asked)
    assert C.ANCHORS not in LEARNER.server_plan(shared).initial_arrays
    assert len(asked) == n_made
    mine = write_preset(tmp_path, **{"anchor-source": "uniform", "num-anchors": 77})
    assert server_anchors(**{"env-id": "Acrobot-v1", "preset": mine}) == ("uniform", 77)


def _federate(tmp_path, n_clients: int = 2, base: dict | None = None, **keys
              ) -> tuple[list[dict], InProcessGrid]:
    """An in-process run: its rounds' rows and its grid (the nodes' contexts)."""
    cfg = RunConfig.from_run_config({**(SMALL if base is None else base),
                                     "output-dir": str(tmp_path), **keys})
    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    final, out_dir = run_federation(grid, cfg)
    assert final["status"] == "completed", final
    return json.loads((out_dir / "results.json").read_text())["rounds"], grid


def test_a_presets_obs_scale_rescales_every_encoder_alike(tmp_path):
    """``obs-scale`` multiplies the task's bounds for the encoders only: every client of
    the app (shared and heterogeneous encoders) and the server's evaluation encoder divide
    by the same scale; offline runs of a built-in task keep the bounds (its preset holds
    online settings); a wrong count is refused."""
    scale = (1.0, 1.0, 1.0, 1.0, 0.5, 0.25)
    preset = write_preset(tmp_path, "acro", **{"obs-scale": list(scale)})
    bound = get_spec("Acrobot-v1").obs_bound * np.array(scale)
    for encoder in ("shared", "heterogeneous"):
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                         "encoder": encoder, "preset": preset})
        assert cfg.online.obs_scale == scale
        np.testing.assert_allclose(encoder_scale(cfg), bound)
        for pid in range(len(HETEROGENEOUS_DIMS)):
            client, _ = _new_client(cfg, pid, len(HETEROGENEOUS_DIMS))
            np.testing.assert_allclose(client.encoder.scale_, bound)
        np.testing.assert_allclose(shared_encoder(cfg).scale_, bound)  # server's evaluation
        offline = cfg.replace(protocol="offline")  # a preset file applies offline too
        np.testing.assert_allclose(client_encoder(offline, 1).scale_, bound)
        builtin = RunConfig.from_run_config({"env-id": "Acrobot-v1", "encoder": encoder})
        np.testing.assert_allclose(client_encoder(builtin, 1).scale_,  # presets are online
                                   get_spec("Acrobot-v1").obs_bound)
    short = write_preset(tmp_path, "short", **{"obs-scale": [1, 2]})
    with pytest.raises(ConfigError, match="'obs-scale'.*needs 6 multipliers"):
        RunConfig.from_run_config({"protocol": "online", "env-id": "Acrobot-v1",
                                   "preset": short})
    from fedqhd.learners.fqi import encoder_bound

    with pytest.raises(ValueError, match="obs_scale"):
        encoder_bound("Acrobot-v1", (1.0, 0.0, 1, 1, 1, 1))


def test_lunarlander_encoders_see_x_at_the_pads_scale():
    """The table's LunarLander ``obs_scale`` maps x at 0.3, the pad's scale (the pad is
    |x| < 0.2; the FedQHD authors' code maps it at 1, and their failures touch down off the
    pad: BENCHMARKS.md, "What carries ours past theirs"), every other coordinate as their
    code does (their bounds' half-widths: y 0.8, speeds 1.5 and 1.25, angle 0.5, angular
    speed 1, legs 0.5), in both settings. A different width along any coordinate changes
    every client's features."""
    half_widths = [0.3, 0.8, 1.5, 1.25, 0.5, 1.0, 0.5, 0.5]
    state = np.array([[0.1, 0.5, -0.2, -0.3, 0.05, 0.1, 0.0, 1.0]])
    for encoder in ("shared", "heterogeneous"):
        cfg = RunConfig.from_run_config({"protocol": "online", "env-id": "LunarLander-v3",
                                         "encoder": encoder, "seed": 0})
        np.testing.assert_allclose(encoder_scale(cfg), half_widths, rtol=1e-3)
        client, _ = _new_client(cfg, 0, len(HETEROGENEOUS_DIMS))
        ref = HDEncoder(client.encoder.hd_dim, client.encoder.bandwidth,
                        scale=np.asarray(half_widths),
                        random_state=client.encoder.random_state).fit(state)
        np.testing.assert_allclose(client.encoder.transform(state), ref.transform(state),
                                   atol=1e-3)


def test_online_auto_runs_the_papers_600_episodes_per_client():
    shared = RunConfig.from_run_config({"protocol": "online", "env-id": "CartPole-v1"})
    assert shared.num_server_rounds * shared.episodes_per_round == 600
    het = RunConfig.from_run_config({"protocol": "online", "encoder": "heterogeneous"})
    assert het.num_server_rounds * het.episodes_per_round == 600
    short = RunConfig.from_run_config({"protocol": "online", "online-episodes": 100})
    assert short.num_server_rounds == 5  # ceil(100 / 20)
    assert RunConfig().num_server_rounds == 20  # offline runs keep their own rounds


def test_rounds_that_disagree_with_the_auto_episodes_are_refused():
    """Under preset = auto the rounds come from online-episodes; a
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
    manual = RunConfig.from_run_config({"protocol": "online", "preset": "manual",
                                        "num-server-rounds": 5})
    assert manual.num_server_rounds == 5


def test_keys_the_auto_settings_would_replace_are_refused():
    """preset = auto takes the run-config keys the task's preset sets; a key given
    with another value would be dropped without a word, so it is refused, naming the
    key, its value and the preset's; the default or the preset's own value passes."""
    with pytest.raises(ConfigError, match=r"'gamma' = 0.95 \(preset: 0.9\).*'manual'"):
        RunConfig.from_run_config({"protocol": "online", "gamma": 0.95})
    with pytest.raises(ConfigError, match=r"'gamma' = 0.9 \(preset: 0.99\)"):
        RunConfig.from_run_config({"protocol": "online", "learner": "dqn", "gamma": 0.9})
    same = RunConfig.from_run_config({"protocol": "online", "gamma": 0.9, "hd-dim": 500})
    assert (same.gamma, same.hd_dim) == (0.9, 500)
    manual = RunConfig.from_run_config({"protocol": "online", "preset": "manual",
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
    assert plan.round_metrics()[TRAIN_RETURN_LAST100] == 20.0


def test_a_user_presets_keys_reach_the_apps_clients(tmp_path):
    """preset = a preset file: the app's client takes every setting it gives."""
    preset = write_preset(tmp_path, **{
        "hd-dim": 20, "gamma": 0.8, "ridge": 2.0, "proximal": 0.05, "episodes-per-round": 4,
        "per-episode": 7, "tail": 5, "mc-mix": 0.4, "mc-window": 30})
    cfg = RunConfig.from_run_config({"protocol": "online", "preset": preset,
                                     "online-episodes": 8})
    assert cfg.num_server_rounds == 2
    client, _ = _new_client(cfg, 0, 2)
    assert (client.dim, client.gamma, client.ridge, client.proximal) == (20, 0.8, 2.0, 0.05)
    assert (client.n_parallel, client.per_episode, client.tail) == (4, 7, 5)
    assert (client.mc_mix, client.mc_window) == (0.4, 30)
    assert client.capacity == online.default_capacity(20)


@pytest.mark.parametrize("toward", ["own", "zero"])
def test_a_teacher_compiles_toward_the_clients_readout_or_zero(tmp_path, toward):
    """compile-toward: two clients with different readouts that adopt one teacher end
    with one readout (zero: the teacher's projection alone, the authors' overwrite) or
    keep their difference where the anchors leave them free (own)."""
    from fedqhd.learners.fqi_online import _adopt

    preset = write_preset(tmp_path, **{"hd-dim": 200, "ridge": 1e-6, "compile-toward": toward})
    cfg = RunConfig.from_run_config({"protocol": "online", "preset": preset,
                                     "online-episodes": 8})
    assert cfg.online.compile_toward == toward
    rng = np.random.default_rng(0)
    anchors = rng.uniform(-1, 1, (50, 4)).astype(np.float32)
    teacher = rng.normal(size=(50, 2))
    readouts = []
    for scale in (0.0, 5.0):
        client, cache = _new_client(cfg, 0, 2)
        client.readout = scale * rng.normal(size=client.readout.shape)
        _adopt(client, cache, {C.TEACHER: teacher, C.ANCHORS: anchors}, cfg, {})
        assert np.abs(client.q_values(anchors) - teacher).max() < 0.1  # the teacher fits
        readouts.append(client.readout)
    apart = np.abs(readouts[0] - readouts[1]).max()
    assert apart < 1e-9 if toward == "zero" else apart > 1.0


def test_an_edited_preset_file_is_read_again(tmp_path):
    """Presets are cached per file, keyed by its size and modification time: an edit
    between two runs is seen."""
    path = tmp_path / "mine.toml"
    path.write_text("tail = 1\n")
    first = RunConfig.from_run_config({"protocol": "online", "preset": str(path)})
    path.write_text("tail = 25\nmc-mix = 0.5\n")
    second = RunConfig.from_run_config({"protocol": "online", "preset": str(path)})
    assert (first.online.tail, second.online.tail, second.online.mc_mix) == (1, 25, 0.5)


def test_eval_every_evaluates_every_kth_round_and_the_last(tmp_path):
    """eval-every = 3 over 4 rounds: the greedy evaluation (here federated: heterogeneous
    encoders, each client its compiled policy) runs after rounds 3 and 4 only."""
    rows = _run(tmp_path, encoder="heterogeneous",
                **{"num-server-rounds": 4, "episodes-per-round": 4, "eval-every": 3,
                   "hd-dim": 100, "num-anchors": 50, "eval-episodes": 1})["rounds"]
    evaluated = [r["round"] for r in rows if C.RETURN_MEAN in r]
    sent = [r["round"] for r in rows if r.get(f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}")]
    assert evaluated == sent == [3, 4]
    assert all(r[C.REPLIES_OK] == 2 for r in rows)  # every round trained


def test_every_rounds_paper_metric_is_the_plain_mean_of_its_replies(tmp_path, monkeypatch):
    """train-return-last100 and value-bias in every round's row, evaluated or not
    (eval-every = 3 over 4 rounds), are plain means over the clients' replies, as the paper
    defines its metric, not the strategy's mean weighted by the clients' transitions."""
    replies: dict[int, list] = {}
    handle = InProcessGrid._handle

    def recorded(self, msg):
        reply = handle(self, msg)
        if msg.metadata.message_type == "train":
            m = reply.content[C.METRICS]
            replies.setdefault(int(msg.content[C.CONFIG][C.SERVER_ROUND]), []).append(
                (m[TRAIN_RETURN_LAST100], m[VALUE_BIAS], m[C.NUM_TRANSITIONS]))
        return reply

    monkeypatch.setattr(InProcessGrid, "_handle", recorded)
    rows = _run(tmp_path, n_clients=3, **{"num-server-rounds": 4, "episodes-per-round": 4,
                                          "eval-every": 3, "eval-episodes": 1})["rounds"]
    assert [r["round"] for r in rows if C.RETURN_MEAN in r] == [3, 4]
    apart = 0.0
    for row in rows:
        ret, bias, n = np.array(replies[row["round"]]).T
        assert len(ret) == 3
        assert row[TRAIN_RETURN_LAST100] == pytest.approx(ret.mean(), rel=1e-12)
        assert row[VALUE_BIAS] == pytest.approx(bias.mean(), rel=1e-12)
        apart = max(apart, abs(ret.mean() - np.average(ret, weights=n)))
    assert apart > 0.1  # the transitions-weighted mean differs: the test tells them apart


@pytest.mark.parametrize("encoder", ["shared", "heterogeneous"])
def test_td_clients_learn_through_the_apps_without_a_buffer(tmp_path, encoder):
    """A preset's ``update = "td"``: the apps' clients learn at every step while they
    collect (one episode at a time, nothing buffered), reply what they learnt and
    federate it like any readout."""
    preset = write_preset(tmp_path, "td", **{
        "hd-dim": 1000, "bandwidth": 1.0, "gamma": 0.9, "ridge": 1e-4, "proximal": 0.0,
        "local-iterations": 1, "episodes-per-round": 20, "update": "td", "td-rate": 0.2,
        "epsilon": [0.8, 0.9, 0.01]})
    rows, grid = _federate(tmp_path, 3, encoder=encoder, base={
        "protocol": "online", "eval-episodes": 3, "min-nodes": 3, "num-anchors": 300}, **{
        "preset": preset, "online-episodes": 300})
    train = [r[TRAIN_RETURN_LAST100] for r in rows]
    # uniform random actions: about 22 a CartPole episode
    assert train[0] < 40 and train[-1] > 2 * train[0] and rows[-1][C.RETURN_MEAN] > 60
    for context in grid.contexts.values():
        record = context.state["fedqhd-online"]
        assert record["states"].numpy().shape[0] == 0 and record["episode-returns"].numpy(
            ).shape == (300,)
