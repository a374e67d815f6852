"""The online protocol's numeric core: batch steppers, incremental statistics, short runs."""

import json

import numpy as np
import pytest
from presets_util import write_preset

from fedqhd.acting import collect, collect_many, returns_to_go
from fedqhd.config import ConfigError, RunConfig
from fedqhd.encoders import HDEncoder
from fedqhd.envs import get_spec, make_env, rollout_returns
from fedqhd.envs.batch import AcrobotBatch, CartPoleBatch, MountainCarBatch
from fedqhd.online import (
    OnlineClient,
    pack_statistics,
    unpack_statistics,
)
from fedqhd.readout import value_range
from fedqhd.replay import BATCH, ReplayRing, replay

STEPPERS = [("CartPole-v1", CartPoleBatch, None),
            ("CartPole-v1", CartPoleBatch, {"length": 0.8, "masspole": 0.2}),
            ("MountainCar-v0", MountainCarBatch, None),
            ("MountainCar-v0", MountainCarBatch, {"force": 0.0012}),
            ("Acrobot-v1", AcrobotBatch, None),
            ("Acrobot-v1", AcrobotBatch, {"link_mass_1": 1.2, "link_length_2": 0.8})]


@pytest.mark.parametrize("env_id,cls,dynamics", STEPPERS)
def test_batch_stepper_equals_gymnasium(env_id, cls, dynamics):
    rng = np.random.default_rng(0)
    n = 16
    batch = cls(n, rng, dynamics)
    batch.reset(np.arange(n))
    if env_id == "MountainCar-v0":
        batch.state[: n // 2] = [-1.18, -0.05]  # half start against the left wall
    if env_id == "Acrobot-v1":  # fast swings: wrapping, velocity clipping, termination
        batch.state[: n // 2] = rng.uniform(-1, 1, size=(n // 2, 4)) * [3, 3, 12, 28]
    envs = [make_env(env_id, dynamics).unwrapped for _ in range(n)]
    for e in envs:
        e.reset(seed=0)
    n_actions = get_spec(env_id).n_actions
    for _ in range(60):
        state = batch.state.copy()
        actions = rng.integers(n_actions, size=n)
        obs, rew, term = batch.step(actions)
        for i, e in enumerate(envs):
            if env_id == "CartPole-v1":
                e.state, e.steps_beyond_terminated = state[i].copy(), None
            elif env_id == "Acrobot-v1":
                e.state = state[i].copy()
            else:
                e.state = tuple(state[i])
            o, r, t, _, _ = e.step(int(actions[i]))
            np.testing.assert_allclose(obs[i], o, rtol=0, atol=1e-6)
            np.testing.assert_allclose(batch.state[i], np.asarray(e.state, float),
                                       rtol=1e-12, atol=1e-14)
            assert rew[i] == r and bool(term[i]) == t
        done = np.flatnonzero(term)
        if len(done):
            batch.reset(done)


@pytest.mark.parametrize("dynamics", [None, {"link_mass_1": 1.2, "link_length_2": 0.8}])
def test_acrobot_step_one_is_step_to_the_bit(dynamics):
    # a TD client steps one episode in Python floats: the same bits as the numpy step,
    # from gentle starts and from fast swings (wrapping, velocity clipping, termination)
    rng = np.random.default_rng(3)
    steps = terminations = 0
    for start in range(40):
        vector, scalar = (AcrobotBatch(1, np.random.default_rng(start), dynamics)
                          for _ in range(2))
        if start % 2:
            vector.reset(np.arange(1))
        else:
            vector.state[0] = rng.uniform(-1, 1, size=4) * [3, 3, 12, 28]
        scalar.state = vector.state.copy()
        for _ in range(50):
            action = int(rng.integers(3))
            obs, reward, terminated = vector.step(np.array([action]))
            obs1, reward1, terminated1 = scalar.step_one(action)
            steps += 1
            assert obs1.dtype == np.float32 and obs1.tobytes() == obs[0].tobytes()
            assert scalar.state.tobytes() == vector.state.tobytes()
            assert (reward1, terminated1) == (reward[0], bool(terminated[0]))
            if terminated1:
                terminations += 1
                break
    assert steps > 1000 and terminations > 5  # the cases above were reached


def _client(form, capacity, dim=40, seed=0):
    enc = HDEncoder(dim, 1.0, scale=get_spec("CartPole-v1").obs_bound, random_state=1)
    enc.fit(np.zeros((1, 4)))
    return OnlineClient("CartPole-v1", enc, capacity=capacity, per_episode=1000,
                        n_parallel=4, seed=seed, form=form)


@pytest.mark.parametrize("form", ["primal", "dual"])
def test_incremental_statistics_equal_batch(form):
    # capacity 150 with ~ 300+ offered transitions: appends, then reservoir replacements
    cl = _client(form, capacity=150)
    for _ in range(6):
        collect_many([cl], [4], [1.0])
    assert cl.seen > cl.capacity  # replacements (downdates) happened
    f = cl.features[:cl.size].astype(np.float64)
    if form == "primal":
        for a in range(cl.n_actions):
            x = f[cl.actions[:cl.size] == a]
            np.testing.assert_allclose(cl.gram[a], x.T @ x, rtol=0, atol=1e-4)  # float32 sums
    else:
        np.testing.assert_allclose(cl.kernel[:cl.size, :cl.size], f @ f.T, rtol=0, atol=1e-5)


def test_the_dual_kernel_is_exactly_symmetric_when_gemm_is_not(monkeypatch):
    """f_i.f_j and f_j.f_i need not have the same bits from a BLAS (CI's did not): the
    kernel mirrors the new rows' block, so it stays exactly symmetric and packs."""
    import fedqhd.online as online

    noise = np.random.default_rng(5)

    def skewed(rows, features):  # a gemm whose (i, j) and (j, i) differ in the last bits
        out = rows @ features.T
        return out * (1 + np.float32(1e-6) * noise.standard_normal(out.shape, np.float32))

    monkeypatch.setattr(online, "_row_products", skewed)
    cl = _client("dual", capacity=150)
    for _ in range(6):  # appends, then reservoir replacements
        collect_many([cl], [4], [1.0])
    k = cl.kernel[:cl.size, :cl.size]
    np.testing.assert_array_equal(k, k.T)
    assert "statistics-upper" in cl.snapshot()[0]


def test_packed_statistics_round_trip_bitwise():
    """The state's statistics travel as upper triangles (float32 when exact); unpacked they
    are the same bits, and anything not exactly symmetric or float32 travels whole."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 9, 7))
    mats = np.einsum("kij,klj->kil", x, x)  # symmetric
    mats = (mats + np.swapaxes(mats, 1, 2)) / 2
    packed = pack_statistics(mats)
    assert list(packed) == ["statistics-upper"] and packed["statistics-upper"].shape == (2, 45)
    assert packed["statistics-upper"].dtype == np.float64  # not float32-exact: not narrowed
    assert pack_statistics(mats, narrow=True)["statistics-upper"].dtype == np.float64
    out = np.full_like(mats, np.nan)
    unpack_statistics(packed, out)
    np.testing.assert_array_equal(out, mats)
    exact32 = mats.astype(np.float32).astype(np.float64)
    small = pack_statistics(exact32, narrow=True)["statistics-upper"]
    assert small.dtype == np.float32
    unpack_statistics({"statistics-upper": small}, out)
    np.testing.assert_array_equal(out, exact32)
    skew = mats.copy()
    skew[1, 2, 5] = np.nextafter(skew[1, 2, 5], np.inf)  # one ulp off symmetry
    whole = pack_statistics(skew)
    assert list(whole) == ["statistics"]
    unpack_statistics(whole, out)
    np.testing.assert_array_equal(out, skew)
    with pytest.raises(ValueError, match="upper triangle"):
        unpack_statistics({"statistics-upper": small[:, :-1]}, out)


@pytest.mark.parametrize("form", ["primal", "dual"])
def test_snapshot_restores_the_same_client_in_half_the_bytes(form):
    """A client rebuilt from its snapshot has bitwise the same statistics, rows and
    readout, and goes on fitting the same numbers; the Grams (kernel) travel packed."""
    cl = _client(form, capacity=150)
    for _ in range(5):
        collect_many([cl], [4], [1.0])
    cl.fit(3)
    arrays, scalars = cl.snapshot()
    stats = cl.gram if form == "primal" else cl.kernel[None, :cl.size, :cl.size]
    assert "statistics-upper" in arrays and arrays["statistics-upper"].nbytes < 0.55 * (
        stats.nbytes if form == "primal" else stats.nbytes / 2)  # dual: float32 too
    twin = _client(form, capacity=150)
    twin.restore(arrays, scalars)
    if form == "primal":
        np.testing.assert_array_equal(twin.gram, cl.gram)
    else:
        np.testing.assert_array_equal(twin.kernel, cl.kernel)
    np.testing.assert_array_equal(twin.features[:cl.size], cl.features[:cl.size])
    np.testing.assert_array_equal(twin.fit(2), cl.fit(2))


@pytest.mark.parametrize("form", ["primal", "dual"])
def test_a_rebuild_reencodes_only_the_rows_changed_since_an_earlier_copy(form, monkeypatch):
    """A stale copy lends its features of unchanged rows; appended and reservoir-replaced
    rows are encoded again, and the rebuilt client is bitwise the live one."""
    cl = _client(form, capacity=150)
    collect_many([cl], [4], [1.0])
    stale = _client(form, capacity=150)
    stale.restore(*cl.snapshot())
    for _ in range(5):
        collect_many([cl], [4], [1.0])  # more rows, then some slots replaced
    assert stale.size < cl.size and cl.seen > cl.capacity
    encoded = []
    real = HDEncoder.encode32
    monkeypatch.setattr(HDEncoder, "encode32",
                        lambda enc, x: encoded.append(len(x)) or real(enc, x))
    twin = _client(form, capacity=150)
    twin.restore(*cl.snapshot(), reuse=stale)
    assert 0 < sum(encoded) < 2 * cl.size  # not every row again
    for name in ("features", "next_features"):
        np.testing.assert_array_equal(getattr(twin, name), getattr(cl, name))
    np.testing.assert_array_equal(twin.fit(2), cl.fit(2))


def test_primal_and_dual_fits_agree():
    fits = []
    for form in ("primal", "dual"):
        cl = _client(form, capacity=500)
        collect_many([cl], [8], [1.0])
        fits.append(cl.fit(4))
    np.testing.assert_allclose(fits[0], fits[1], rtol=1e-3, atol=1e-3)


def test_targets_are_clipped_to_the_value_range():
    cl = _client("primal", capacity=200)
    collect_many([cl], [4], [1.0])
    lo, hi = value_range(np.array([cl.r_min, cl.r_max]), cl.gamma)
    assert (lo, hi) == (0.0, 1.0 / (1.0 - cl.gamma))
    y = cl.targets(np.full((cl.dim, cl.n_actions), 1e6))
    assert y.max() <= hi and y.min() >= lo
    cont = cl.continues[:cl.size] > 0
    assert np.all(y[~cont] == cl.rewards[:cl.size][~cont])  # termination does not bootstrap


def _app_run(tmp_path, n: int, **keys):
    """A short online run of the Flower apps in process: its round rows."""
    from presets_util import write_preset

    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    rounds = keys.pop("rounds")
    preset = write_preset(tmp_path, **{"episodes-per-round": 20, "gamma": 0.9, "ridge": 1.0,
                                       "proximal": 0.01, "local-iterations": 5,
                                       "per-episode": 20, "tail": 20,
                                       "epsilon": [1.0, 0.99, 0.0],
                                       "hd-dim": keys.pop("hd-dim")})
    cfg = RunConfig.from_run_config({
        "protocol": "online", "preset": preset, "env-id": "CartPole-v1",
        "online-episodes": 20 * rounds, "min-nodes": n, "output-dir": str(tmp_path), **keys})
    _, out = run_federation(InProcessGrid([client_app] * n, run_config=cfg.to_run_config()),
                            cfg)
    return json.loads((out / "results.json").read_text())["rounds"]


def test_short_online_run_learns_cartpole(tmp_path):
    rows = _app_run(tmp_path, 2, **{"hd-dim": 300, "seed": 0, "rounds": 6, "eval-episodes": 5})
    first = rows[0]["train-return-last100"]
    assert rows[-1]["train-return-last100"] > max(2 * first, 60.0)
    assert rows[-1]["return-mean"] > 21.0 * 3  # uniform random gets 21


def test_independent_learners_never_compile_a_teacher(tmp_path, monkeypatch):
    calls = []
    real = OnlineClient.compile
    monkeypatch.setattr(OnlineClient, "compile",
                        lambda self, *a, **k: calls.append("compile") or real(self, *a, **k))
    keys = {"hd-dim": 100, "encoder": "heterogeneous", "rounds": 2,
            "eval-episodes": 1, "num-anchors": 50}
    _app_run(tmp_path / "none", 2, strategy="independent", **keys)
    assert calls == []
    _app_run(tmp_path / "anchor", 2, strategy="anchor", **keys)
    assert len(calls) >= 2  # every client compiled the round's teacher


def test_per_episode_quota_keeps_the_tail_of_failed_episodes():
    from fedqhd.acting import _per_episode_subsample
    # two interleaved episodes: 0 is truncated (rows 0, 2, ..., 18), 1 terminates (odd rows)
    ep = np.tile([0, 1], 10)
    te = np.zeros(20, dtype=bool)
    te[19] = True
    for seed in range(5):
        keep = _per_episode_subsample(ep, 4, np.random.default_rng(seed), te, tail=3)
        assert {15, 17, 19} <= set(keep.tolist())  # the failure and the two steps before
        assert (ep[keep] == 0).sum() == 4 and (ep[keep] == 1).sum() == 4
    plain = _per_episode_subsample(ep, 4, np.random.default_rng(0))
    assert (ep[plain] == 1).sum() == 4


def test_compile_refactors_for_new_anchor_features_even_at_a_reused_address():
    """The anchor factor is keyed by the features array itself: a new array that CPython
    places at a freed array's address (same ``id``, which it does here when the client
    holds no reference to the old one) must not reuse the old factor."""
    cl = _client("primal", capacity=100)
    rng = np.random.default_rng(0)
    teacher = rng.normal(size=(30, 2))
    for _ in range(20):
        old = rng.normal(size=(30, cl.readout.shape[0])).astype(np.float32)
        cl.readout = np.zeros_like(cl.readout)
        cl.compile(old, teacher, 1.0)
        values = rng.normal(size=(30, cl.readout.shape[0])).astype(np.float32)
        del old
        new = values.copy()  # one new array object: CPython tends to reuse old's address
        cl.readout = np.zeros_like(cl.readout)
        cl.compile(new, teacher, 1.0)
        fresh = _client("primal", capacity=100)
        fresh.readout = np.zeros_like(fresh.readout)
        fresh.compile(new, teacher, 1.0)
        np.testing.assert_allclose(cl.readout, fresh.readout, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lower", [True, False])
def test_the_factored_solve_with_and_without_scipy(lower):
    from scipy.linalg import cho_factor

    from fedqhd.gram import CholeskySolver, _numpy_solver
    rng = np.random.default_rng(0)
    x = rng.standard_normal((200, 30))
    m = x.T @ x + 3.0 * np.eye(30)
    z = rng.standard_normal((30, 4))
    for solver in (CholeskySolver(factor=cho_factor(m, lower=lower)),
                   _numpy_solver(x.T @ x, 3.0)):
        np.testing.assert_allclose(solver(z), np.linalg.solve(m, z), atol=1e-10)


def test_returns_to_go_of_interleaved_episodes():
    """Each transition's discounted return to the end of its own episode, whatever the
    order the episodes' transitions are interleaved in."""
    rng = np.random.default_rng(0)
    episode = np.array([0, 1, 0, 2, 1, 0, 2, 2, 1, 0])
    rewards = rng.normal(size=10)
    got = returns_to_go(episode, rewards, 0.9)
    for e in np.unique(episode):
        idx = np.flatnonzero(episode == e)
        want = [sum(0.9**j * rewards[k] for j, k in enumerate(idx[i:]))
                for i in range(len(idx))]
        np.testing.assert_allclose(got[idx], want, rtol=1e-12)



def test_returns_to_go_are_the_bits_of_a_per_episode_filter():
    """The one-pass recursion gives exactly what filtering each reversed episode with
    scipy's lfilter gave (the numbers every earlier run and preset was measured with)."""
    from scipy.signal import lfilter

    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 400, size=30)
    episode = rng.permutation(np.repeat(np.arange(30), lengths))  # interleaved, time order
    rewards = rng.normal(size=len(episode)) * 10
    got = returns_to_go(episode, rewards, 0.99)
    for e in range(30):
        idx = np.flatnonzero(episode == e)
        want = lfilter([1.0], [1.0, -0.99], rewards[idx][::-1])[::-1]
        np.testing.assert_array_equal(got[idx], want)
    assert returns_to_go(np.zeros(0, dtype=np.int64), np.zeros(0), 0.9).shape == (0,)

