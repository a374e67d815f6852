"""Private FedQHD (privacy = "zcdp"): sensitivity, noise, ledger, and a private run."""

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
    FEATURE_NORM,
    STATE_GRAM,
    NonPrivateFQIRefusedError,
    PrivateStatistics,
    ReleasePlan,
    iso_pack,
    iso_to_plain,
    private_statistics,
    release_gram,
    release_rhs,
    sigma_of,
)
from fedqhd.node_config import NodeSettings
from fedqhd.privacy import BudgetExceededError, NumpyNoise, OpenDPNoise
from fedqhd.privacy.ledger import epsilon_exact
from fedqhd.strategies import contract as C
from fedqhd.strategies.private_exact import psd_projection

DIM, OBS, ACTIONS, L = 24, 4, 2, 6
REWARDS = (0.0, 1.0)
GAMMA = 0.9  # value range [0, 10]: Y = 10


def _encoder(dim=DIM):
    return HDEncoder(dim, 1.0, random_state=0).fit(np.zeros((1, OBS)))


def _episode(rng, length, eid, state=None, action=None):
    obs = (np.repeat(state[None], length, 0) if state is not None
           else rng.uniform(-2, 2, size=(length, OBS)))
    return dict(observations=obs, next_observations=rng.uniform(-2, 2, size=(length, OBS)),
                actions=(np.full(length, action) if action is not None
                         else rng.integers(0, ACTIONS, length)),
                rewards=rng.uniform(-1, 2, length),  # clipped into REWARDS by the client
                terminated=rng.random(length) < 0.2, episode_ids=np.full(length, eid))


def _shard(episodes):
    keys = episodes[0].keys()
    return types.SimpleNamespace(**{k: np.concatenate([e[k] for e in episodes]) for k in keys})


def _stats(episodes, encoder):
    return PrivateStatistics(_shard(episodes), encoder.encode, ACTIONS, GAMMA, REWARDS, L)


def test_features_need_clipping_and_norm_bound_holds():
    enc = _encoder(64)
    phi = enc.encode(np.random.default_rng(0).uniform(-3, 3, size=(2000, OBS)))
    sq = (phi ** 2).sum(axis=1)
    assert sq.max() <= 2.0 + 1e-12 and sq.max() > 1.0  # ||phi||^2 <= 2, not <= 1: clip
    stats = _stats([_episode(np.random.default_rng(1), 30, 0)], enc)
    assert np.linalg.norm(stats.features, axis=1).max() <= FEATURE_NORM + 1e-12


def test_one_trajectory_moves_the_statistics_by_at_most_the_sensitivity():
    """Add/remove one episode, over many random episodes (lengths below and above L):
    the isometric Gram and phi-y move by at most Delta_G = L and Delta_y = L Y."""
    rng = np.random.default_rng(0)
    enc = _encoder()
    base = [_episode(rng, int(rng.integers(1, 3 * L)), i) for i in range(12)]
    stats = _stats(base, enc)
    readout = rng.normal(scale=30.0, size=(DIM, ACTIONS))  # targets hit both range ends
    g0, b0 = iso_pack(stats.grams()), stats.rhs(readout)
    worst_g = worst_b = 0.0
    for k in range(300):
        extra = _episode(rng, int(rng.integers(1, 4 * L)), 100 + k)
        other = _stats([*base, extra], enc)
        assert other.gram_sensitivity == L
        assert other.rhs_sensitivity == pytest.approx(L * 10.0)
        dg = np.linalg.norm(iso_pack(other.grams()) - g0)
        db = np.linalg.norm(other.rhs(readout) - b0)
        assert dg <= other.gram_sensitivity * (1 + 1e-9)
        assert db <= other.rhs_sensitivity * (1 + 1e-9)
        worst_g, worst_b = max(worst_g, dg / L), max(worst_b, db / other.rhs_sensitivity)
    assert worst_g > 0.3 and worst_b > 0.1  # random episodes come within a few x of it
    # the worst case: L transitions at one state with ||phi|| >= 1, one action, y = hi
    states = rng.uniform(-2, 2, size=(500, OBS))
    state = states[np.argmax(np.linalg.norm(enc.encode(states), axis=1))]
    tight = _episode(rng, L, 999, state=state, action=0)
    tight["rewards"][:] = 1.0
    tight["terminated"][:] = False
    other = _stats([*base, tight], enc)
    up = np.abs(readout).max() * 1e3 * np.ones((DIM, ACTIONS)) * np.sign(enc.encode(
        tight["next_observations"]).sum(0))[:, None]  # next values far above the range
    dg = np.linalg.norm(iso_pack(other.grams()) - g0)
    db = np.linalg.norm(other.rhs(up) - stats.rhs(up))
    assert 0.999 * L <= dg <= L * (1 + 1e-9)
    assert 0.999 * other.rhs_sensitivity <= db <= other.rhs_sensitivity * (1 + 1e-9)


