"""The strategies on mock replies (good and bad) and driven by a minimal ClientApp.

No gymnasium and no fedqhd.client here: a strategy only knows the message contract.
"""

import logging

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from messages import reply as _reply

from fedqhd.encoders import HDEncoder
from fedqhd.readout import ridge_project
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import FedQHDAnchor, FedQHDAvg, FedQHDExact
from fedqhd.strategies import contract as C


def _avg_with_shape(shape):
    return FedQHDAvg(readout_shape=shape)


def test_readout_average_equals_average_of_client_q_functions():
    rng = np.random.default_rng(0)
    enc = HDEncoder(300, 1.0, random_state=1).fit(np.zeros((1, 4)))
    readouts = [rng.normal(size=(300, 2)) for _ in range(3)]
    counts = [10, 30, 60]
    replies = [_reply(i, {C.READOUT: W}, {C.NUM_TRANSITIONS: n})
               for i, (W, n) in enumerate(zip(readouts, counts, strict=True))]
    arrays, metrics = _avg_with_shape((300, 2)).aggregate_train(1, replies)
    states = rng.normal(size=(200, 4))
    phi = enc.transform(states)
    q_mean = sum(n * (phi @ W) for W, n in zip(readouts, counts, strict=True)) / sum(counts)
    np.testing.assert_allclose(phi @ arrays[C.READOUT].numpy(), q_mean, atol=1e-10)
    assert metrics[C.REPLIES_OK] == 3 and metrics[C.NUM_TRANSITIONS] == 100


def test_uniform_weighting_on_request():
    replies = [_reply(0, {C.READOUT: np.zeros((2, 1))}, {C.NUM_TRANSITIONS: 1}),
               _reply(1, {C.READOUT: np.ones((2, 1))}, {C.NUM_TRANSITIONS: 99})]
    s = FedQHDAvg(weighting="uniform", readout_shape=(2, 1))
    arrays, _ = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays[C.READOUT].numpy(), 0.5)
    with pytest.raises(ValueError, match="weighting"):
        FedQHDAvg(weighting="by-vibes")


def test_latest_aggregate_keeps_the_replies_of_nodes_not_sampled():
    def reply(node, value, n):
        return _reply(node, {C.READOUT: np.full((2, 1), float(value))}, {C.NUM_TRANSITIONS: n})

    latest = FedQHDAvg(aggregate="latest", readout_shape=(2, 1))
    sampled = FedQHDAvg(readout_shape=(2, 1))
    for s in (latest, sampled):
        s.aggregate_train(1, [reply(1, 0.0, 10), reply(2, 4.0, 30)])
    # round 2: node 2 sits out; "latest" still counts its round-1 reply, node 3 is new
    arrays, metrics = latest.aggregate_train(2, [reply(1, 8.0, 10), reply(3, 1.0, 60)])
    np.testing.assert_allclose(arrays[C.READOUT].numpy(), (8 * 10 + 4 * 30 + 1 * 60) / 100)
    assert metrics[C.REPLIES_OK] == 2  # the round's own replies
    arrays, _ = sampled.aggregate_train(2, [reply(1, 8.0, 10), reply(3, 1.0, 60)])
    np.testing.assert_allclose(arrays[C.READOUT].numpy(), (8 * 10 + 1 * 60) / 70)
    with pytest.raises(ValueError, match="aggregate"):
        FedQHDAvg(aggregate="everything")


def test_bad_replies_are_left_out_and_counted(caplog):
    good = np.full((3, 2), 2.0)
    nan = good.copy()
    nan[0, 0] = np.nan
    replies = [
        _reply(1, {C.READOUT: good}, {C.NUM_TRANSITIONS: 5}),
        _reply(2, error="client crashed"),
        _reply(3, {C.READOUT: np.zeros((4, 2))}, {C.NUM_TRANSITIONS: 5}),   # wrong shape
        _reply(4, {C.READOUT: nan}, {C.NUM_TRANSITIONS: 5}),                # non-finite
        _reply(5, {C.READOUT: good * 0}, {C.NUM_TRANSITIONS: 0}),           # no data
        _reply(6, {"something-else": good}, {C.NUM_TRANSITIONS: 5}),        # wrong key
        _reply(7, {C.READOUT: good * 0}),                                   # no metrics
    ]
    arrays, metrics = _avg_with_shape((3, 2)).aggregate_train(3, replies)
    np.testing.assert_array_equal(arrays[C.READOUT].numpy(), good)
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_FAILED], metrics[C.REPLIES_REJECTED]) == (
        1, 1, 5)
    assert "shape (4, 2), expected (3, 2)" in caplog.text
    assert "client crashed" in caplog.text