def _mc_client(mc_mix, mc_window=100, capacity=2000, form="primal"):
    enc = HDEncoder(40, 1.0, scale=get_spec("CartPole-v1").obs_bound, random_state=1)
    enc.fit(np.zeros((1, 4)))
    return OnlineClient("CartPole-v1", enc, capacity=capacity, per_episode=1000,
                        n_parallel=4, seed=0, form=form, mc_mix=mc_mix,
                        mc_window=mc_window)


def test_the_buffer_keeps_each_rows_return_to_go_and_episode():
    """Collected rows carry their episode's discounted return from them (CartPole: 1 per
    step, so ``G_t = r_t + gamma G_{t+1}`` along an episode, the last one 1) and the
    client's number of that episode."""
    cl = _mc_client(0.5)
    collect_many([cl], [4], [1.0])
    collect_many([cl], [4], [1.0])
    n = cl.size
    assert n == cl.n_transitions  # every transition kept
    eps = cl.row_episode[:n]
    assert sorted(set(eps.tolist())) == list(range(8))
    for e in range(8):
        g = cl.returns_to_go[:n][eps == e]
        assert g[-1] == 1.0
        np.testing.assert_allclose(g[:-1], 1.0 + cl.gamma * g[1:], rtol=1e-12)
        assert len(g) == cl.episode_returns[e]  # the whole episode, in time order


