import numpy as np
import pytest

from fedqhd.config import RunConfig
from fedqhd.data import client_shard, pooled
from fedqhd.encoders import shared_encoder_params
from fedqhd.envs import get_spec
from fedqhd.readout import (
    RidgeFQI,
    RidgeSystem,
    bellman_targets,
    greedy_actions,
    ridge_project,
    value_range,
)


def _direct(phi, y, ridge, proximal, prior):
    """Ridge with a proximal term, solved as one stacked least-squares problem."""
    d = phi.shape[1]
    A = np.vstack([phi, np.sqrt(ridge) * np.eye(d), np.sqrt(proximal) * np.eye(d)])
    b = np.concatenate([y, np.zeros(d), np.sqrt(proximal) * prior])
    return np.linalg.lstsq(A, b, rcond=None)[0]


@pytest.mark.parametrize("n", [8, 60])  # dual form (n < D) and primal form (n >= D)
@pytest.mark.parametrize("proximal", [0.0, 0.7])
def test_ridge_system_equals_direct_least_squares(n, proximal):
    rng = np.random.default_rng(n)
    phi, y, prior = rng.normal(size=(n, 20)), rng.normal(size=n), rng.normal(size=20)
    system = RidgeSystem(phi, ridge=0.3, proximal=proximal)
    assert system.dual == (n < 20)
    np.testing.assert_allclose(system.solve(y, prior), _direct(phi, y, 0.3, proximal, prior),
                               atol=1e-10)


def test_fqi_iteration_equals_per_action_least_squares():
    rng = np.random.default_rng(0)
    n, d, k = 90, 15, 3
    phi, nphi = rng.normal(size=(n, d)), rng.normal(size=(n, d))
    actions, rewards = rng.integers(0, k, n), rng.normal(size=n)
    terminated = rng.random(n) < 0.2
    init, prior = rng.normal(size=(d, k)) * 0.1, rng.normal(size=(d, k))
    fqi = RidgeFQI(phi, actions, rewards, nphi, terminated, k, gamma=0.9, ridge=0.5, proximal=0.2)
    fqi.fit(1, init=init, prior=prior)
    y = rewards + 0.9 * (~terminated) * (nphi @ init).max(axis=1)
    for a in range(k):
        rows = actions == a
        np.testing.assert_allclose(fqi.readout_[:, a], _direct(phi[rows], y[rows], 0.5, 0.2,
                                                               prior[:, a]), atol=1e-10)


def test_truncation_bootstraps_and_termination_does_not():
    # one state, one action, reward 1: terminated -> Q = 1, never terminated -> 1/(1-gamma)
    phi = np.ones((1, 1))
    for terminated, expected in [(True, 1.0), (False, 10.0)]:
        fqi = RidgeFQI(phi, [0], [1.0], phi, [terminated], 1, gamma=0.9, ridge=1e-9)
        fqi.fit(400)
        assert fqi.readout_[0, 0] == pytest.approx(expected, rel=1e-4)


def test_ridge_project_reproduces_a_teacher_in_the_span():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(50, 200))  # m < D: dual form
    T = X @ rng.normal(size=(200, 2))
    W, residual = ridge_project(X, T, ridge=1e-8)
    np.testing.assert_allclose(X @ W, T, atol=1e-5)
    assert residual < 1e-5 * np.linalg.norm(T)
    assert greedy_actions(X, W).tolist() == np.argmax(T, axis=1).tolist()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="ridge"):
        RidgeSystem(np.ones((2, 2)), ridge=0.0)
    with pytest.raises(ValueError, match="actions"):
        RidgeFQI(np.ones((2, 2)), [0, 3], [0, 0], np.ones((2, 2)), [0, 0], n_actions=2)
    fqi = RidgeFQI(np.ones((2, 2)), [0, 1], [0, 0], np.ones((2, 2)), [0, 0], n_actions=2)
    with pytest.raises(ValueError, match="shape"):
        fqi.fit(1, init=np.zeros((3, 2)))


# ---- bounded targets: ridge FQI stays in the range the rewards allow ----

