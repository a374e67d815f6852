"""Private FedQHD (privacy = "zcdp"): chunking, sensitivity, noise, ledger, a private run."""

import itertools
import json
import math
import types

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedqhd.config import ConfigError, RunConfig
from fedqhd.encoders import HDEncoder
from fedqhd.learners.fqi_private import (
    STATE_RELEASE,
    NonPrivateFQIRefusedError,
    PrivateReadout,
    advantage,
    episode_chunks,
    private_readout,
    release_readout,
    sigma_of,
)
from fedqhd.privacy import BudgetExceededError, NumpyNoise, OpenDPNoise
from fedqhd.privacy.ledger import epsilon_exact
from fedqhd.strategies import contract as C

DIM, OBS, ACTIONS = 12, 4, 2
REWARDS = (0.0, 1.0)
GAMMA = 0.9
CHUNKS, CLIP = 4, 0.5


def _encoder(dim=DIM):
    return HDEncoder(dim, 1.0, random_state=0).fit(np.zeros((1, OBS)))


def _episode(rng, length, eid):
    return dict(observations=rng.uniform(-2, 2, size=(length, OBS)),
                next_observations=rng.uniform(-2, 2, size=(length, OBS)),
                actions=rng.integers(0, ACTIONS, length),
                rewards=rng.uniform(-1, 2, length),  # clipped into REWARDS by the client
                terminated=rng.random(length) < 0.2, episode_ids=np.full(length, eid))


def _shard(episodes):
    keys = episodes[0].keys()
    return types.SimpleNamespace(**{k: np.concatenate([e[k] for e in episodes]) for k in keys})


def _model(episodes, encoder, chunks=CHUNKS, clip=CLIP, ridge=0.05, sweeps=5, anchors=None):
    return PrivateReadout(_shard(episodes), encoder.encode, ACTIONS, GAMMA, ridge, REWARDS,
                          chunks, clip, sweeps,
                          None if anchors is None else encoder.encode(anchors))


def test_an_episode_s_chunk_depends_on_that_episode_only():
    rng = np.random.default_rng(0)
    base = [_episode(rng, int(rng.integers(1, 20)), i) for i in range(30)]
    extra = _episode(rng, 7, -1)  # a new first id: ranks and positions of the others move
    before = episode_chunks(_shard(base), 5)
    after = episode_chunks(_shard([base[0], extra, *base[1:]]), 5)
    np.testing.assert_array_equal(np.delete(after, np.arange(len(base[0]["actions"]),
                                                             len(base[0]["actions"]) + 7)),
                                  before)
    assert len(np.unique(before)) == 5  # 30 episodes reach every chunk


@pytest.mark.parametrize("n_anchors", [None, 30])
def test_one_trajectory_moves_the_release_by_at_most_the_sensitivity(n_anchors):
    """Add/remove one episode, over many random neighbouring shards: the released mean
    (a readout, or the advantages on M anchors) moves by at most Delta = 2R/m (2R sqrt(M)/m
    on anchors); random neighbours come close to it (the clip binds)."""
    rng = np.random.default_rng(1)
    enc = _encoder()
    anchors = None if n_anchors is None else rng.uniform(-2, 2, size=(n_anchors, OBS))
    bound = CLIP * math.sqrt(n_anchors or 1)
    shape = (DIM, ACTIONS) if anchors is None else (n_anchors, ACTIONS)
    worst = 0.0
    for trial in range(60):
        base = [_episode(rng, int(rng.integers(1, 25)), i)
                for i in range(int(rng.integers(0, 12)))]
        extra = _episode(rng, int(rng.integers(1, 40)), 1000 + trial)
        small = _model(base, enc, anchors=anchors) if base else None
        big = _model([*base, extra], enc, anchors=anchors)
        assert big.sensitivity == pytest.approx(2 * bound / CHUNKS)
        r0 = small.readout() if small is not None else np.zeros(shape)
        assert big.readout().shape == shape
        moved = float(np.linalg.norm(big.readout() - r0))
        assert moved <= big.sensitivity * (1 + 1e-9)
        worst = max(worst, moved / big.sensitivity)
        norms = [np.linalg.norm(big.chunk_readout(j)) for j in range(CHUNKS)]
        assert max(norms) <= bound * (1 + 1e-9)
    assert worst > 0.5