def test_iso_packing_is_an_isometry_and_round_trips():
    m = np.random.default_rng(0).normal(size=(2, 5, 5))
    m = m + m.transpose(0, 2, 1)
    assert np.isclose(np.linalg.norm(iso_pack(m)), np.linalg.norm(m))
    np.testing.assert_allclose(iso_to_plain(iso_pack(m), 5), C.pack_upper(m))


@pytest.mark.parametrize("noisy", [True])
def test_released_noise_has_the_claimed_variance(noisy):
    """Diagonal entries of the Gram get sigma_G^2, off-diagonal ones sigma_G^2 / 2 (the
    isometric packing), phi-y sigma_y^2; a release without noise fails this."""
    rng = np.random.default_rng(3)
    stats = _stats([_episode(rng, 10, i) for i in range(5)], _encoder(8))
    readout = rng.normal(size=(8, ACTIONS))
    clean_g, clean_b = C.pack_upper(stats.grams()), stats.rhs(readout)
    source = NumpyNoise(7)
    rho_g, rho_b = 0.3, 0.05
    draws = 4000
    g = np.stack([release_gram(stats, rho_g, source, None) for _ in range(draws)]) - clean_g
    b = np.stack([release_rhs(stats, readout, rho_b, source, None, 1)
                  for _ in range(draws)]) - clean_b
    sg, sb = sigma_of(L, rho_g), sigma_of(L * 10.0, rho_b)
    diag = np.zeros(g.shape[-1], dtype=bool)
    i = np.arange(8)
    diag[i * 8 - i * (i - 1) // 2] = True
    tol = 4 * math.sqrt(2 / draws)  # 4 standard errors of a variance ratio
    assert abs(g[..., diag].var(axis=0).mean() / sg ** 2 - 1) < tol
    assert abs(g[..., ~diag].var(axis=0).mean() / (sg ** 2 / 2) - 1) < tol
    assert abs(b.var(axis=0).mean() / sb ** 2 - 1) < tol
    assert np.abs(g.mean(axis=0)).max() < 5 * sg / math.sqrt(draws)  # zero mean


def test_opendp_release_is_noisy_and_certified():
    rng = np.random.default_rng(4)
    stats = _stats([_episode(rng, 10, i) for i in range(5)], _encoder(8))
    clean = stats.rhs(np.zeros((8, ACTIONS)))
    draws = np.stack([release_rhs(stats, np.zeros((8, ACTIONS)), 0.5, OpenDPNoise(), None, 1)
                      for _ in range(40)]) - clean
    sigma = sigma_of(L * 10.0, 0.5)
    assert 0.7 < draws.std() / sigma < 1.3


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


def test_ledger_gets_every_release_and_refuses_beyond_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("fedqhd.learners.fqi_private.make_noise_source",
                        lambda kind, random_state=None: _CountingNoise())
    rng = np.random.default_rng(5)
    stats = _stats([_episode(rng, 10, i) for i in range(6)], _encoder(8))
    cfg = RunConfig(privacy="zcdp", privacy_rho=0.8, num_server_rounds=4, hd_dim=8)
    node = {"ledger-dir": str(tmp_path), "noise": "numpy", "rho-budget": 2.0}
    plan = ReleasePlan.of(cfg, NodeSettings.of(node))
    assert plan.total == pytest.approx(0.8) and plan.rho_gram == pytest.approx(0.4)
    state = RecordDict()
    readout = np.zeros((8, ACTIONS))
    for k in range(4):
        request = {C.READOUT: readout, C.STATS_REQUEST: np.array([min(k, 1), 1.0])}
        arrays, metrics = private_statistics(_context(state, node), cfg, stats, request, 0)
        assert (C.GRAM in arrays) == (k == 0) and C.PHI_Y in arrays
    ledger = json.loads(next(tmp_path.glob("*.json")).read_text())
    labels = [e["label"] for e in ledger["entries"]]
    assert labels == ["fqi-gram", "fqi-phi-y-1", "fqi-phi-y-2", "fqi-phi-y-3", "fqi-phi-y-4"]
    assert ledger["rho_spent"] == pytest.approx(0.8)
    assert metrics[C.RHO_SPENT] == pytest.approx(0.8) and metrics[C.PRIVATE] == 1
    assert metrics[C.EPSILON] == pytest.approx(ledger["epsilon"])
    # the server asking for the Gram again gets the stored release: no new spend
    again = {C.READOUT: readout, C.STATS_REQUEST: np.array([0.0, 0.0])}
    arrays, _ = private_statistics(_context(state, node), cfg, stats, again, 0)
    np.testing.assert_array_equal(arrays[C.GRAM], state[STATE_GRAM][C.GRAM].numpy())
    # a fifth sweep is beyond the run's plan
    with pytest.raises(BudgetExceededError, match="planned"):
        private_statistics(_context(state, node), cfg, stats,
                           {C.READOUT: readout, C.STATS_REQUEST: np.array([1.0, 1.0])}, 0)
    # a second run of the same shard (0.8 more) would reach 1.6 <= 2: allowed; a third not,
    # refused before any noise is drawn
    private_statistics(_context(RecordDict(), node), cfg, stats,
                       {C.READOUT: readout, C.STATS_REQUEST: np.array([0.0, 1.0])}, 0)
    before = _CountingNoise.draws
    with pytest.raises(BudgetExceededError, match="refused"):
        private_statistics(_context(RecordDict(), node), cfg, stats,
                           {C.READOUT: readout, C.STATS_REQUEST: np.array([0.0, 1.0])}, 0)
    assert _CountingNoise.draws == before
    # the node's per-release cap lowers a release (more privacy, never less)
    capped = ReleasePlan.of(cfg, NodeSettings.of({**node, "rho": 0.05}))
    assert capped.rho_gram == 0.05 and capped.rho_sweep == 0.05


def test_noise_off_needs_a_run_marked_non_private(tmp_path):
    rng = np.random.default_rng(6)
    stats = _stats([_episode(rng, 10, i) for i in range(3)], _encoder(8))
    request = {C.READOUT: np.zeros((8, ACTIONS)), C.STATS_REQUEST: np.array([0.0, 1.0])}
    node = {"ledger-dir": str(tmp_path), "noise": "none"}
    cfg = RunConfig(privacy="zcdp", hd_dim=8)
    with pytest.raises(NonPrivateFQIRefusedError):
        private_statistics(_context(RecordDict(), node), cfg, stats, request, 0)
    arrays, metrics = private_statistics(_context(RecordDict(), node),
                                         cfg.replace(non_private=True), stats, request, 0)
    assert metrics[C.PRIVATE] == 0
    np.testing.assert_allclose(arrays[C.PHI_Y], stats.rhs(request[C.READOUT]))


def test_config_and_psd_projection():
    with pytest.raises(ConfigError, match="privacy"):
        RunConfig(privacy="zcdp", strategy="avg")
    with pytest.raises(ConfigError, match="privacy"):
        RunConfig(privacy="zcdp", encoder="heterogeneous")
    assert RunConfig(privacy="zcdp").resolved_strategy == "exact"
    noisy = np.random.default_rng(0).normal(size=(6, 6))
    psd = psd_projection(noisy)
    assert np.linalg.eigvalsh(psd).min() > -1e-10
    np.testing.assert_allclose(psd, psd.T)


@pytest.mark.slow
def test_private_run_learns_and_reports_the_accountants_epsilon(tmp_path, monkeypatch):
    """In process, CartPole offline shards, epsilon 8 at delta 1e-5 (one fixed noise draw): the
    private run's greedy policy beats uniform random, and every client's reported epsilon
    is the accountant's for the rho the run spent."""
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
    cfg = RunConfig.from_run_config({**SETTING, "seed": 0, "privacy": "zcdp",
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