def test_value_range_allows_termination_at_any_step():
    assert value_range([1.0, 1.0], 0.9) == pytest.approx((0.0, 10.0))  # CartPole-like
    assert value_range([-1.0, 0.0], 0.9) == pytest.approx((-10.0, 0.0))  # Acrobot-like
    assert value_range([-2.0, 3.0], 0.5) == pytest.approx((-4.0, 6.0))
    assert value_range([], 0.9) == (0.0, 0.0)


def test_bellman_targets_clip_the_next_value_and_keep_termination():
    r, cont, nxt = np.array([1.0, 1.0, 1.0]), np.array([1.0, 1.0, 0.0]), np.array([5.0, 50.0, 50.0])
    np.testing.assert_allclose(bellman_targets(r, cont, nxt, 0.9, None), [5.5, 46.0, 1.0])
    # the next value is clipped to [0, 10] before discounting; a terminal target is r
    np.testing.assert_allclose(bellman_targets(r, cont, nxt, 0.9, (0.0, 10.0)), [5.5, 10.0, 1.0])


def _pooled_fqi(env_id, n_clients, n_max, sweeps=1000, **kwargs):
    """Ridge FQI at the run's defaults (D, bandwidth, ridge, gamma; ``kwargs`` go to
    :class:`RidgeFQI`) on the first ``n_max``
    pooled transitions of ``n_clients`` one-episode shards; returns (Q on the data states and
    the next states FQI bootstraps from, the reward-implied range)."""
    cfg = RunConfig(env_id=env_id)
    spec = get_spec(env_id)
    data = pooled([client_shard(env_id, cfg.partition, i, n_clients, 1, cfg.seed)
                   for i in range(n_clients)])
    keep = slice(0, n_max)
    obs, nobs, term = data.observations[keep], data.next_observations[keep], data.terminated[keep]
    encoder = shared_encoder_params(cfg.seed, cfg.hd_dim, cfg.bandwidth).build(spec.obs_bound)
    fqi = RidgeFQI(encoder.encode(obs), data.actions[keep], data.rewards[keep],
                   encoder.encode(nobs), term, spec.n_actions, gamma=cfg.gamma,
                   ridge=cfg.ridge, **kwargs)
    fqi.fit(sweeps)
    q = encoder.encode(np.vstack([obs, nobs[~term]])) @ fqi.readout_
    return q, value_range(data.rewards[keep], cfg.gamma)


@pytest.mark.parametrize("env_id, n_clients", [("CartPole-v1", 4), ("Acrobot-v1", 1),
                                               ("MountainCar-v0", 1), ("LunarLander-v3", 2)])
def test_pooled_fqi_at_the_defaults_stays_in_the_value_range(env_id, n_clients):
    """1000 sweeps at the defaults (gamma 0.99, ridge 0.1, D 2000). The targets are clipped
    to [lo, hi]; the ridge fit of clipped targets may overshoot a little (CartPole here:
    Q in [-10.1, 104.3] for [0, 100]; the pooled 10 x 5 episode shards: up to 0.28 of the
    range, below 0 next to terminal states), but it cannot grow."""
    q, (lo, hi) = _pooled_fqi(env_id, n_clients, 200)  # the default value_range="data"
    assert np.isfinite(q).all()
    margin = 0.3 * (hi - lo)
    assert lo - margin <= q.min() and q.max() <= hi + margin


def test_without_the_bound_pooled_fqi_diverges():
    """The same CartPole problem with ``value_range=None`` (the old FQI): Q reaches 650 x the
    largest return possible."""
    q, (_, hi) = _pooled_fqi("CartPole-v1", 4, 200, value_range=None)
    assert q.max() > 10 * hi