@pytest.mark.parametrize("window", [3, 100])
def test_mixed_monte_carlo_targets(window):
    """The target of a row of the last ``mc_window`` episodes is ``(1 - mix)`` Bellman
    plus ``mix`` times its realised return-to-go; older rows keep their Bellman target."""
    cl = _mc_client(0.25, mc_window=window)
    plain = _mc_client(0.0, mc_window=window)
    for c in (cl, plain):
        collect_many([c], [4], [1.0])
        collect_many([c], [4], [1.0])
    w = np.random.default_rng(1).normal(size=(cl.dim, cl.n_actions))
    np.testing.assert_array_equal(cl.features, plain.features)  # the same data
    bell, mixed = plain.targets(w), cl.targets(w)
    recent = cl.row_episode[:cl.size] >= 8 - window
    assert recent.any() and (window > 8 or not recent.all())
    g = cl.returns_to_go[:cl.size]
    np.testing.assert_allclose(mixed[recent], 0.75 * bell[recent] + 0.25 * g[recent])
    np.testing.assert_array_equal(mixed[~recent], bell[~recent])
    # and the fit regresses on them
    assert not np.allclose(cl.fit(2, init=w), plain.fit(2, init=w))


def test_mixed_monte_carlo_settings_are_validated():
    with pytest.raises(ValueError, match="mc_mix"):
        _mc_client(1.5)
    with pytest.raises(ValueError, match="mc_window"):
        _mc_client(0.5, mc_window=0)