def test_anchor_release_is_the_chunks_advantages_on_the_anchors():
    """Unclipped (a huge R), the anchor release is the mean over chunks of each chunk
    readout's Q-values on the anchors, centred over actions."""
    rng = np.random.default_rng(11)
    enc, anchors = _encoder(), rng.uniform(-2, 2, size=(9, OBS))
    episodes = [_episode(rng, 8, i) for i in range(12)]
    model = _model(episodes, enc, clip=1e9, anchors=anchors)
    q = [enc.encode(anchors) @ model.chunk_fit(j) for j in range(CHUNKS)]
    np.testing.assert_allclose(model.readout(),
                               np.mean([a - a.mean(1, keepdims=True) for a in q], 0))


@pytest.mark.parametrize("dim", [6, 60])
def test_each_chunk_fit_is_ridge_fqi(dim):
    """Whichever of the two ridge solves a chunk uses (fewer rows than features: the dual
    one), its fit is the primal ridge FQI iterate, sweep for sweep."""
    rng = np.random.default_rng(12)
    enc = _encoder(dim)
    model = _model([_episode(rng, 6, i) for i in range(10)], enc, chunks=2, ridge=0.3,
                   sweeps=4)
    lo, hi = REWARDS[0] / (1 - GAMMA), REWARDS[1] / (1 - GAMMA)
    for j in range(2):
        rows = model.chunk == j
        x, xn = model.features[rows], model.next_features[rows]
        acts, r, cont = model.actions[rows], model.rewards[rows], model.continues[rows]
        w = np.zeros((dim, ACTIONS))
        for _ in range(4):
            y = np.clip(r + GAMMA * cont * np.clip((xn @ w).max(1), lo, hi), lo, hi)
            for a in range(ACTIONS):
                xa = x[acts == a]
                w[:, a] = np.linalg.solve(xa.T @ xa + 0.3 * np.eye(dim), xa.T @ y[acts == a])
        np.testing.assert_allclose(model.chunk_fit(j), w, rtol=1e-7, atol=1e-9)


def test_advantage_readout_keeps_the_greedy_policy():
    rng = np.random.default_rng(2)
    w, phi = rng.normal(size=(DIM, 3)), rng.normal(size=(200, DIM))
    np.testing.assert_array_equal(np.argmax(phi @ w, 1), np.argmax(phi @ advantage(w), 1))


def test_released_noise_has_the_claimed_variance():
    """A release without noise (or with less) fails this."""
    rng = np.random.default_rng(3)
    model = _model([_episode(rng, 10, i) for i in range(8)], _encoder(8))
    clean = model.readout()
    source, rho, draws = NumpyNoise(7), 0.3, 3000
    noise = np.stack([release_readout(model, rho, source, None) for _ in range(draws)]) - clean
    sigma = sigma_of(model.sensitivity, rho)
    assert abs(noise.var(axis=0).mean() / sigma ** 2 - 1) < 4 * math.sqrt(2 / draws)
    assert np.abs(noise.mean(axis=0)).max() < 5 * sigma / math.sqrt(draws)


def test_opendp_release_is_noisy_and_certified():
    rng = np.random.default_rng(4)
    model = _model([_episode(rng, 10, i) for i in range(5)], _encoder(8))
    draws = np.stack([release_readout(model, 0.5, OpenDPNoise(), None)
                      for _ in range(40)]) - model.readout()
    assert 0.7 < draws.std() / sigma_of(model.sensitivity, 0.5) < 1.3


class _CountingNoise(NumpyNoise):
    draws = 0

    def add_noise(self, values, sigma):
        type(self).draws += 1
        return super().add_noise(values, sigma)

    add_real_noise = add_noise


def _context(state, node):
    return Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1,
                                                    **node},
                   state=state, run_config={})


