"""The online strategies in the Flower app: FedQHD (``avg``, ``anchor``) and the paper's
baselines (``none``, ``truncate``, ``pooled``) run in process, and the strategies alone
on mock replies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Message
from messages import reply as _reply
from presets_util import write_preset

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100
from fedqhd.online import OnlineClient
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import FedQHDIndependent, FedQHDTruncate
from fedqhd.strategies import contract as C
from fedqhd.strategies.truncate import truncated_mean, with_head

KEYS = {"protocol": "online", "preset": "manual", "hd-dim": 300, "gamma": 0.9,
        "ridge": 1.0, "proximal": 0.01, "local-iterations": 5, "episodes-per-round": 20,
        "eval-episodes": 2, "seed": 7, "num-server-rounds": 6}
def _run(tmp_path, n: int, **keys) -> list[dict]:
    """The round rows of a short online run of ``n`` ClientApps in process."""
    cfg = RunConfig.from_run_config({**KEYS, "min-nodes": n, "output-dir": str(tmp_path),
                                     **keys})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    return json.loads((out / "results.json").read_text())["rounds"]


@pytest.mark.parametrize("key,value", [("per-episode", 5)])
def test_the_collection_settings_change_what_clients_collect(tmp_path, key, value):
    """``per-episode`` (transitions an episode gives the buffer) changes the data, so the
    curve: the run is FedQHD's readout averaging, learns, and is not the plain run's."""
    small = {k: KEYS[k] for k in ("hd-dim", "gamma", "ridge", "proximal", "local-iterations",
                                  "episodes-per-round")}
    runs = {}
    for name, extra in (("plain", {}), ("changed", {key: value})):
        preset = write_preset(tmp_path, name, **small, **extra)
        runs[name] = _run(tmp_path / name, 3, strategy="avg", encoder="shared",
                          **{"preset": preset, "online-episodes": 6 * 20,
                             "num-server-rounds": 6, "hd-dim": 300, "gamma": 0.9})
    plain, changed = runs["plain"], runs["changed"]
    curve = [r[TRAIN_RETURN_LAST100] for r in changed]
    assert curve[-1] > curve[0]  # something is learned, so the curves say something
    assert curve != [r[TRAIN_RETURN_LAST100] for r in plain]
    for r in changed:  # every client trained; the server evaluated the global readout
        assert r[C.REPLIES_OK] == 3 and np.isfinite(r[C.RETURN_MEAN])
        assert r.get(f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}") is None


def test_heterogeneous_fedqhd_compiles_one_teacher_per_round_into_every_client(tmp_path,
                                                                             monkeypatch):
    """Heterogeneous FedQHD (FedQHDAnchor, online): every round each client compiles the
    round's one teacher exactly once (not again at its evaluation: the compilation pulls
    toward the current readout, so a second one would move it twice), and every client
    gets the same teacher."""
    n, rounds_n = 3, 4
    compiled: list[tuple[int, np.ndarray]] = []
    real = OnlineClient.compile

    def spy(self, features, teacher, ridge, toward_own=True):
        compiled.append((len(self.readout), np.array(teacher)))
        return real(self, features, teacher, ridge, toward_own)

    monkeypatch.setattr(OnlineClient, "compile", spy)
    rounds = _run(tmp_path, n, strategy="anchor", encoder="heterogeneous",
                  **{"episodes-per-round": 10, "num-server-rounds": rounds_n,
                     "num-anchors": 100, "weight-cap-factor": 0.0})
    dims = sorted({d for d, _ in compiled})
    assert dims == [500, 1000, 2000]  # D_i names the client
    # the teacher of round r reaches the clients at round r + 1 (train) and at round r's
    # evaluation: once per client and teacher
    per_client = {d: [t for dd, t in compiled if dd == d] for d in dims}
    assert {len(v) for v in per_client.values()} == {rounds_n}
    for r in range(rounds_n):
        np.testing.assert_array_equal(per_client[500][r], per_client[1000][r])
        np.testing.assert_array_equal(per_client[500][r], per_client[2000][r])
    assert len({per_client[500][r].tobytes() for r in range(rounds_n)}) == rounds_n
    for r in rounds:
        assert r[C.REPLIES_OK] == n and r[C.REPLIES_WEIGHT_CAPPED] == 0
        assert r[f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}"] == n


class RecordingGrid(InProcessGrid):
    """An in-process grid that keeps, per message type, the array keys of every reply."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reply_keys: dict[str, set[str]] = {}

    def _handle(self, msg: Message) -> Message:
        reply = super()._handle(msg)
        if not reply.has_error() and C.ARRAYS in reply.content:
            self.reply_keys.setdefault(msg.metadata.message_type, set()).update(
                reply.content[C.ARRAYS].keys())
        return reply