@pytest.mark.parametrize("form", ["primal", "dual"])
def test_a_snapshot_keeps_the_returns_to_go(form):
    """A rebuilt client fits the same mixed targets: the rows' returns and episode numbers
    travel in the snapshot."""
    cl = _mc_client(0.5, mc_window=3, capacity=150, form=form)
    for _ in range(3):
        collect_many([cl], [4], [1.0])
    twin = _mc_client(0.5, mc_window=3, capacity=150, form=form)
    twin.restore(*cl.snapshot())
    np.testing.assert_array_equal(twin.returns_to_go, cl.returns_to_go)
    np.testing.assert_array_equal(twin.row_episode, cl.row_episode)
    np.testing.assert_array_equal(twin.fit(2), cl.fit(2))


def test_a_snapshot_from_before_the_returns_restores_without_mixing_its_rows():
    """A checkpoint written before rows kept their returns resumes: its rows count as old
    episodes (Bellman targets), the rows collected after it mix as usual."""
    cl = _mc_client(0.5, mc_window=3, capacity=400)
    for _ in range(2):
        collect_many([cl], [4], [1.0])
    arrays, scalars = cl.snapshot()
    old = {k: v for k, v in arrays.items() if k not in ("returns-to-go", "row-episode")}
    twin = _mc_client(0.5, mc_window=3, capacity=400)
    plain = _mc_client(0.0, capacity=400)
    twin.restore(old, scalars)
    plain.restore(old, scalars)
    w = np.random.default_rng(2).normal(size=(cl.dim, cl.n_actions))
    np.testing.assert_array_equal(twin.targets(w), plain.targets(w))
    collect_many([twin], [4], [1.0])
    n0 = scalars["size"]
    assert np.all(twin.row_episode[n0:twin.size] >= 8)