def test_a_readout_of_another_shape_is_rejected_even_when_it_comes_first():
    replies = [_reply(1, {C.READOUT: np.zeros((4, 2))}, {C.NUM_TRANSITIONS: 5}),
               _reply(2, {C.READOUT: np.ones((3, 2))}, {C.NUM_TRANSITIONS: 5})]
    arrays, metrics = _avg_with_shape((3, 2)).aggregate_train(1, replies)
    np.testing.assert_array_equal(arrays[C.READOUT].numpy(), 1.0)
    assert (metrics[C.REPLIES_OK], metrics[C.REPLIES_REJECTED]) == (1, 1)


def test_all_replies_bad_keeps_the_previous_model():
    arrays, metrics = _avg_with_shape((3, 2)).aggregate_train(1, [_reply(1, error="boom")])
    assert arrays is None and metrics[C.REPLIES_FAILED] == 1


def test_anchor_teacher_is_weighted_mean_and_bad_shapes_are_rejected():
    anchors = np.zeros((5, 3))
    s = FedQHDAnchor(anchors, n_actions=2)
    q1, q2 = np.ones((5, 2)), 4 * np.ones((5, 2))
    replies = [_reply(1, {C.Q_ANCHORS: q1}, {C.NUM_TRANSITIONS: 3, C.PROJECTION_RESIDUAL: 0.1}),
               _reply(2, {C.Q_ANCHORS: q2}, {C.NUM_TRANSITIONS: 1, C.PROJECTION_RESIDUAL: 0.3}),
               _reply(3, {C.Q_ANCHORS: np.ones((4, 2))}, {C.NUM_TRANSITIONS: 1})]
    arrays, metrics = s.aggregate_train(1, replies)
    np.testing.assert_allclose(arrays[C.TEACHER].numpy(), 1.75)
    np.testing.assert_array_equal(arrays[C.ANCHORS].numpy(), anchors)
    assert metrics[C.PROJECTION_RESIDUAL] == pytest.approx(0.15)
    assert metrics[C.REPLIES_REJECTED] == 1
    with pytest.raises(ValueError, match="anchors"):
        FedQHDAnchor(np.zeros((0, 3)), 2)


def test_equal_weight_mean_of_float32_replies_ignores_their_order():
    """Replies arrive in sampling order; an in-process run sums in client order. With equal
    weights the mean of float32 arrays is the same bits in every order, also where it is
    near zero (the DQN baselines' Q-values and networks), so the app can equal the bench."""
    from itertools import permutations

    from fedqhd.strategies.screening import weighted_mean

    rng = np.random.default_rng(0)
    a = rng.normal(scale=0.05, size=(3, 400)).astype(np.float32)
    a[2] = -(a[0] + a[1])  # float32 sums: the means are rounding residues, near zero
    means = {weighted_mean([a[i].astype(np.float64) for i in order], np.ones(3))
             .astype(np.float32).tobytes() for order in permutations(range(3))}
    assert len(means) == 1


# ---------- driven end to end by a minimal ClientApp written here ----------