def test_ledger_gets_the_release_once_and_refuses_beyond_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("fedqhd.learners.fqi_private.make_noise_source",
                        lambda kind, random_state=None: _CountingNoise())
    rng = np.random.default_rng(5)
    model = _model([_episode(rng, 10, i) for i in range(6)], _encoder(8))
    cfg = RunConfig(privacy="zcdp", privacy_rho=0.8, num_server_rounds=4, hd_dim=8)
    node = {"ledger-dir": str(tmp_path), "noise": "numpy", "rho-budget": 2.0}
    state = RecordDict()
    replies = [private_readout(_context(state, node), cfg, model, 0) for _ in range(4)]
    for arrays, _ in replies[1:]:  # later rounds resend the one release: no new spend
        np.testing.assert_array_equal(arrays[C.READOUT], replies[0][0][C.READOUT])
    assert _CountingNoise.draws == 1 and STATE_RELEASE in state
    ledger = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [e["label"] for e in ledger["entries"]] == ["fqi-readout"]
    assert ledger["rho_spent"] == pytest.approx(0.8)
    metrics = replies[-1][1]
    assert metrics[C.RHO_SPENT] == pytest.approx(0.8) and metrics[C.PRIVATE] == 1
    assert metrics[C.EPSILON] == pytest.approx(ledger["epsilon"])
    assert metrics[C.NUM_TRANSITIONS] == 1  # claims no size
    assert not np.allclose(replies[0][0][C.READOUT], model.readout())
    # a second run of the same shard (0.8 more) reaches 1.6 <= 2: allowed; a third not,
    # refused before any noise is drawn
    private_readout(_context(RecordDict(), node), cfg, model, 0)
    before = _CountingNoise.draws
    with pytest.raises(BudgetExceededError, match="refused"):
        private_readout(_context(RecordDict(), node), cfg, model, 0)
    assert _CountingNoise.draws == before
    # the node's per-release cap lowers the release (more privacy, never less)
    capped = {**node, "rho": 0.05, "ledger-dir": str(tmp_path / "capped")}
    _, metrics = private_readout(_context(RecordDict(), capped), cfg, model, 0)
    assert metrics[C.RHO_SPENT] == pytest.approx(0.05)


def test_noise_off_needs_a_run_marked_non_private(tmp_path):
    rng = np.random.default_rng(6)
    model = _model([_episode(rng, 10, i) for i in range(3)], _encoder(8))
    node = {"ledger-dir": str(tmp_path), "noise": "none"}
    cfg = RunConfig(privacy="zcdp", hd_dim=8)
    with pytest.raises(NonPrivateFQIRefusedError):
        private_readout(_context(RecordDict(), node), cfg, model, 0)
    arrays, metrics = private_readout(_context(RecordDict(), node),
                                      cfg.replace(non_private=True), model, 0)
    assert metrics[C.PRIVATE] == 0
    np.testing.assert_allclose(arrays[C.READOUT], model.readout())


def test_config():
    with pytest.raises(ConfigError, match="privacy"):
        RunConfig(privacy="zcdp", strategy="exact")
    with pytest.raises(ConfigError, match="use 'anchor'"):
        RunConfig(privacy="zcdp", encoder="heterogeneous", strategy="avg")
    with pytest.raises(ConfigError, match="'strategy' = 'avg'"):
        RunConfig(privacy="zcdp", strategy="anchor")
    with pytest.raises(ConfigError, match="'learner' = 'fqi'"):
        RunConfig(privacy="zcdp", learner="dqn", protocol="online")
    assert RunConfig(privacy="zcdp", protocol="online", preset="manual").privacy == "zcdp"
    assert RunConfig(privacy="zcdp").resolved_strategy == "avg"
    assert RunConfig(privacy="zcdp", encoder="heterogeneous").resolved_strategy == "anchor"