def test_value_bias_is_the_start_values_minus_their_discounted_returns():
    """CartPole pays 1 a step, so an episode of R steps realises (1 - g^R) / (1 - g) from
    its start; the start values are the collecting readout's max over actions there."""
    enc = HDEncoder(40, 1.0, scale=get_spec("CartPole-v1").obs_bound, random_state=1)
    enc.fit(np.zeros((1, 4)))
    cl = OnlineClient("CartPole-v1", enc, gamma=0.9, capacity=5000, per_episode=1000,
                      n_parallel=4, seed=0)
    assert np.isnan(cl.value_bias())
    cl.readout = np.random.default_rng(0).normal(size=(40, 2))
    returns = collect(cl, 6, 1.0)
    np.testing.assert_allclose(cl.start_returns, (1 - 0.9 ** returns) / (1 - 0.9), rtol=1e-12)
    # every transition kept, in time order: each episode's first row is its start state
    first = [np.flatnonzero(cl.row_episode[:cl.size] == e)[0] for e in range(6)]
    q = cl.q_values(cl.states[first])
    np.testing.assert_allclose(cl.start_values, q.max(axis=1), rtol=1e-9)
    assert not np.allclose(cl.start_values, q.mean(axis=1))
    assert cl.value_bias() == pytest.approx(float(np.mean(cl.start_values - cl.start_returns)))
    values = cl.start_values.copy()
    collect(cl, 3, 0.0, append=False)  # a greedy evaluation is not a collection
    np.testing.assert_array_equal(cl.start_values, values)
    collect(cl, 2, 1.0)  # the next collection replaces them
    assert len(cl.start_values) == 2 and len(cl.start_returns) == 2