def test_app_pooled_oracle_sends_only_statistics_and_every_client_acts_with_one_readout(
        tmp_path, monkeypatch):
    """``strategy = "pooled"``: what clients send is Grams, counts, reward ranges and one
    ``phi-y`` per sweep, never their rows; every client then acts with the one global
    readout (its node's readout is the round's), and the oracle learns."""
    from fedqhd.strategies import FedQHDPooled

    n, rounds_n = 3, 4
    app_w: list[np.ndarray] = []
    real_aggregate = FedQHDPooled.aggregate_train

    def spy_aggregate(self, server_round, replies):
        arrays, metrics = real_aggregate(self, server_round, replies)
        app_w.append(arrays[C.READOUT].numpy())
        return arrays, metrics

    monkeypatch.setattr(FedQHDPooled, "aggregate_train", spy_aggregate)
    cfg = RunConfig.from_run_config({**KEYS, "strategy": "pooled", "encoder": "shared",
                                     "num-server-rounds": rounds_n, "min-nodes": n,
                                     "output-dir": str(tmp_path)})
    grid = RecordingGrid([client_app] * n, run_config=cfg.to_run_config())
    _, out = run_federation(grid, cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert len(app_w) == rounds_n and np.abs(app_w[-1]).max() > 0
    curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    assert curve[-1] > curve[0]
    for r in rounds:  # every client pooled, 5 sweep exchanges, server-side evaluation
        assert (r[C.REPLIES_OK], r[C.CLIENTS_AVERAGED], r[C.POOLED_SWEEPS],
                r[C.POOLED_DROPPED]) == (n, n, 5, 0)
        assert np.isfinite(r[C.RETURN_MEAN])
    assert grid.reply_keys == {"train": {C.GRAM, C.ACTION_COUNTS, C.REWARD_RANGE},
                               C.POOLED_SWEEP: {C.PHI_Y}}
    from fedqhd.learners import fqi_online

    nodes = [c for c in fqi_online._CLIENTS.values() if c[0].dim == cfg.hd_dim]
    assert len(nodes) == n  # each client starts the next round from the last global readout
    for client, *_ in nodes:
        assert client.size > 0


def test_baseline_strategies_need_fqi_online():
    with pytest.raises(ConfigError, match="'strategy' = 'independent'.*'protocol' = 'online'"):
        RunConfig.from_run_config({"strategy": "independent"})
    with pytest.raises(ConfigError, match="'strategy' = 'truncate'.*'learner' = 'fqi'"):
        RunConfig.from_run_config({"strategy": "truncate", "learner": "pool",
                                   "env-id": "fedqhd/Inventory-v0", "protocol": "online"})
    cfg = RunConfig.from_run_config({"protocol": "online", "strategy": "truncate",
                                     "encoder": "heterogeneous"})
    assert cfg.resolved_strategy == "truncate"


# ------------------------------------------------------------------ strategies alone


def test_truncate_averages_the_first_min_d_rows_and_clients_keep_the_rest():
    rng = np.random.default_rng(0)
    readouts = {1: rng.normal(size=(6, 2)), 2: rng.normal(size=(4, 2)),
                3: rng.normal(size=(5, 2))}
    counts = {1: 10, 2: 30, 3: 60}
    # replies arrive in another order than the clients' partition ids
    replies = [_reply(10 + p, {C.READOUT: readouts[p]},
                      {C.NUM_TRANSITIONS: counts[p], C.PARTITION_ID: p}) for p in (3, 1, 2)]
    replies.append(_reply(20, {C.READOUT: rng.normal(size=(6, 3))},  # wrong |A|: refused
                          {C.NUM_TRANSITIONS: 5, C.PARTITION_ID: 4}))
    replies.append(_reply(21, error="boom"))
    arrays, metrics = FedQHDTruncate(2).aggregate_train(1, replies)
    head = arrays[C.READOUT_HEAD].numpy()
    expected = sum(counts[p] / 100 * readouts[p][:4] for p in (1, 2, 3))
    np.testing.assert_allclose(head, expected, rtol=0, atol=1e-15)
    # bit for bit the bench's arithmetic: normalised weights, summed in client order
    np.testing.assert_array_equal(head, truncated_mean([readouts[p] for p in (1, 2, 3)],
                                                       np.array([10, 30, 60]) / 100))
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_REJECTED], metrics[C.REPLIES_FAILED],
            metrics[C.CLIENTS_AVERAGED]) == (3, 1, 1, 3)
    merged = with_head(readouts[1], head)  # what client 1 continues from
    np.testing.assert_array_equal(merged[:4], head)
    np.testing.assert_array_equal(merged[4:], readouts[1][4:])
    # a client with fewer rows than the head (not sampled in a round of larger D_i) takes
    # its first rows of it, and never fails
    np.testing.assert_array_equal(with_head(readouts[2][:3], head), head[:3])
    with pytest.raises(ValueError, match="does not fit"):
        with_head(readouts[2], head[:, :1])


