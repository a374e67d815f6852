"""The paper's baselines in the Flower app (``strategy = "none"`` / ``"truncate"`` /
``"pooled"``, online protocol): the same numbers as the bench's in-process
:func:`fedqhd.online.run_online`, and the strategies on mock replies."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Message
from messages import reply as _reply

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners.fqi_online import TRAIN_RETURN_LAST100, VALUE_BIAS, run_online_kwargs
from fedqhd.online import OnlineClient, run_online
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import FedQHDIndependent, FedQHDTruncate
from fedqhd.strategies import contract as C
from fedqhd.strategies.truncate import truncated_mean, with_head

KEYS = {"protocol": "online", "online-settings": "manual", "hd-dim": 300, "gamma": 0.9,
        "ridge": 1.0, "proximal": 0.01, "local-iterations": 5, "episodes-per-round": 20,
        "eval-episodes": 2, "online-capacity": 400, "seed": 7, "num-server-rounds": 6}
@pytest.mark.parametrize("strategy,encoder", [("none", "shared"), ("none", "heterogeneous"),
                                              ("truncate", "heterogeneous"),
                                              ("avg", "shared"),  # and FedQHD itself
                                              ("avg-act-local", "shared"),
                                              ("avg-pessimism", "shared"),
                                              ("avg-ucb", "shared"),
                                              ("avg-boltzmann", "shared"),
                                              ("avg-until", "shared")])
def test_app_baseline_equals_the_benchs_in_process_run(tmp_path, strategy, encoder):
    """Round by round, the app's train-return-last100 is the bench's (same clients, seeds,
    settings, and the truncated mean summed in client order as the bench sums it); only
    the mean over clients is taken in reply order, hence 1e-9 and not equality.
    ``avg-act-local``: FedQHD whose clients collect with their own last fit;
    ``avg-pessimism``: FedQHD with pessimistic targets; ``avg-ucb``: FedQHD whose clients
    collect optimistically (a client rebuilt from its node state factors its posterior
    again and acts as the bench's); ``avg-boltzmann``: FedQHD whose clients sample their
    actions from the softmax of Q (the draws come from the client's generator, which
    travels in the node state); ``avg-until``: FedQHD whose exploration ends at episode 60
    (``epsilon-until``)."""
    n = 3
    local, pessimism = strategy == "avg-act-local", 5.0 * (strategy == "avg-pessimism")
    ucb = 2.0 * (strategy == "avg-ucb")
    boltzmann = 1.0 * (strategy == "avg-boltzmann")
    until = 60 * (strategy == "avg-until")
    strategy = "avg" if strategy.startswith("avg") else strategy
    cfg = RunConfig.from_run_config({**KEYS, "strategy": strategy, "encoder": encoder,
                                     "min-nodes": n, "output-dir": str(tmp_path),
                                     "online-act-local": local,
                                     "online-pessimism": pessimism,
                                     "online-ucb": ucb, "online-boltzmann": boltzmann,
                                     **({"epsilon-floor": 0.3, "epsilon-until": until}
                                        if until else {})})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    bench = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1, **run_online_kwargs(cfg))
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r["train-return-last100"] for r in bench.rounds]
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)
    assert bench_curve[-1] > bench_curve[0]  # something is learned, so the curves say something
    # the overestimation monitor: the plain mean over clients, as the bench's
    np.testing.assert_allclose([r[VALUE_BIAS] for r in rounds],
                               [r["value-bias"] for r in bench.rounds], rtol=1e-9, atol=1e-9)
    for r in rounds:  # every client trained (and, baselines, evaluated its own policy)
        assert r[C.REPLIES_OK] == n and r[C.REPLIES_WEIGHT_CAPPED] == 0
        assert np.isfinite(r[C.RETURN_MEAN])
        assert r.get(f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}") == (None if strategy == "avg" else n)
    if strategy == "truncate":
        # the clients did federate: the curve is not the independent learners'
        alone = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                           **{**run_online_kwargs(cfg), "aggregate": None})
        assert [r["train-return-last100"] for r in alone.rounds] != bench_curve
    if local:  # the clients did act with their own fits: the curve is not plain averaging's
        shared = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                            **{**run_online_kwargs(cfg), "act_local": False})
        assert [r["train-return-last100"] for r in shared.rounds] != bench_curve
    if ucb:  # the clients did act on the bonus: the curve is not epsilon-greedy's
        plain = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                           **{**run_online_kwargs(cfg), "ucb": 0.0})
        assert [r["train-return-last100"] for r in plain.rounds] != bench_curve
    if boltzmann:  # the clients did sample: the curve is not epsilon-greedy's
        plain = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                           **{**run_online_kwargs(cfg), "boltzmann": 0.0})
        assert [r["train-return-last100"] for r in plain.rounds] != bench_curve
    if until:  # exploration did end at episode 60: the curve is not the floor's throughout
        floor = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                           **{**run_online_kwargs(cfg), "epsilon": (1.0, 0.9, 0.3)})
        assert [r["train-return-last100"] for r in floor.rounds][:3] == bench_curve[:3]
        assert [r["train-return-last100"] for r in floor.rounds] != bench_curve
    if pessimism:  # the clients did fit pessimistic targets: the curve is not plain FQI's
        plain = run_online(n_clients=n, episodes=6 * 20, greedy_episodes=1,
                           **{**run_online_kwargs(cfg), "pessimism": 0.0})
        assert [r["train-return-last100"] for r in plain.rounds] != bench_curve


def test_app_fedqhd_anchor_equals_the_benchs_run(tmp_path, monkeypatch):
    """Heterogeneous FedQHD (FedQHDAnchor, online) in the app is the bench's
    ``run_online(aggregate="anchors")``: every client compiles the same teacher (the
    bench's anchors and seed, the anchors in the client's float32 features, transition
    weights) exactly once per round, so the readouts and the curves equal the bench's.
    ``weight-cap-factor`` 0: the app's default cap (3x the median transitions) may act
    where the bench weights plain transitions."""
    n, rounds_n = 3, 4
    compiled: list[tuple[int, np.ndarray, np.ndarray]] = []
    real = OnlineClient.compile

    def spy(self, features, teacher, ridge, toward_own=True):
        residual = real(self, features, teacher, ridge, toward_own)
        compiled.append((len(self.readout), np.array(teacher), self.readout.copy()))
        return residual

    monkeypatch.setattr(OnlineClient, "compile", spy)
    cfg = RunConfig.from_run_config({**KEYS, "strategy": "anchor", "encoder": "heterogeneous",
                                     "episodes-per-round": 10, "num-server-rounds": rounds_n,
                                     "num-anchors": 100, "weight-cap-factor": 0.0,
                                     "min-nodes": n, "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    app_compiled, compiled[:] = list(compiled), []
    bench = run_online(n_clients=n, episodes=rounds_n * 10, greedy_episodes=1,
                       **run_online_kwargs(cfg))
    assert bench.aggregate == "anchors"

    def by_client(calls):  # D_i names the client (500, 1000, 2000 for three clients)
        return {d: [c[1:] for c in calls if c[0] == d] for d in sorted({c[0] for c in calls})}

    app_calls, bench_calls = by_client(app_compiled), by_client(compiled)
    assert list(app_calls) == list(bench_calls) == [500, 1000, 2000]
    for d in bench_calls:  # once per round, in the app as in the bench
        assert len(app_calls[d]) == len(bench_calls[d]) == rounds_n
        for (t_app, w_app), (t_bench, w_bench) in zip(app_calls[d], bench_calls[d],
                                                      strict=True):
            np.testing.assert_allclose(t_app, t_bench, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(w_app, w_bench, rtol=1e-9, atol=1e-12)
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r["train-return-last100"] for r in bench.rounds]
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)
    # the clients act with the compiled teachers: their start values are the bench's
    np.testing.assert_allclose([r[VALUE_BIAS] for r in rounds],
                               [r["value-bias"] for r in bench.rounds], rtol=1e-9, atol=1e-9)
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


def test_app_pooled_oracle_equals_the_benchs_run_and_sends_only_statistics(tmp_path,
                                                                           monkeypatch):
    """``strategy = "pooled"`` in the app is the bench's ``run_online(aggregate="pooled")``:
    the same global readout every round (Grams summed, sweeps' right-hand sides summed and
    solved in the bench's order: bit for bit) and so the same curve; what clients send is
    Grams, counts, reward ranges and one ``phi-y`` per sweep, never their rows."""
    from fedqhd import online
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
    bench_w: list[np.ndarray] = []
    real_fit = online.pooled_fit

    def spy_fit(clients, sweeps, init=None, prior=None):
        bench_w.append(real_fit(clients, sweeps, init, prior))
        return bench_w[-1]

    monkeypatch.setattr(online, "pooled_fit", spy_fit)
    bench = run_online(n_clients=n, episodes=rounds_n * 20, greedy_episodes=1,
                       **run_online_kwargs(cfg))
    assert bench.aggregate == "pooled" and len(app_w) == len(bench_w) == rounds_n
    for w_app, w_bench in zip(app_w, bench_w, strict=True):
        np.testing.assert_array_equal(w_app, w_bench)
    assert np.abs(app_w[-1]).max() > 0
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r["train-return-last100"] for r in bench.rounds]
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)
    assert bench_curve[-1] > bench_curve[0]
    for r in rounds:  # every client pooled, 5 sweep exchanges, server-side evaluation
        assert (r[C.REPLIES_OK], r[C.CLIENTS_AVERAGED], r[C.POOLED_SWEEPS],
                r[C.POOLED_DROPPED]) == (n, n, 5, 0)
        assert np.isfinite(r[C.RETURN_MEAN])
    assert grid.reply_keys == {"train": {C.GRAM, C.ACTION_COUNTS, C.REWARD_RANGE},
                               C.POOLED_SWEEP: {C.PHI_Y}}


def test_baseline_strategies_need_fqi_online():
    with pytest.raises(ConfigError, match="'strategy' = 'none'.*'protocol' = 'online'"):
        RunConfig.from_run_config({"strategy": "none"})
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


def test_pooled_strategy_is_pooled_fit_and_drops_a_client_whose_sweep_fails():
    from fedqhd.online import pooled_fit

    clients, replies = _pooled_parties()
    init = np.random.default_rng(0).normal(scale=30.0, size=(30, 2))  # the clip binds
    got, metrics = _pooled_round(SweepGrid(clients), replies, init)
    want = pooled_fit(list(clients.values()), 3, init=init, prior=init)
    np.testing.assert_array_equal(got, want)  # the bench's arithmetic, bit for bit
    assert (metrics[C.CLIENTS_AVERAGED], metrics[C.POOLED_SWEEPS],
            metrics[C.POOLED_DROPPED]) == (3, 3, 0)
    # node 11 fails its second sweep: the round restarts without it, so the readout is
    # pooled FQI on the two others (2 exchanges lost, 3 run again)
    grid = SweepGrid(clients, fail={11: 1})
    got, metrics = _pooled_round(grid, replies, init)
    want = pooled_fit([clients[10], clients[12]], 3, init=init, prior=init)
    np.testing.assert_array_equal(got, want)
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
    from fedqhd.online import pooled_fit

    np.testing.assert_array_equal(got, pooled_fit(list(clients.values()), 3))
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_REJECTED], metrics[C.REPLIES_FAILED],
            metrics[C.CLIENTS_AVERAGED]) == (2, 3, 1, 2)


def test_pooled_needs_one_shared_encoder_and_every_client():
    base = {"protocol": "online", "strategy": "pooled"}
    with pytest.raises(ConfigError, match="'strategy' = 'pooled'.*'encoder' = 'shared'"):
        RunConfig.from_run_config({**base, "encoder": "heterogeneous"})
    with pytest.raises(ConfigError, match="'fraction-train' = 1"):
        RunConfig.from_run_config({**base, "fraction-train": 0.5})
    with pytest.raises(ConfigError, match="'hd-dim' <= the buffer's capacity"):
        RunConfig.from_run_config({**base, "online-settings": "manual", "hd-dim": 500,
                                   "online-capacity": 400})
    with pytest.raises(ConfigError, match="'strategy' = 'pooled'.*'protocol' = 'online'"):
        RunConfig.from_run_config({"strategy": "pooled"})
    cfg = RunConfig.from_run_config({**base, "env-id": "Acrobot-v1"})  # the table's D 1000
    assert cfg.resolved_strategy == "pooled" and cfg.hd_dim == 1000


def test_a_pooled_sweep_reaches_only_a_pooled_client():
    from fedqhd.learners.fqi_online import LEARNER

    cfg = RunConfig.from_run_config({"protocol": "online", "strategy": "avg"})
    with pytest.raises(ValueError, match="pooled sweep request reached a client of strategy"):
        LEARNER.pooled_sweep(None, cfg, {})


def test_app_distillation_feddqn_equals_the_benchs_run(tmp_path, monkeypatch):
    """Distillation FedDQN in the app (``learner = "dqn"``, ``strategy = "anchor"``,
    heterogeneous widths) is the bench's ``run_distill_dqn(as_nodes=True)``: the same
    anchors and teacher every round, each client's KL to it before and after its ten Adam
    steps, and the training curve. Tolerances: the teacher is the same bits (equal weights:
    the float32 replies sum exactly in float64, in any reply order); a KL is one float32
    number that XLA computes on the same shapes in both (the bench's clients padded alike,
    its distillation one client at a time), so the same bits here (rtol 1e-6 leaves room
    for rounding only: XLA's vectorised
    distillation of three clients already differs by 4e-5 after ten steps, and a skipped,
    repeated or misplaced distillation, another initial network or minibatch by far
    more); the curve (integer episode returns, mean over clients in reply order) 1e-9 as
    above. Epsilon starts at 0.2, so the clients act mostly greedily and their returns
    follow their networks. About 8 s (JAX compilation included)."""
    pytest.importorskip("jax")
    pytest.importorskip("optax")
    from fedqhd.baselines.dqn import DQNClients, run_distill_dqn
    from fedqhd.learners.dqn import DISTILL_KL_AFTER, run_distill_kwargs

    n, rounds_n, k = 3, 3, 4
    calls: list[tuple[list, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    real = DQNClients.distill

    def spy(self, states, teacher, tau=1.0, steps=10):
        before, after = real(self, states, teacher, tau, steps)
        calls.append((self.hidden, np.array(states), np.array(teacher), before, after))
        return before, after

    monkeypatch.setattr(DQNClients, "distill", spy)
    cfg = RunConfig.from_run_config({
        "protocol": "online", "learner": "dqn", "strategy": "anchor", "encoder": "heterogeneous",
        "online-settings": "manual", "episodes-per-round": k, "num-server-rounds": rounds_n,
        "epsilon-start": 0.2, "epsilon-decay": 0.9, "epsilon-floor": 0.01, "num-anchors": 50,
        "weighting": "uniform", "eval-episodes": 1, "seed": 3, "min-nodes": n,
        "output-dir": str(tmp_path)})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    rounds = json.loads((out / "results.json").read_text())["rounds"]
    app_calls, calls[:] = list(calls), []
    bench = run_distill_dqn(episodes=rounds_n * k, **run_distill_kwargs(cfg, n))
    assert bench["hidden"] == [[128, 256], [64, 128], [96, 192]]
    assert len(calls) == rounds_n and len(app_calls) == n * rounds_n  # once per round each
    for r, (hidden, anchors, teacher, before, after) in enumerate(calls):
        # the round's evaluations, in sampling order: a client's widths name it
        for a_hidden, a_anchors, a_teacher, a_before, a_after in app_calls[r * n:(r + 1) * n]:
            i = hidden.index(a_hidden[0])
            np.testing.assert_array_equal(a_anchors, anchors)
            np.testing.assert_array_equal(a_teacher, teacher)  # whatever the reply order
            np.testing.assert_allclose([a_before[0], a_after[0]], [before[i], after[i]],
                                       rtol=1e-6, atol=0)
    app_curve = [r[TRAIN_RETURN_LAST100] for r in rounds]
    bench_curve = [r["train-return-last100"] for r in bench["rounds"]]
    np.testing.assert_allclose(app_curve, bench_curve, rtol=1e-9, atol=0)
    assert len(set(bench_curve)) > 1  # the curve moves, so it says something
    for r in rounds:  # every client trained and evaluated its own network
        assert r[C.REPLIES_OK] == n and r[f"{C.EVALUATE_PREFIX}{C.REPLIES_OK}"] == n
        assert np.isfinite(r[C.RETURN_MEAN]) and r[DISTILL_KL_AFTER] > 0