class _Recording:
    """A one-slot batch env that records every step it gives (time limit: the client's)."""

    def __init__(self, env) -> None:
        self.env, self.steps = env, []

    def reset(self, idx):
        self.obs = self.env.reset(idx)
        return self.obs

    def step(self, actions, *rest):
        obs, rew, term = self.env.step(actions, *rest)
        self.steps.append((self.obs[0].copy(), int(actions[0]), float(rew[0]),
                           obs[0].copy(), bool(term[0])))
        self.obs = obs
        return obs, rew, term


def _td_client(**kw) -> OnlineClient:
    spec = get_spec("CartPole-v1")
    enc = HDEncoder(300, 1.0, scale=spec.obs_bound, random_state=0).fit(np.zeros((1, 4)))
    return OnlineClient("CartPole-v1", enc, gamma=0.9, capacity=0, n_parallel=1, seed=3,
                        update="td", **kw)


@pytest.mark.parametrize("limit", [500, 6])  # episodes that terminate; episodes truncated
def test_a_td_client_learns_by_q_learning_at_every_step(limit):
    client = _td_client(td_rate=0.3)
    client.max_steps = limit
    client.env = env = _Recording(client.env)
    returns = collect(client, 4, 0.5)
    # the same updates by hand, in float64: a terminal step does not bootstrap, a step cut
    # by the time limit does
    w = np.zeros_like(client.readout)
    for s, a, r, s1, term in env.steps:
        phi, phi1 = client.encode(s[None])[0], client.encode(s1[None])[0]
        target = r if term else r + 0.9 * (phi1 @ w).max()
        w[:, a] += 0.3 * (target - phi @ w[:, a]) * phi
    assert len(env.steps) == client.n_transitions and client.size == 0
    assert np.sum(returns) == len(env.steps)  # CartPole: +1 a step
    assert (limit == 6) == (not any(t for *_, t in env.steps))
    np.testing.assert_allclose(client.readout, w, rtol=1e-5, atol=1e-6)
    assert np.abs(w).max() > 0.1  # it learnt something