def test_heterogeneous_evaluation_claims_no_size_and_uses_no_data(tmp_path):
    """A private heterogeneous client's evaluation reply: the compiled teacher's return, the
    same whatever its shard (two partitions' shards, the same encoder seed), size 1."""
    from fedqhd.learners.fqi import LEARNER, client_encoder

    cfg = RunConfig(privacy="zcdp", encoder="heterogeneous", episodes_per_client=3,
                    eval_episodes=2, output_dir=str(tmp_path))
    anchors = np.random.default_rng(13).uniform(-0.2, 0.2, size=(40, 4))
    teacher = client_encoder(cfg, 0).encode(anchors) @ np.random.default_rng(14).normal(
        size=(client_encoder(cfg, 0).encode(anchors).shape[1], 2))
    got = []
    for episodes, noise in ((3, "numpy"), (9, "numpy"), (3, "none")):
        context = Context(run_id=1, node_id=1, node_config={
            "partition-id": 0, "num-partitions": 2, "noise": noise},
            state=RecordDict(), run_config={})
        got.append(LEARNER.evaluate(context, cfg.replace(episodes_per_client=episodes),
                                    {C.ANCHORS: anchors, C.TEACHER: teacher}))
    assert got[0][C.NUM_TRANSITIONS] == got[1][C.NUM_TRANSITIONS] == 1
    assert got[0][C.RETURN_MEAN] == got[1][C.RETURN_MEAN]
    assert (got[0][C.PRIVATE], got[2][C.PRIVATE]) == (1, 0)


@pytest.mark.slow
@pytest.mark.parametrize("keys", [
    {"episodes-per-client": 500, "privacy-chunks": 50},
    {"encoder": "heterogeneous", "episodes-per-client": 200, "privacy-chunks": 20,
     "num-anchors": 200},
    {"protocol": "online", "preset": "manual", "num-server-rounds": 3,
     "episodes-per-round": 200, "privacy-chunks": 20}],
    ids=["shared", "heterogeneous", "online"])
def test_private_run_learns_and_reports_the_accountants_epsilon(tmp_path, monkeypatch, keys):
    """In process, CartPole offline shards, epsilon 8 at delta 1e-5 (one fixed noise draw): the
    private run's greedy policy beats uniform random, and every client's reported epsilon
    is the accountant's for the rho the run spent; shared encoder (a readout released),
    heterogeneous ones (advantages on the anchors), and online (a release a round, each
    at a third of the rho)."""
    from benchmarks.private_fedqhd import SETTING, rho_for_epsilon
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    monkeypatch.setenv("FEDQHD_LEDGER_DIR", str(tmp_path / "ledgers"))
    draws = itertools.count()

    def fixed_noise(kind, random_state=None):
        """Test double: numpy noise from a counter-seeded stream, so the run is
        deterministic; labelled as numpy noise of fresh entropy (exact-Gaussian epsilon)."""
        noise = NumpyNoise(np.random.default_rng([2026, next(draws)]))
        noise.reproducible, noise.label = False, "numpy-fresh-entropy (NOT secure)"
        return noise

    monkeypatch.setattr("fedqhd.learners.fqi_private.make_noise_source", fixed_noise)
    rho = rho_for_epsilon(8.0, 1e-5, "numpy")
    cfg = RunConfig.from_run_config({**SETTING, **keys, "seed": 0, "privacy": "zcdp",
                                     "privacy-rho": rho, "output-dir": str(tmp_path)})
    node = {"rho": 10.0, "rho-budget": 10.0}
    grid = InProcessGrid([client_app] * 5, run_config=cfg.to_run_config(),
                         node_configs=[dict(node) for _ in range(5)])
    final, _ = run_federation(grid, cfg)
    assert final["status"] == "completed"
    assert final["return-mean"] > final["reference"]["random-mean"]
    ledgers = final["privacy-ledgers"]
    assert len(ledgers) == 5
    for entry in ledgers.values():
        assert entry["private"]
        assert entry["rho-spent"] == pytest.approx(rho)
        assert entry["epsilon"] == pytest.approx(epsilon_exact(rho, 1e-5))
        assert entry["epsilon"] == pytest.approx(8.0, abs=1e-3)