def test_truncate_with_another_rule_combines_the_truncated_rows():
    rows = [np.full((3, 1), v) for v in (0.0, 1.0, 100.0)]
    replies = [_reply(i, {C.READOUT: np.vstack([r, np.full((i, 1), 7.0)])},
                      {C.NUM_TRANSITIONS: 10}) for i, r in enumerate(rows)]
    arrays, _ = FedQHDTruncate(1, aggregation="median",
                               norm_bound_factor=0.0).aggregate_train(1, replies)
    np.testing.assert_array_equal(arrays[C.READOUT_HEAD].numpy(), np.ones((3, 1)))


def test_independent_strategy_only_collects_metrics():
    s = FedQHDIndependent()
    assert len(s.initial_arrays()) == 0
    replies = [_reply(1, None, {C.NUM_TRANSITIONS: 10, TRAIN_RETURN_LAST100: 20.0}),
               _reply(2, None, {C.NUM_TRANSITIONS: 30, TRAIN_RETURN_LAST100: 40.0}),
               _reply(3, None, {TRAIN_RETURN_LAST100: 1e9}),  # no size: refused
               _reply(4, error="env crashed")]
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is None  # the global record never changes
    assert metrics[TRAIN_RETURN_LAST100] == pytest.approx(35.0)  # weighted by transitions
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_REJECTED], metrics[C.REPLIES_FAILED],
            metrics[C.NUM_TRANSITIONS]) == (2, 1, 1, 40)
    assert set(s.last_client_metrics) == {1, 2}