def test_td_settings_are_validated_and_pooled_needs_fqi(tmp_path):
    encoder = _td_client().encoder
    with pytest.raises(ValueError, match="update must be one of fqi, td"):
        OnlineClient("CartPole-v1", encoder, update="sarsa")
    with pytest.raises(ValueError, match="td_rate"):
        _td_client(td_rate=0.0)
    with pytest.raises(ValueError, match="one episode at a time"):
        collect(OnlineClient("CartPole-v1", encoder, capacity=0, n_parallel=2,
                             update="td"), 2, 0.5)
    preset = write_preset(tmp_path, "td", **{"hd-dim": 50, "update": "td"})
    keys = {"protocol": "online", "preset": preset, "online-episodes": 40}
    assert RunConfig.from_run_config(keys).online.update == "td"
    with pytest.raises(ConfigError, match="pooled.*needs the preset's update = 'fqi'"):
        RunConfig.from_run_config({**keys, "strategy": "pooled"})
    fqi_replay = write_preset(tmp_path, "fqi-replay", **{"hd-dim": 50, "td-replay": 1.0})
    with pytest.raises(ConfigError, match="'td-replay' = 1.0 replays a td client's"):
        RunConfig.from_run_config({**keys, "preset": fqi_replay})
    idle_start = write_preset(tmp_path, "idle-start", **{"hd-dim": 50, "update": "td",
                                                         "td-replay-start": 10})
    with pytest.raises(ConfigError, match="'td-replay-start' = 10 delays replay, but"):
        RunConfig.from_run_config({**keys, "preset": idle_start})
    late = write_preset(tmp_path, "late", **{"hd-dim": 50, "update": "td", "td-replay": 1.0,
                                             "td-replay-start": 10})
    assert RunConfig.from_run_config({**keys, "preset": late}).online.td_replay_start == 10


def test_a_td_client_learns_cartpole():
    spec = get_spec("CartPole-v1")
    enc = HDEncoder(1000, 1.0, scale=spec.obs_bound, random_state=0).fit(np.zeros((1, 4)))
    client = OnlineClient("CartPole-v1", enc, gamma=0.9, capacity=0, n_parallel=1, seed=0,
                          update="td", td_rate=0.2)
    returns = collect(client, 400, 0.8 * 0.9 ** np.arange(400.0) + 0.01)
    greedy = rollout_returns("CartPole-v1", lambda s: int(client.q_values(
        np.asarray(s)[None]).argmax()), 10, seed=99)
    # uniform random actions: about 22 a CartPole episode
    assert returns[-20:].mean() > 200 and greedy.mean() > 50


def test_replay_updates_the_readout_by_q_learning_on_drawn_transitions():
    """:func:`fedqhd.replay.replay`, by hand in float64: transitions drawn uniformly from
    the filled slots, :data:`BATCH` at a time, each batch's TD errors under the readout as
    the batch found it, no bootstrap where the episode terminated."""
    rng = np.random.default_rng(0)
    enc = HDEncoder(64, 1.0, random_state=1).fit(np.zeros((1, 3)))
    ring = ReplayRing(40, 3)
    for i in range(25):  # 25 of 40 slots filled: draws come from those only
        ring.add(rng.normal(size=3), i % 2, float(rng.normal()), rng.normal(size=3), i % 5 == 0)
    w = rng.normal(size=(2, 64))
    expected = w.copy()
    drawn = np.random.default_rng(7).integers(25, size=37)
    for start in range(0, 37, BATCH):
        rows = drawn[start:start + BATCH]
        phi = enc.encode32(ring.states[rows]).astype(np.float64)
        next_phi = enc.encode32(ring.next_states[rows]).astype(np.float64)
        before = expected.copy()
        for k, j in enumerate(rows):
            boot = 0.0 if ring.terminal[j] else 0.9 * (before @ next_phi[k]).max()
            a = ring.actions[j]
            expected[a] += 0.3 * (ring.rewards[j] + boot - before[a] @ phi[k]) * phi[k]
    replay(w, ring, enc.encode32, np.random.default_rng(7), 37, 0.3, 0.9)
    np.testing.assert_allclose(w, expected, rtol=1e-4, atol=1e-5)


