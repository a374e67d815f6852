"""Streaming ridge FQI equals the in-memory fit; FedQHDExact equals centralised FQI."""

import dataclasses
import json

import numpy as np
import pytest

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.data import client_shard, pooled, save_shard
from fedqhd.data.partition import shard_filename
from fedqhd.encoders import HDEncoder, shared_encoder_params
from fedqhd.envs import get_spec
from fedqhd.gram import is_symmetric
from fedqhd.learners.fqi import FQILearner
from fedqhd.readout import (
    RidgeFQI,
    StreamingRidgeFQI,
    chunked_grams,
    distinct_state_count,
    pooled_value_range,
)
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C


def _data(n, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    nxt = rng.normal(size=(n, 4)).astype(np.float32)
    return obs, rng.integers(0, 3, n), rng.normal(size=n), nxt, rng.random(n) < 0.1


@pytest.mark.parametrize("n", [40, 700])  # per action: dual (n_a < D) and primal systems
@pytest.mark.parametrize("proximal", [0.0, 0.5])
@pytest.mark.parametrize("bound", ["data", None])
def test_streaming_fit_equals_the_in_memory_fit(n, proximal, bound):
    obs, act, rew, nxt, term = _data(n)
    enc = HDEncoder(60, 1.0, random_state=0).fit(np.zeros((1, 4)))
    ref = RidgeFQI(enc.encode(obs), act, rew, enc.encode(nxt), term, 3, gamma=0.9, ridge=0.1,
                   proximal=proximal, value_range=bound)
    stream = StreamingRidgeFQI(enc.encode, 60, 3, gamma=0.9, ridge=0.1, proximal=proximal,
                               value_range=bound, chunk_size=16)
    half = n // 2  # data added in two parts (a Gram updated as data grow)
    stream.add(obs[:half], act[:half], rew[:half], nxt[:half], term[:half])
    stream.add(obs[half:], act[half:], rew[half:], nxt[half:], term[half:])
    assert stream.q_range_ == ref.q_range_
    w0 = np.random.default_rng(1).normal(size=(60, 3))
    res_ref, res_stream = ref.fit(6, init=w0), stream.fit(6, init=w0)
    scale = np.abs(ref.readout_).max()
    np.testing.assert_allclose(stream.readout_, ref.readout_, rtol=0, atol=1e-8 * scale)
    np.testing.assert_allclose(res_stream.bellman_residuals, res_ref.bellman_residuals,
                               rtol=1e-6)
    np.testing.assert_allclose(stream.grams(), ref.grams(), rtol=0, atol=1e-10 * n)
    np.testing.assert_allclose(stream.rhs(w0, (-2.0, 2.0)), ref.rhs(w0, (-2.0, 2.0)),
                               rtol=0, atol=1e-10 * n)
    np.testing.assert_allclose(stream.targets(w0), ref.targets(w0), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(stream.action_counts, ref.action_counts)
    np.testing.assert_array_equal(stream.reward_extremes, ref.reward_extremes)
    np.testing.assert_allclose(chunked_grams(enc.encode, obs, act, 3, 60, 7), ref.grams(),
                               rtol=0, atol=1e-10 * n)
    # float32 feature cache: close, not exact
    cached = StreamingRidgeFQI(enc.encode, 60, 3, gamma=0.9, ridge=0.1, proximal=proximal,
                               value_range=bound, chunk_size=16, cache="float32")
    cached.add(obs, act, rew, nxt, term)
    cached.fit(6, init=w0)
    np.testing.assert_allclose(cached.readout_, ref.readout_, rtol=0, atol=1e-4 * scale)


def test_learner_streams_when_features_exceed_its_budget():
    cfg = RunConfig(hd_dim=80, episodes_per_client=2)
    spec = get_spec(cfg.env_id)
    shard = client_shard(cfg.env_id, cfg.partition, 0, 2, 2, cfg.seed)
    enc = shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth).build(spec.obs_bound)
    memory = FQILearner(shard, enc, spec.n_actions, cfg.gamma, 0.1, proximal=0.3)
    # the in-memory features: one float64 row per distinct state (n + episodes here)
    table = distinct_state_count(shard.observations, shard.next_observations) * 80 * 8
    assert table < 2 * shard.n_transitions * 80 * 8
    small = FQILearner(shard, enc, spec.n_actions, cfg.gamma, 0.1, proximal=0.3,
                       feature_budget=table - 1)
    assert isinstance(FQILearner(shard, enc, spec.n_actions, feature_budget=table).fqi, RidgeFQI)
    assert isinstance(memory.fqi, RidgeFQI) and isinstance(small.fqi, StreamingRidgeFQI)
    start = np.full((80, spec.n_actions), 0.5)
    memory.train(4, start=start)
    small.train(4, start=start)
    np.testing.assert_allclose(small.readout, memory.readout, rtol=0,
                               atol=1e-8 * np.abs(memory.readout).max())


class _RecordingGrid(InProcessGrid):
    """Remembers the array keys of every train reply, per round."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reply_keys: list[list[set[str]]] = []

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        self.reply_keys.append([set(r.content[C.ARRAYS].keys()) for r in replies
                                if not r.has_error() and C.ARRAYS in r.content])
        return replies


def test_exact_strategy_equals_centralised_fqi_on_the_pooled_shards(tmp_path):
    """Through the real ServerApp and ClientApps: k rounds = k sweeps of ridge FQI on the
    pooled data (bounded by the pooled value range), the Gram sent once."""
    n_clients = 3
    cfg = RunConfig(hd_dim=120, episodes_per_client=3, strategy="exact", num_server_rounds=4,
                    eval_episodes=1, ridge=0.1, gamma=0.99, data_dir=str(tmp_path / "data"),
                    output_dir=str(tmp_path / "out"))
    spec = get_spec(cfg.env_id)
    # clients whose rewards differ (so their own value ranges differ from the pooled one)
    shards = []
    for i, (scale, shift) in enumerate([(1.0, 0.0), (2.0, 0.0), (0.5, -1.5)]):
        shard = client_shard(cfg.env_id, cfg.partition, i, n_clients, cfg.episodes_per_client,
                             cfg.seed)
        shard = dataclasses.replace(shard, rewards=(shard.rewards * scale + shift)
                                    .astype(np.float32))
        save_shard(shard, tmp_path / "data" / shard_filename(i))
        shards.append(shard)
    grid = _RecordingGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    _, out_dir = run_federation(grid, cfg)
    federated = np.load(out_dir / "final_model.npz")["readout"]

    rewards = [np.unique(s.rewards) for s in shards]
    assert len({tuple(r) for r in rewards}) > 1  # the clients' value ranges differ
    enc = shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth).build(spec.obs_bound)
    data = pooled(shards)
    ref = FQILearner(data, enc, spec.n_actions, cfg.gamma, cfg.ridge, proximal=0.0)
    assert ref.fqi.q_range_ == pooled_value_range([r[[0, -1]] for r in rewards], cfg.gamma)
    ref.train(cfg.num_server_rounds, start=np.zeros_like(federated))
    error = np.abs(federated - ref.readout).max() / np.abs(ref.readout).max()
    assert error < 1e-8
    # the Gram goes once (round 1), phi-y every round
    assert all(C.GRAM in keys for keys in grid.reply_keys[0])
    assert all(C.GRAM not in keys and C.PHI_Y in keys
               for round_keys in grid.reply_keys[1:] for keys in round_keys)


def test_exact_needs_a_shared_encoder_every_client_and_the_fqi_learner():
    with pytest.raises(ConfigError, match="'encoder' = 'shared'"):
        RunConfig(strategy="exact", encoder="heterogeneous")
    with pytest.raises(ConfigError, match="fraction-train"):
        RunConfig(strategy="exact", fraction_train=0.5)
    with pytest.raises(ConfigError, match="'protocol' = 'offline'"):
        RunConfig(strategy="exact", protocol="online")
    assert RunConfig(strategy="exact").resolved_strategy == "exact"


@pytest.mark.parametrize("dim", [5, 300])  # 300: blocks of 128 on and off the diagonal
def test_packed_gram_round_trips(dim):
    g = np.random.default_rng(0).normal(size=(2, dim, dim))
    g = g + g.transpose(0, 2, 1)
    packed = C.pack_upper(g)
    assert packed.shape == (2, dim * (dim + 1) // 2)
    np.testing.assert_array_equal(C.unpack_upper(packed, dim), g)
    out = np.full((2, dim, dim), np.nan, dtype=np.float32)  # into a float32 buffer
    np.testing.assert_array_equal(C.unpack_upper(packed.astype(np.float32), dim, out=out),
                                  g.astype(np.float32))
    assert all(is_symmetric(m) for m in g)
    for i, j in ((0, dim - 1), (dim - 1, 1), (dim // 2, dim // 2 + 1)):
        skew = g[0].copy()
        skew[i, j] = np.nextafter(skew[i, j], np.inf)  # one ulp off, in any block
        assert not is_symmetric(skew)


def _lying_app(alter):
    """A ClientApp that computes honest statistics and replies ``alter(arrays, metrics)``."""
    from flwr.app import Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg, context):
        reply = client_app(msg, context)
        arrays = C.from_array_record(reply.content[C.ARRAYS])
        arrays, metrics = alter(arrays, dict(reply.content[C.METRICS].items()))
        return Message(RecordDict({C.ARRAYS: C.to_array_record(arrays),
                                   C.METRICS: MetricRecord(metrics)}), reply_to=msg)

    return app


def _scaled(key, factor):
    return lambda arrays, metrics: ({**arrays, key: arrays[key] * factor}
                                    if key in arrays else arrays, metrics)


def _claim(arrays, metrics):
    counts = arrays[C.ACTION_COUNTS] * 1e10  # consistent counts, same Gram
    return ({**arrays, C.ACTION_COUNTS: counts},
            {**metrics, C.NUM_TRANSITIONS: counts.sum(), C.GRAM_THROUGH: counts.sum()})


@pytest.mark.parametrize("alter", [_scaled(C.PHI_Y, 1e8), _scaled(C.GRAM, 1e8),
                                   _scaled(C.PHI_Y, -1e3), _claim],
                         ids=["phi-y x 1e8", "gram x 1e8", "phi-y x -1e3", "claim 1e12"])
def test_exact_refuses_statistics_inconsistent_with_themselves(tmp_path, alter, caplog):
    """A third client lies every round; it is refused (named by its partition id), and
    the global readout is exact pooled FQI on the two honest clients' shards."""
    # mutation checked: _screen_statistics returning [None] * n lets every lie through
    # (the readout is then far from the honest pooled fit); dropping the claim cap lets
    # the 1e12 claim through
    cfg = RunConfig(hd_dim=120, episodes_per_client=3, strategy="exact", num_server_rounds=3,
                    eval_episodes=1, output_dir=str(tmp_path / "out"))
    grid = InProcessGrid([client_app, client_app, _lying_app(alter)],
                         run_config=cfg.to_run_config())
    _, out_dir = run_federation(grid, cfg)
    federated = np.load(out_dir / "final_model.npz")["readout"]
    rows = [json.loads(line) for line in (out_dir / "rounds.jsonl").read_text().splitlines()]
    assert all(r[C.REPLIES_OK] == 2 and r[C.REPLIES_REJECTED] == 1 for r in rows)
    assert "(partition-id 2)" in caplog.text
    spec = get_spec(cfg.env_id)
    shards = [client_shard(cfg.env_id, cfg.partition, i, 3, cfg.episodes_per_client, cfg.seed)
              for i in range(2)]
    enc = shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth).build(spec.obs_bound)
    ref = FQILearner(pooled(shards), enc, spec.n_actions, cfg.gamma, cfg.ridge, proximal=0.0)
    ref.train(cfg.num_server_rounds, start=np.zeros_like(federated))
    assert np.abs(federated - ref.readout).max() / np.abs(ref.readout).max() < 1e-8