@pytest.mark.parametrize("order", ["episodes", "shuffled"])
def test_fqi_from_states_encodes_each_state_once_and_equals_the_two_matrix_fit(order):
    """A client's shard (several episodes, both actions; CartPole, D = 256): the one-table
    fit gives the targets, right-hand sides, Grams and readouts of the old construction
    (states and next states encoded separately) to 1e-12, and holds about half the bytes.
    Shuffled rows share no state, so the table is the old 2 n rows, still exact."""
    from fedqhd.learners.cache import array_bytes
    from fedqhd.readout import distinct_state_count

    shard = client_shard("CartPole-v1", "iid", 0, 2, 4, seed=3)
    encoder = shared_encoder_params(3, 256, 1.0).build(get_spec("CartPole-v1").obs_bound)
    rows = np.arange(shard.n_transitions)
    if order == "shuffled":
        rows = np.random.default_rng(0).permutation(rows)
    obs, act, rew = shard.observations[rows], shard.actions[rows], shard.rewards[rows]
    nobs, term = shard.next_observations[rows], shard.terminated[rows]
    kwargs = dict(gamma=0.99, ridge=0.1, proximal=0.5)
    old = RidgeFQI(encoder.encode(obs), act, rew, encoder.encode(nobs), term, 2, **kwargs)
    new = RidgeFQI.from_states(encoder.encode, obs, act, rew, nobs, term, 2, **kwargs)
    w = np.random.default_rng(1).normal(size=(256, 2))
    np.testing.assert_allclose(new.targets(w), old.targets(w), rtol=0, atol=1e-12)
    np.testing.assert_allclose(new.rhs(w), old.rhs(w), rtol=0, atol=1e-12)
    np.testing.assert_allclose(new.grams(), old.grams(), rtol=0, atol=1e-12)
    old.fit(20, init=w)
    new.fit(20, init=w)
    assert np.abs(old.readout_).max() > 1.0  # a real fit, not zeros
    np.testing.assert_allclose(new.readout_, old.readout_, rtol=0, atol=1e-12)
    n, episodes = shard.n_transitions, len(np.unique(shard.episode_ids))
    states = distinct_state_count(obs, nobs)
    # exactly the rows not encoded twice are saved (the factors and small arrays are shared)
    assert array_bytes(old) - array_bytes(new) == (2 * n - states) * 256 * 8
    if order == "episodes":
        assert states == n + episodes  # one extra row per episode's last next state
    else:  # (a shuffled row may still follow its predecessor by chance)
        assert states >= 2 * n - 3


@pytest.mark.parametrize("dim", [256, 16])  # dual systems (n_a < D) and primal ones (n_a > D)
def test_float32_features_are_the_only_thing_rounded(dim, monkeypatch):
    """feature-dtype = float32: the table is kept in float32 (half the bytes) and every
    Gram, factor and product is float64 arithmetic on those numbers, so the fit equals a
    float64 fit of the same rounded features to 1e-12, also when the float64 blocks are
    small (many of them, a ragged last one)."""
    from fedqhd.learners.cache import array_bytes

    monkeypatch.setattr("fedqhd.readout.UPCAST_ROWS", 7)
    shard = client_shard("CartPole-v1", "iid", 0, 2, 4, seed=3)
    encoder = shared_encoder_params(3, dim, 1.0).build(get_spec("CartPole-v1").obs_bound)
    args = (shard.observations, shard.actions, shard.rewards, shard.next_observations,
            shard.terminated, 2)
    kwargs = dict(gamma=0.99, ridge=0.1, proximal=0.5)
    narrow = RidgeFQI.from_states(lambda s: encoder.encode(s, np.float32), *args, **kwargs)
    rounded = RidgeFQI.from_states(
        lambda s: encoder.encode(s, np.float32).astype(np.float64), *args, **kwargs)
    assert narrow._table.dtype == np.float32
    assert array_bytes(rounded) - array_bytes(narrow) == rounded._table.size * 4
    assert [s.dual for s in narrow._systems] == [dim == 256] * 2
    w = np.random.default_rng(1).normal(size=(dim, 2))
    np.testing.assert_allclose(narrow.grams(), rounded.grams(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(narrow.rhs(w), rounded.rhs(w), rtol=0, atol=1e-12)
    narrow.fit(20, init=w)
    rounded.fit(20, init=w)
    assert np.abs(rounded.readout_).max() > 1.0  # a real fit, not zeros
    np.testing.assert_allclose(narrow.readout_, rounded.readout_, rtol=0, atol=1e-12)


def test_effective_dimension_from_the_factor_matches_the_eigenvalues():
    from fedqhd.readout import RidgeSystem

    rng = np.random.default_rng(0)
    for n, d in ((30, 50), (80, 20)):  # dual and primal form
        phi = rng.normal(size=(n, d)) * np.geomspace(1, 1e-4, d)
        system = RidgeSystem(phi, ridge=1e-3)
        mu = np.linalg.eigvalsh(phi.T @ phi)
        assert system.effective_dimension() == pytest.approx(np.sum(mu / (mu + 1e-3)), rel=1e-9)