def test_online_client_keeps_every_episode_and_spends_a_share_of_rho_a_round(tmp_path):
    """Each round the node's episode store grows by episodes-per-round whole episodes
    (ids continue, none dropped), one ledger entry of rho / rounds is charged, the release
    changes with the data and noise, and a run of the same seed counts against the same
    ledger (its budget refuses a second run beyond it)."""
    from fedqhd.learners.fqi_online import STATE_PRIVATE_EPISODES, private_online_train

    cfg = RunConfig(privacy="zcdp", protocol="online", preset="manual", num_server_rounds=3,
                    episodes_per_round=6, privacy_chunks=3, hd_dim=8, privacy_rho=0.6,
                    output_dir=str(tmp_path))
    node = {"ledger-dir": str(tmp_path / "ledgers"), "noise": "numpy", "rho-budget": 1.0}
    state = RecordDict()
    arrays = {C.READOUT: np.zeros((8, 2))}
    releases = []
    for r in range(3):
        reply, metrics = private_online_train(_context(state, node), cfg, arrays)
        releases.append(reply[C.READOUT])
        kept = state[STATE_PRIVATE_EPISODES]
        ids = kept["episode_ids"].numpy()
        assert np.array_equal(np.unique(ids), np.arange(6 * (r + 1)))
        assert kept["observations"].numpy().shape[0] == len(ids)
        assert metrics[C.RHO_SPENT] == pytest.approx(0.2 * (r + 1))
        assert metrics[C.NUM_TRANSITIONS] == 1 and metrics[C.PRIVATE] == 1
        arrays = {C.READOUT: reply[C.READOUT]}
    assert not np.allclose(releases[1], releases[2])
    first, last = (kept["observations"].numpy()[ids == i][0] for i in (0, 12))
    assert not np.array_equal(first, last)  # each round collects new episodes (its own seed)
    ledger = json.loads(next((tmp_path / "ledgers").glob("*.json")).read_text())
    assert [e["rho"] for e in ledger["entries"]] == pytest.approx([0.2, 0.2, 0.2])
    private_online_train(_context(RecordDict(), node), cfg, {C.READOUT: np.zeros((8, 2))})
    private_online_train(_context(RecordDict(), node), cfg, {C.READOUT: np.zeros((8, 2))})
    with pytest.raises(BudgetExceededError):  # 0.6 + 0.4 spent; 0.2 more exceeds 1.0
        private_online_train(_context(RecordDict(), node), cfg, {C.READOUT: np.zeros((8, 2))})


def test_online_heterogeneous_client_releases_anchor_values_and_acts_with_the_teacher(
        tmp_path, monkeypatch):
    """With its own encoder a private online client replies noisy advantages on the anchors
    the server sent, and acts with the teacher compiled into its features (greedy here:
    epsilon 0), not with anything fitted to its data."""
    from fedqhd.learners.fqi_online import STATE_PRIVATE_EPISODES, private_online_train

    monkeypatch.setattr("fedqhd.learners.fqi_online.epsilon_schedule",
                        lambda *a: lambda rounds: np.zeros_like(rounds, dtype=float))
    cfg = RunConfig(privacy="zcdp", protocol="online", preset="manual", encoder="heterogeneous",
                    num_server_rounds=2, episodes_per_round=4, privacy_chunks=2,
                    output_dir=str(tmp_path))
    node = {"ledger-dir": str(tmp_path / "ledgers"), "noise": "numpy"}
    anchors = np.random.default_rng(15).uniform(-0.3, 0.3, size=(40, 4))
    for prefer in (0, 1):  # a teacher preferring one action everywhere
        state = RecordDict()
        teacher = np.zeros((40, 2))
        teacher[:, prefer] = 1.0
        reply, metrics = private_online_train(_context(state, node), cfg,
                                              {C.ANCHORS: anchors, C.TEACHER: teacher})
        assert reply[C.Q_ANCHORS].shape == (40, 2) and C.READOUT not in reply
        assert metrics[C.PRIVATE] == 1
        actions = state[STATE_PRIVATE_EPISODES]["actions"].numpy()
        assert np.mean(actions == prefer) > 0.9