def test_a_replay_ring_keeps_the_latest_transitions_and_a_restored_client_goes_on_alike():
    client = _td_client(td_rate=0.2, replay=2.0, replay_rate=0.05, replay_size=50)
    client.env = env = _Recording(client.env)
    collect(client, 4, 0.5)
    ring, steps = client.replay_ring, env.steps
    assert ring.filled == 50 and len(steps) > 50
    slot_of_last = (ring.position - 1) % 50
    for back in range(50):  # the latest 50 steps, newest in the slot before position
        s, a, r, s1, term = steps[-1 - back]
        j = (slot_of_last - back) % 50
        np.testing.assert_array_equal(ring.states[j], s)
        np.testing.assert_array_equal(ring.next_states[j], s1)
        assert (ring.actions[j], ring.rewards[j], ring.terminal[j]) == (a, r, term)
    twin = _td_client(td_rate=0.2, replay=2.0, replay_rate=0.05, replay_size=50)
    twin.restore(*client.snapshot())
    collect(client, 3, 0.5)
    collect(twin, 3, 0.5)
    np.testing.assert_array_equal(twin.readout, client.readout)
    assert twin.episode_returns == client.episode_returns


def test_replay_makes_a_td_client_learn_cartpole_faster():
    """Training return over episodes 81-100, the same client with and without replay
    (the same encoder, seed and epsilon), on each of four seeds."""
    spec = get_spec("CartPole-v1")
    epsilon = 0.5 * 0.95 ** np.arange(100.0) + 0.01
    gains = []
    for seed in range(4):
        last = []
        for replays in (0.0, 2.0):
            enc = HDEncoder(500, 1.0, scale=spec.obs_bound, random_state=seed).fit(
                np.zeros((1, 4)))
            client = OnlineClient("CartPole-v1", enc, gamma=0.95, capacity=0, n_parallel=1,
                                  seed=seed, update="td", td_rate=0.1, replay=replays,
                                  replay_rate=0.05, replay_size=5000)
            last.append(collect(client, 100, epsilon)[-20:].mean())
        gains.append(last[1] / last[0])
    assert min(gains) > 1.2 and np.mean(gains) > 1.8, gains


def test_replay_begins_after_the_clients_first_replay_start_episodes_across_rounds():
    """A client with ``replay_start=3`` learns exactly as one without replay over its
    first three episodes (collected in two rounds), keeping their transitions, and
    replays after its fourth, counted over its rounds, not within one."""
    late = _td_client(td_rate=0.2, replay=2.0, replay_rate=0.05, replay_start=3)
    plain = _td_client(td_rate=0.2)
    for n in (2, 1):  # two rounds: episodes 1-2, then 3
        collect(late, n, 0.5)
        collect(plain, n, 0.5)
        np.testing.assert_array_equal(late.readout, plain.readout)
    assert late.replay_ring.filled == late.n_transitions  # kept from the first episode
    collect(late, 1, 0.5)
    collect(plain, 1, 0.5)
    assert not np.array_equal(late.readout, plain.readout)


def test_replay_settings_are_checked():
    with pytest.raises(ValueError, match="replay must be >= 0"):
        _td_client(replay=-1.0)
    with pytest.raises(ValueError, match="replay_rate"):
        _td_client(replay=1.0, replay_rate=0.0)
    with pytest.raises(ValueError, match="replay_start must be >= 0"):
        _td_client(replay=1.0, replay_start=-1)
    with pytest.raises(ValueError, match="replay is a td client's"):
        OnlineClient("CartPole-v1", _td_client().encoder, replay=1.0)
    assert _td_client().replay_ring is None  # no replay: nothing kept