def _linear_client_app(dims: list[int], n_actions: int = 2) -> ClientApp:
    """Each client fits a fixed target Q*(s) = s @ B with its own RFF encoder, mixing in
    whatever the server sends: readout (shared) or compiled teacher (heterogeneous)."""
    app = ClientApp()
    target = np.array([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]])

    def encoder(pid: int) -> HDEncoder:
        return HDEncoder(dims[pid], 0.5, random_state=pid if len(set(dims)) > 1 else 0).fit(
            np.zeros((1, 3)))

    @app.train()
    def train(msg: Message, context) -> Message:
        pid = context.node_config["partition-id"]
        arrays = C.from_array_record(msg.content[C.ARRAYS])
        rng = np.random.default_rng(pid)
        states = rng.uniform(-1, 1, size=(50 + 50 * pid, 3))
        enc = encoder(pid)
        local, _ = ridge_project(enc.transform(states), states @ target, 1e-3)
        metrics = {C.NUM_TRANSITIONS: len(states)}
        if C.READOUT in arrays:
            out = {C.READOUT: local}
        else:
            X = enc.transform(arrays[C.ANCHORS])
            if C.TEACHER in arrays:
                compiled, metrics[C.PROJECTION_RESIDUAL] = ridge_project(
                    X, arrays[C.TEACHER], 1e-3)
                local = 0.5 * (local + compiled)
            out = {C.Q_ANCHORS: X @ local}
        return Message(RecordDict({C.ARRAYS: C.to_array_record(out),
                                   C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context) -> Message:
        pid = context.node_config["partition-id"]
        arrays = C.from_array_record(msg.content[C.ARRAYS])
        X = encoder(pid).transform(arrays[C.ANCHORS])
        W, _ = ridge_project(X, arrays[C.TEACHER], 1e-3)
        err = float(np.sqrt(np.mean((X @ W - arrays[C.ANCHORS] @ target) ** 2)))
        return Message(RecordDict({C.METRICS: MetricRecord(
            {C.NUM_TRANSITIONS: 1, "anchor-rmse": err})}), reply_to=msg)

    return app


def test_fedqhd_avg_with_a_minimal_client_app():
    grid = InProcessGrid([_linear_client_app([200, 200, 200])] * 3)
    strategy = FedQHDAvg(min_available_nodes=3)
    result = strategy.start(grid, C.to_array_record({C.READOUT: np.zeros((200, 2))}),
                            num_rounds=2)
    W = result.arrays[C.READOUT].numpy()
    states = np.random.default_rng(9).uniform(-1, 1, size=(100, 3))
    enc = HDEncoder(200, 0.5, random_state=0).fit(np.zeros((1, 3)))
    q = enc.transform(states) @ W
    truth = states @ np.array([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]])
    assert np.sqrt(np.mean((q - truth) ** 2)) < 0.1
    assert result.train_metrics_clientapp[2][C.REPLIES_OK] == 3


def test_fedqhd_anchor_with_a_minimal_client_app():
    app = _linear_client_app([100, 200, 400])
    grid = InProcessGrid([app] * 3)
    anchors = np.random.default_rng(5).uniform(-1, 1, size=(300, 3))
    strategy = FedQHDAnchor(anchors, n_actions=2, min_available_nodes=3, min_evaluate_nodes=3,
                            fraction_evaluate=1.0)
    result = strategy.start(grid, strategy.initial_arrays(), num_rounds=3)
    teacher = result.arrays[C.TEACHER].numpy()
    truth = anchors @ np.array([[1.0, -1.0], [0.5, 0.0], [0.0, 2.0]])
    assert np.sqrt(np.mean((teacher - truth) ** 2)) < 0.1
    assert result.evaluate_metrics_clientapp[3]["anchor-rmse"] < 0.1
    assert result.train_metrics_clientapp[3][C.PROJECTION_RESIDUAL] > 0


# ------------------------------------------------------------ the contract, written down
class _Grid:
    """What a strategy asks a Grid for when it samples."""

    def get_node_ids(self):
        return [1, 2, 3]


@pytest.mark.parametrize("make", [
    lambda: FedQHDAvg(), lambda: FedQHDAnchor(np.zeros((2, 3)), n_actions=2),
    lambda: FedQHDExact(4, 2, gamma=0.9, ridge=1.0)], ids=["avg", "anchor", "exact"])
def test_every_strategy_skips_evaluation_by_default_without_warning(make, caplog):
    strategy = make()
    assert "fraction_evaluate" not in caplog.text  # no Flower warning for the default
    assert strategy.fraction_evaluate == 0.0 and strategy.min_evaluate_nodes == 0
    assert strategy.configure_evaluate(1, C.to_array_record({}), ConfigRecord(), _Grid()) == []
    # what a train-only ClientApp needs: no evaluate message, so no failing round


def test_a_metric_one_client_omits_is_aggregated_over_the_others_and_reported(caplog):
    replies = [_reply(1, {C.READOUT: np.zeros((2, 1))},
                      {C.NUM_TRANSITIONS: 10, "loss": 1.0, C.PARTITION_ID: 4}),
               _reply(2, {C.READOUT: np.zeros((2, 1))},
                      {C.NUM_TRANSITIONS: 30, "loss": 3.0, C.PARTITION_ID: 5}),
               _reply(3, {C.READOUT: np.zeros((2, 1))}, {C.NUM_TRANSITIONS: 60, C.PARTITION_ID: 6})]
    _, metrics = FedQHDAvg(readout_shape=(2, 1)).aggregate_train(1, replies)
    assert metrics["loss"] == pytest.approx((10 * 1.0 + 30 * 3.0) / 40)
    assert metrics[C.METRICS_MISSING] == 1 and metrics[C.NUM_TRANSITIONS] == 100
    assert "metric 'loss' missing from 1 of 3 replies (node 3 (partition-id 6))" in caplog.text


def test_a_non_rl_evaluation_reply_with_num_examples_is_accepted():
    replies = [_reply(1, metrics={C.NUM_EXAMPLES: 20, "accuracy": 0.5}),
               _reply(2, metrics={C.NUM_EXAMPLES: 60, "accuracy": 0.9})]
    strategy = FedQHDAvg(fraction_evaluate=1.0)
    metrics = strategy.aggregate_evaluate(1, replies)
    assert metrics["accuracy"] == pytest.approx((20 * 0.5 + 60 * 0.9) / 80)
    assert metrics[f"evaluate-{C.NUM_EXAMPLES}"] == 80
    assert metrics[f"evaluate-{C.REPLIES_OK}"] == 2


def test_an_evaluation_round_with_every_reply_rejected_still_reports_its_counts():
    strategy = FedQHDAnchor(np.zeros((2, 3)), n_actions=2, fraction_evaluate=1.0)
    metrics = strategy.aggregate_evaluate(1, [_reply(1, metrics={"accuracy": 1.0}),
                                              _reply(2, error="no evaluate handler")])
    assert metrics is not None  # Flower's Result keeps the round
    assert (metrics[f"evaluate-{C.REPLIES_OK}"], metrics[f"evaluate-{C.REPLIES_REJECTED}"],
            metrics[f"evaluate-{C.REPLIES_FAILED}"]) == (0, 1, 1)


def test_an_evaluation_carried_by_train_replies_is_split_off_and_screened_as_evaluation():
    """evaluate_with_next_train, for a plug-in app: round 2's train replies carry round
    1's evaluation (``evaluated-`` metrics). Train aggregates without them; the
    evaluation is aggregated as evaluate replies would be, bad ones counted, never
    raised on: a reply without it, an error, a metrics record of the wrong type."""
    strategy = FedQHDAvg(fraction_evaluate=1.0, evaluate_with_next_train=lambda r: r < 3)
    readout = np.ones((3, 2))
    replies = [_reply(1, {C.READOUT: readout}, {C.NUM_TRANSITIONS: 10, "loss": 1.0,
                                                 "evaluated-num-examples": 20,
                                                 "evaluated-accuracy": 0.5}),
               _reply(2, {C.READOUT: 3 * readout}, {C.NUM_TRANSITIONS: 30, "loss": 3.0,
                                                     "evaluated-num-examples": 60,
                                                     "evaluated-accuracy": 0.9}),
               _reply(3, {C.READOUT: readout}, {C.NUM_TRANSITIONS: 10}),  # no evaluation
               _reply(4, error="crashed")]
    odd = _reply(5, {C.READOUT: readout})
    odd.content[C.METRICS] = ConfigRecord({"evaluated-accuracy": "high"})  # not metrics
    strategy._sampled["train"] = 5
    arrays, train = strategy.aggregate_train(2, [*replies, odd])
    assert arrays is not None and "loss" in train and "evaluated-accuracy" not in train
    assert train[C.REPLIES_OK] == 3 and train[C.REPLIES_FAILED] == 1
    assert strategy.deferred_evaluation is not None
    evaluated_round, evaluation = strategy.deferred_evaluation
    assert evaluated_round == 1 and "loss" not in evaluation
    assert evaluation["accuracy"] == pytest.approx((20 * 0.5 + 60 * 0.9) / 80)
    assert (evaluation[f"evaluate-{C.REPLIES_OK}"], evaluation[f"evaluate-{C.REPLIES_FAILED}"],
            evaluation[f"evaluate-{C.REPLIES_REJECTED}"]) == (2, 1, 2)
    # round 3's replies carry round 2's evaluation (here none: counted as rejected)
    strategy._sampled["train"] = 1
    _, train3 = strategy.aggregate_train(3, [_reply(1, {C.READOUT: readout},
                                                    {C.NUM_TRANSITIONS: 10})])
    assert train3[C.REPLIES_OK] == 1
    assert strategy.deferred_evaluation is not None
    assert strategy.deferred_evaluation[0] == 2
    assert strategy.deferred_evaluation[1][f"evaluate-{C.REPLIES_REJECTED}"] == 1


def test_an_error_reply_is_logged_with_the_partition_its_node_sent_before(caplog):
    caplog.set_level(logging.INFO, logger="flwr")  # another test may leave it at WARNING
    s = FedQHDAvg(aggregate="latest", readout_shape=(2, 1))
    s.aggregate_train(1, [_reply(1, {C.READOUT: np.ones((2, 1))},
                                 {C.NUM_TRANSITIONS: 5, C.PARTITION_ID: 3}),
                          _reply(2, {C.READOUT: np.ones((2, 1))},
                                 {C.NUM_TRANSITIONS: 5, C.PARTITION_ID: 4})])
    _, metrics = s.aggregate_train(2, [_reply(1, error="out of memory"),
                                       _reply(2, {C.READOUT: np.ones((2, 1))},
                                              {C.NUM_TRANSITIONS: 5, C.PARTITION_ID: 4})])
    assert "node 1 (partition-id 3 earlier) replied with an error: out of memory" in caplog.text
    assert "2 clients averaged (1 replied this round, 1 latest replies of earlier rounds)" \
        in caplog.text
    assert metrics[C.CLIENTS_AVERAGED] == 2