def test_truncate_under_node_sampling_never_fails_a_client(tmp_path, monkeypatch):
    """With half the nodes sampled, a round's head can be longer than an unsampled
    client's readout (D_i 500 ... 5000): that client takes its first rows of it."""
    from fedqhd.strategies import truncate

    heads: list[int] = []

    def spy(readouts, weights):
        heads.append(min(r.shape[0] for r in readouts))
        return truncated_mean(readouts, weights)

    monkeypatch.setattr(truncate, "truncated_mean", spy)
    n = 4
    cfg = RunConfig.from_run_config({**KEYS, "strategy": "truncate", "encoder": "heterogeneous",
                                     "min-nodes": n, "fraction-train": 0.5, "seed": 1,
                                     "num-server-rounds": 3, "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    assert max(heads) > 500  # seed 1 samples two clients of D_i >= 1000 in a round
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    for r in rounds:
        assert (r[C.REPLIES_OK], r[C.REPLIES_FAILED]) == (2, 0)
        assert (r[f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}"],
                r[f"{C.EVALUATE_PREFIX}{C.REPLIES_FAILED}"]) == (n, 0)


class SweepGrid:
    """A grid whose nodes are OnlineClients answering pooled sweeps (``fail``: node ->
    the sweep index, 0-based, from which it replies an error)."""

    def __init__(self, clients: dict, fail: dict | None = None) -> None:
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.clients, self.fail, self.sweeps = clients, fail or {}, 0

    def get_node_ids(self):
        return list(self.clients)

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            assert msg.metadata.message_type == C.POOLED_SWEEP
            sweep = int(msg.content[C.CONFIG]["sweep"])
            if sweep >= self.fail.get(node, 10**9):
                replies.append(_reply(node, error="sweep crashed"))
                continue
            arrays = C.from_array_record(msg.content[C.ARRAYS])
            rhs = self.clients[node].pooled_rhs(arrays[C.READOUT], tuple(arrays[C.REWARD_RANGE]))
            replies.append(_reply(node, {C.PHI_Y: rhs}, {C.NUM_TRANSITIONS: 1}))
        self.sweeps += 1
        return replies


def _pooled_parties(n: int = 3):
    """``n`` primal OnlineClients (one encoder, D = 30) holding different transitions."""
    from fedqhd.encoders import HDEncoder
    from fedqhd.envs import get_spec
    from fedqhd.learners.fqi_online import pooled_statistics

    rng = np.random.default_rng(3)
    enc = HDEncoder(30, 1.0, scale=get_spec("CartPole-v1").obs_bound, random_state=1)
    enc.fit(np.zeros((1, 4)))
    clients = {}
    for i, (size, lo, hi) in enumerate([(80, 0.0, 1.0), (120, -1.0, 0.5), (60, 0.2, 2.0)][:n]):
        cl = OnlineClient("CartPole-v1", enc, gamma=0.9, ridge=0.5, proximal=0.05,
                          capacity=1000, n_parallel=2, seed=i, form="primal")
        cl.append(rng.uniform(-1, 1, (size, 4)), rng.integers(2, size=size),
                  rng.uniform(lo, hi, size), rng.uniform(-1, 1, (size, 4)),
                  rng.random(size) < 0.1)
        clients[10 + i] = cl
    replies = [_reply(node, pooled_statistics(cl),
                      {C.NUM_TRANSITIONS: cl.size, C.PARTITION_ID: node - 10})
               for node, cl in clients.items()]
    return clients, replies[::-1]  # replies arrive out of client order


def _pooled_round(grid, replies, readout, sweeps=3):
    from flwr.app import ConfigRecord

    from fedqhd.strategies import FedQHDPooled

    strategy = FedQHDPooled(30, 2, ridge=0.5, proximal=0.05, sweeps=sweeps)
    list(strategy.configure_train(1, C.to_array_record({C.READOUT: readout}), ConfigRecord(),
                                  grid))
    arrays, metrics = strategy.aggregate_train(1, replies)
    return (None if arrays is None else arrays[C.READOUT].numpy()), metrics


def _union_fit(parties: list[OnlineClient], sweeps: int, init: np.ndarray) -> np.ndarray:
    """The oracle's definition: one learner whose buffer is every party's buffer (their
    rows appended to one client of the same encoder and settings), fitted from ``init``
    and pulled toward it."""
    first = parties[0]
    union = OnlineClient("CartPole-v1", first.encoder, gamma=first.gamma, ridge=first.ridge,
                         proximal=first.proximal, capacity=sum(p.size for p in parties),
                         n_parallel=2, seed=0, form="primal")
    for p in parties:
        k = p.size
        union.append(p.states[:k], p.actions[:k], p.rewards[:k], p.next_states[:k],
                     p.continues[:k] == 0, reward_range=(p.r_min, p.r_max))
    return union.fit(sweeps, init=init.copy(), prior=init.copy())


def test_pooled_strategy_is_ridge_fqi_on_the_union_and_drops_a_client_whose_sweep_fails():
    clients, replies = _pooled_parties()
    init = np.random.default_rng(0).normal(scale=30.0, size=(30, 2))  # the clip binds
    got, metrics = _pooled_round(SweepGrid(clients), replies, init)
    want = _union_fit(list(clients.values()), 3, init)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (metrics[C.CLIENTS_AVERAGED], metrics[C.POOLED_SWEEPS],
            metrics[C.POOLED_DROPPED]) == (3, 3, 0)
    # node 11 fails its second sweep: the round restarts without it, so the readout is
    # pooled FQI on the two others (2 exchanges lost, 3 run again)
    grid = SweepGrid(clients, fail={11: 1})
    got, metrics = _pooled_round(grid, replies, init)
    want = _union_fit([clients[10], clients[12]], 3, init)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (metrics[C.CLIENTS_AVERAGED], metrics[C.POOLED_SWEEPS],
            metrics[C.POOLED_DROPPED], metrics[C.REPLIES_OK]) == (2, 5, 1, 3)
    # every client fails: no readout, the global one stays
    got, metrics = _pooled_round(SweepGrid(clients, fail={10: 0, 11: 0, 12: 0}), replies, init)
    assert got is None and metrics[C.CLIENTS_AVERAGED] == 0


def test_pooled_strategy_refuses_malformed_statistics():
    clients, replies = _pooled_parties(2)
    bad = [_reply(20, {C.GRAM: np.zeros((2, 7)), C.ACTION_COUNTS: np.ones(2),
                       C.REWARD_RANGE: np.zeros(2)}, {C.NUM_TRANSITIONS: 5}),
           _reply(21, {**C.from_array_record(replies[0].content[C.ARRAYS]),
                       C.REWARD_RANGE: np.array([1.0, -1.0])}, {C.NUM_TRANSITIONS: 5}),
           _reply(22, {**C.from_array_record(replies[0].content[C.ARRAYS]),
                       C.ACTION_COUNTS: np.array([-1.0, 2.0])}, {C.NUM_TRANSITIONS: 5}),
           _reply(23, error="env crashed")]
    got, metrics = _pooled_round(SweepGrid(clients), replies + bad, np.zeros((30, 2)))
    want = _union_fit(list(clients.values()), 3, np.zeros((30, 2)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_REJECTED], metrics[C.REPLIES_FAILED],
            metrics[C.CLIENTS_AVERAGED]) == (2, 3, 1, 2)


def test_pooled_needs_one_shared_encoder_and_every_client():
    base = {"protocol": "online", "strategy": "pooled"}
    with pytest.raises(ConfigError, match="'strategy' = 'pooled'.*'encoder' = 'shared'"):
        RunConfig.from_run_config({**base, "encoder": "heterogeneous"})
    with pytest.raises(ConfigError, match="'fraction-train' = 1"):
        RunConfig.from_run_config({**base, "fraction-train": 0.5})
    with pytest.raises(ConfigError, match="'hd-dim' <= the buffer's capacity"):
        RunConfig.from_run_config({**base, "preset": "manual", "hd-dim": 4000})
    with pytest.raises(ConfigError, match="'strategy' = 'pooled'.*'protocol' = 'online'"):
        RunConfig.from_run_config({"strategy": "pooled"})
    cfg = RunConfig.from_run_config(base)  # CartPole's preset: FQI clients at D 500
    assert cfg.resolved_strategy == "pooled" and cfg.hd_dim == 500
    with pytest.raises(ConfigError, match="'strategy' = 'pooled'.*update = 'fqi', got 'td'"):
        RunConfig.from_run_config({**base, "env-id": "MountainCar-v0"})


def test_a_pooled_sweep_reaches_only_a_pooled_client():
    from fedqhd.learners.fqi_online import LEARNER

    cfg = RunConfig.from_run_config({"protocol": "online", "strategy": "avg"})
    with pytest.raises(ValueError, match="pooled sweep request reached a client of strategy"):
        LEARNER.pooled_sweep(None, cfg, {})


def test_app_distillation_feddqn_distils_one_teacher_per_round_into_every_client(
        tmp_path, monkeypatch):
    """Distillation FedDQN in the app (``learner = "dqn"``, ``strategy = "anchor"``,
    heterogeneous widths): every round each client distils the round's one teacher on the
    run's anchors exactly once, which lowers its KL to the teacher, and evaluates its own
    network. Epsilon starts at 0.2, so the clients act mostly greedily and their returns
    follow their networks."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.baselines.dqn import DQNClients
    from fedqhd.learners.dqn import DISTILL_KL_AFTER, DISTILL_KL_BEFORE

    n, rounds_n, k = 3, 3, 4
    calls: list[tuple[tuple, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    real = DQNClients.distill

    def spy(self, states, teacher, tau=1.0, steps=10):
        before, after = real(self, states, teacher, tau, steps)
        calls.append((tuple(self.hidden[0]), np.array(states), np.array(teacher), before,
                      after))
        return before, after

    monkeypatch.setattr(DQNClients, "distill", spy)
    preset = write_preset(tmp_path, "dqn", **{"episodes-per-round": k, "num-anchors": 50,
                                              "epsilon": [0.2, 0.9, 0.01]})
    cfg = RunConfig.from_run_config({
        "protocol": "online", "learner": "dqn", "strategy": "anchor", "encoder": "heterogeneous",
        "preset": preset, "online-episodes": k * rounds_n,
        "weighting": "uniform", "eval-episodes": 1, "seed": 3, "min-nodes": n,
        "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    assert len(calls) == n * rounds_n  # once per client and round
    assert sorted({c[0] for c in calls}) == [(64, 128), (96, 192), (128, 256)]
    for r in range(rounds_n):
        this = calls[r * n:(r + 1) * n]
        assert len({c[0] for c in this}) == n  # every client, once
        for _, anchors, teacher, before, after in this:
            np.testing.assert_array_equal(anchors, this[0][1])
            np.testing.assert_array_equal(teacher, this[0][2])  # one teacher per round
            assert anchors.shape == (50, 4) and after[0] < before[0]
    assert len({c[2].tobytes() for c in calls}) == rounds_n
    for r in rounds:  # every client trained and evaluated its own network
        assert r[C.REPLIES_OK] == n and r[f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}"] == n
        assert np.isfinite(r[C.RETURN_MEAN]) and 0 < r[DISTILL_KL_AFTER] < r[DISTILL_KL_BEFORE]
