"""Huge but finite data (issue 11): shard values within the env's bounds, archive caps
checked before decompressing, the learner's memory estimate and refusal, anchor files."""

import io
import json
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

from fedqhd.anchors import load_anchors
from fedqhd.config import ConfigError, RunConfig
from fedqhd.data import Shard, ShardError, ShardLimits, load_shard, save_shard, shards_from_arrays
from fedqhd.data.shard import VALUE_TOLERANCE
from fedqhd.encoders import shared_encoder_params
from fedqhd.envs import get_spec, register_env, unregister_env
from fedqhd.learners.fqi import FQILearner
from fedqhd.memory import FitMemoryError, fit_memory
from fedqhd.readout import RidgeFQI, StreamingRidgeFQI, distinct_state_count
from fedqhd.strategies import contract as C


def _shard(n: int = 40, env_id: str = "CartPole-v1", seed: int = 0) -> Shard:
    rng = np.random.default_rng(seed)
    d = get_spec(env_id).obs_dim
    obs = rng.uniform(-0.05, 0.05, size=(n + 1, d)).astype(np.float32)
    done = np.zeros(n, dtype=bool)
    done[-1] = True
    return shards_from_arrays(obs[:-1], rng.integers(0, get_spec(env_id).n_actions, n),
                              np.ones(n, dtype=np.float32), obs[1:], done, np.zeros(n, bool),
                              env_id=env_id)[0]


def _write_raw(path, shard: Shard, compressed: bool = False, **changes) -> None:
    """Save without validation (what a careless or hostile writer produces)."""
    arrays = {**shard.arrays(), **changes}
    save = np.savez_compressed if compressed else np.savez
    save(path, **arrays, metadata=np.array(json.dumps(shard.metadata)))


# ------------------------------------------------------------------ values within bounds
@pytest.mark.parametrize("field,row,col,value", [
    ("rewards", 3, None, 3e38),
    ("observations", 5, 1, 1e30),       # CartPole's cart velocity: an unbounded Box coordinate
    ("next_observations", 7, 3, -1e30),
])
def test_values_far_outside_the_bounds_are_refused_naming_field_value_and_bound(
        tmp_path, field, row, col, value):
    # mutation checked: `if value_check == "refuse": raise` -> never raising loads all three
    shard = _shard()
    bad = getattr(shard, field).copy()
    if col is None:
        bad[row] = value
    else:
        bad[row, col] = value
    path = tmp_path / "bad.npz"
    _write_raw(path, shard, **{field: bad})
    with pytest.raises(ShardError) as info:
        load_shard(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and f"{field} far outside CartPole-v1's bounds" in msg
    assert f"{value:.6g}" in msg and f"row {row}" in msg and "value-check" in msg
    if field == "rewards":  # the bound: reward range [0, 1] widened by 10 x its width
        assert "not in [-10, 11]" in msg and "[0, 1]" in msg
    else:  # cart velocity bound 3: [-3, 3] widened by 10 x 6; pole's 3.5: by 10 x 7
        assert ("not in [-63, 63]" if col == 1 else "not in [-73.5, 73.5]") in msg


def test_the_tolerance_is_ten_bound_widths_beyond_the_bound():
    # mutation checked: VALUE_TOLERANCE 10 -> 1 refuses the velocity of 50 below
    assert VALUE_TOLERANCE == 10.0
    shard = _shard()
    shard.observations[0, 1] = 62.9   # inside 3 + 10 x 6
    shard.rewards[0] = -9.9           # inside 0 - 10 x 1
    shard.validate()
    shard.observations[0, 1] = 63.1
    with pytest.raises(ShardError, match="observations far outside"):
        shard.validate()


def test_warn_flags_and_keeps_the_shard_and_off_does_not_look(tmp_path):
    # mutation checked: dropping `flags.append(problem)` leaves value_flags empty
    shard = _shard()
    rewards = shard.rewards.copy()
    rewards[2] = 3e38
    path = tmp_path / "flagged.npz"
    _write_raw(path, shard, rewards=rewards)
    with pytest.warns(UserWarning, match="rewards far outside .*value-check = \"warn\": kept"):
        loaded = load_shard(path, limits=ShardLimits(value_check="warn"))
    assert loaded.rewards[2] == np.float32(3e38)
    assert len(loaded.value_flags) == 1 and "3e+38" in loaded.value_flags[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_shard(path, limits=ShardLimits(value_check="off")).value_flags == []
    # non-finite values are refused whatever the setting
    rewards[2] = np.inf
    _write_raw(path, shard, rewards=rewards)
    with pytest.raises(ShardError, match="non-finite"):
        load_shard(path, limits=ShardLimits(value_check="off"))


def test_value_check_is_the_nodes_own_and_imports_take_it():
    from fedqhd.node_config import NodeConfigError, NodeSettings

    assert NodeSettings.of({}).value_check == "refuse"
    assert NodeSettings.of({"value-check": "warn"}).value_check == "warn"
    with pytest.raises(NodeConfigError, match="'value-check' = 'sometimes'.*refuse, warn, off"):
        NodeSettings.of({"value-check": "sometimes"})
    with pytest.raises(ConfigError, match="unknown run-config key.*value-check"):
        RunConfig.from_run_config({"value-check": "off"})  # the run submitter cannot lift it
    shard = _shard()
    obs = shard.observations.copy()
    obs[0, 3] = 1e30
    args = (obs, shard.actions, shard.rewards, shard.next_observations, shard.terminated,
            shard.truncated)
    with pytest.raises(ShardError, match="observations far outside"):
        shards_from_arrays(*args, env_id="CartPole-v1")
    with pytest.warns(UserWarning):
        flagged = shards_from_arrays(*args, env_id="CartPole-v1", value_check="warn")[0]
    assert len(flagged.value_flags) == 1


class _Line:
    """A user env: a point on a line, unbounded Box, no bounds known to fedqhd."""

    @staticmethod
    def make():
        import gymnasium as gym
        from gymnasium.spaces import Box, Discrete

        class Line(gym.Env):
            observation_space = Box(-np.inf, np.inf, (2,), np.float32)
            action_space = Discrete(2)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                self.x = np.zeros(2, dtype=np.float32)
                return self.x, {}

            def step(self, action):
                self.x = self.x + np.float32(1 if action else -1)
                return self.x, 1.0, False, False, {}

        return Line()


@pytest.fixture
def user_envs():
    register_env("test/LineData-v0", _Line.make, obs_bound="data", max_episode_steps=20)
    register_env("test/LineGiven-v0", _Line.make, obs_bound=[5.0, 5.0], max_episode_steps=20,
                 reward_range=(0.0, 1.0))
    yield
    unregister_env("test/LineData-v0")
    unregister_env("test/LineGiven-v0")


def test_user_envs_are_checked_only_against_the_bounds_they_give(user_envs):
    # mutation checked: `if spec.obs_bound_source == "given"` -> `if True` refuses the
    # inferred-bound env's huge observation
    n = 10
    obs = np.zeros((n, 2), dtype=np.float32)
    obs[4, 0] = 1e30
    rewards = np.ones(n, dtype=np.float32)
    rewards[5] = 1e30
    args = (obs, np.zeros(n, int), rewards, obs, np.zeros(n, bool), np.zeros(n, bool))
    assert get_spec("test/LineData-v0").obs_bound_source == "data"
    shards_from_arrays(*args, env_id="test/LineData-v0")  # only non-finite refused
    with pytest.raises(ShardError, match="observations far outside test/LineGiven-v0's"):
        shards_from_arrays(*args, env_id="test/LineGiven-v0")
    obs[4, 0] = 0.0
    with pytest.raises(ShardError, match="rewards far outside test/LineGiven-v0's"):
        shards_from_arrays(*args, env_id="test/LineGiven-v0")
    with pytest.raises(ValueError, match="reward_range must be"):
        register_env("test/Bad-v0", _Line.make, reward_range=(1.0, 0.0))


def test_built_in_shards_lie_well_inside_their_bounds():
    from fedqhd.data import generate_client_shard
    for env_id in ("CartPole-v1", "Acrobot-v1", "MountainCar-v0"):
        generate_client_shard(env_id, "iid", 0, 1, 3, 0, 1.0, 1.0).validate()


# ------------------------------------------------------------------ archive caps
def _forbid_np_load(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("np.load called: the archive was decompressed")
    monkeypatch.setattr(np, "load", refuse)


def test_a_zip_bomb_is_refused_before_it_is_decompressed(tmp_path, monkeypatch):
    # mutation checked: removing the `_check_archive(...)` call in load_shard decompresses
    # the archive (np.load is called) and this test fails
    n = 400_000  # 21.6 MB of arrays, ~30 kB compressed
    zeros = np.zeros((n, 4), dtype=np.float32)
    arrays = {"observations": zeros, "actions": np.zeros(n, np.int64),
              "rewards": np.ones(n, np.float32), "next_observations": zeros,
              "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
              "episode_ids": np.zeros(n, np.int64)}
    path = tmp_path / "bomb.npz"
    np.savez_compressed(path, **arrays, metadata=np.array('{"format_version": 1, '
                                                          '"env_id": "CartPole-v1"}'))
    assert path.stat().st_size < 200_000
    _forbid_np_load(monkeypatch)
    with pytest.raises(ShardError, match=r"bomb.npz: the archive would expand \d+-fold.*"
                                         r"max-compression-ratio = 100"):
        load_shard(path)
    monkeypatch.undo()
    assert load_shard(path, limits=ShardLimits(max_compression_ratio=1e6)).n_transitions == n


def test_rows_are_capped_before_loading_and_honest_compressed_shards_load(tmp_path, monkeypatch):
    # mutation checked: `rows > limits.max_transitions` -> `False` loads the 40-row shard
    shard = _shard(40)
    path = tmp_path / "small.npz"
    _write_raw(path, shard, compressed=True)
    assert load_shard(path).n_transitions == 40  # a compressed honest shard
    _forbid_np_load(monkeypatch)
    with pytest.raises(ShardError, match="observations declares 40 rows, more than "
                                         "max-shard-transitions = 39"):
        load_shard(path, limits=ShardLimits(max_transitions=39))
    extra = tmp_path / "extra.npz"
    with zipfile.ZipFile(extra, "w") as archive:
        archive.writestr("observations.npy", b"")
        archive.writestr("junk.npy", b"\x00" * 10)
    with pytest.raises(ShardError, match="unexpected arrays: junk"):
        load_shard(extra)
    from fedqhd.node_config import NodeConfigError, NodeSettings

    assert NodeSettings.of({"max-shard-transitions": 5}).max_shard_transitions == 5
    with pytest.raises(NodeConfigError, match="'max-compression-ratio'"):
        NodeSettings.of({"max-compression-ratio": 0.5})
    with pytest.raises(ValueError, match="max_compression_ratio"):
        ShardLimits(max_compression_ratio=0.5)


def _npy_member(shape: tuple[int, ...], dtype: str, data: bytes = b"") -> bytes:
    """A ``.npy`` file whose header declares ``shape`` and ``dtype``, then ``data``."""
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + data


@pytest.mark.parametrize("member, shape, dtype", [
    ("observations", (1, 10**12), "<f4"),         # one row, a huge second dimension
    ("rewards", (10**11 // 4,), "<f4"),           # rows under no cap, bytes far over the file
    ("metadata", (), "<U100000000"),              # a 400 MB string
])
def test_a_header_declaring_more_than_its_member_holds_is_refused_before_allocating(
        tmp_path, monkeypatch, capsys, member, shape, dtype):
    # mutation checked: `nbytes > info.file_size - header_bytes` -> `False` lets np.load
    # allocate the declared array (a raw MemoryError, or here the np.load trap)
    path = tmp_path / "shard-0.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{member}.npy", _npy_member(shape, dtype, b"\x00" * 16))
    assert path.stat().st_size < 400
    _forbid_np_load(monkeypatch)
    with pytest.raises(ShardError, match=rf"shard-0.npz: {member} declares shape .* but its "
                                         r"member holds 16 bytes of data; refused before "
                                         "allocating"):
        load_shard(path, limits=ShardLimits(max_transitions=2**62))
    monkeypatch.undo()
    from fedqhd.commands.main import main

    assert main(["data", "inspect", str(path)]) == 1
    out = capsys.readouterr()
    assert out.err.startswith("invalid: ") and "Traceback" not in out.err + out.out


def test_a_single_npy_file_is_refused_before_it_is_loaded(tmp_path, monkeypatch):
    path = tmp_path / "shard-0.npz"
    path.write_bytes(_npy_member((1, 10**12), "<f4"))
    _forbid_np_load(monkeypatch)
    with pytest.raises(ShardError, match=r"not a .npz archive \(a single .npy array\?\)"):
        load_shard(path)


def test_inspect_refuses_or_lists_far_out_values(tmp_path, capsys):
    from fedqhd.commands.main import main
    shard = _shard()
    rewards = shard.rewards.copy()
    rewards[1] = 3e38
    _write_raw(tmp_path / "shard-0.npz", shard, rewards=rewards)
    assert main(["data", "inspect", str(tmp_path)]) == 1
    assert "rewards far outside" in capsys.readouterr().err
    with pytest.warns(UserWarning):
        assert main(["data", "inspect", str(tmp_path), "--value-check", "warn"]) == 0
    assert "flagged: rewards far outside CartPole-v1's bounds" in capsys.readouterr().out


def test_save_shard_validates_with_the_value_check_it_is_given(tmp_path):
    shard = _shard()
    shard.rewards[0] = 1e30
    with pytest.raises(ShardError, match="rewards far outside"):
        save_shard(shard, tmp_path / "s.npz")
    with pytest.warns(UserWarning):
        save_shard(shard, tmp_path / "s.npz", value_check="warn")


# ------------------------------------------------------------------ memory
def test_the_issues_shard_streams_automatically_and_a_too_large_fit_is_refused(monkeypatch):
    # the issue's case: 1e6 transitions at D = 2000 need 44.7 GiB in memory, 0.5 GiB streamed
    # (states and next states unshared: 2 n rows; one episode shares all but one: n + 1)
    assert fit_memory(10**6, 2000, 2, streaming=False) == 8 * (2 * 10**6 * 2000 + 2 * 2 * 2000**2
                                                              + 4 * 10**6)
    assert fit_memory(10**6, 2000, 2, streaming=False, states=10**6 + 1) == 8 * (
        (10**6 + 1) * 2000 + 2 * 2 * 2000**2 + 4 * 10**6)
    assert fit_memory(10**6, 2000, 2, streaming=True, obs_dim=4) < 2**29
    shard = _shard(400)
    encoder = shared_encoder_params(0, 64, 1.0).build(get_spec("CartPole-v1").obs_bound)
    # mutation checked: dropping the `fit_memory(...) > cap` clause of the streaming choice
    # builds the in-memory fit and this assertion fails
    cap = fit_memory(400, 64, 2, streaming=False, obs_dim=4, states=401) - 1
    learner = FQILearner(shard, encoder, 2, memory_cap=cap, chunk_size=50)
    assert isinstance(learner.fqi, StreamingRidgeFQI)
    assert isinstance(FQILearner(shard, encoder, 2, memory_cap=cap + 1).fqi, RidgeFQI)
    # mutation checked: `need <= cap` -> `True` in _check_memory lets both through
    with pytest.raises(FitMemoryError, match=r"needs about .* more than the cap of .*"
                                             r"memory-cap-gib.*lower hd-dim"):
        FQILearner(shard, encoder, 2, memory_cap=1000)
    with pytest.raises(FitMemoryError, match=r"in-memory fit holds one float64 feature row per "
                                             r"distinct state \(401 states of n = 400 .*use the "
                                             "streaming fit"):
        FQILearner(shard, encoder, 2, streaming=False, memory_cap=cap)
    # without a cap, the memory available now is the limit
    monkeypatch.setattr("fedqhd.learners.fqi.available_memory", lambda: 1000)
    with pytest.raises(FitMemoryError, match="more than the 1000 bytes of memory available"):
        FQILearner(shard, encoder, 2)


@pytest.mark.parametrize("n,dim,streaming,dtype", [
    (3000, 300, False, "float64"), (300, 1000, False, "float64"), (6000, 150, True, "float64"),
    (300, 1000, True, "float64"), (5000, 300, False, "float32"), (300, 1000, False, "float32")])
def test_the_estimate_bounds_what_the_fit_allocates(n, dim, streaming, dtype):
    # the estimate is what refusals rest on: it must cover the real peak without being loose
    # (mutation checked: the learner encoding states and next states separately, the old
    # two-matrix RidgeFQI, puts the in-memory peak above the estimate)
    shard = _shard(n)
    encoder = shared_encoder_params(0, dim, 1.0).build(get_spec("CartPole-v1").obs_bound)
    tracemalloc.start()
    try:
        FQILearner(shard, encoder, 2, streaming=streaming, memory_cap=1 << 40,
                   feature_dtype=dtype).train(1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    estimate = fit_memory(n, dim, 2, streaming=streaming, obs_dim=4,
                          states=distinct_state_count(shard.observations, shard.next_observations),
                          feature_bytes=8 if dtype == "float64" else 4)
    assert 0.4 * estimate < peak <= estimate


# ------------------------------------------------------------------ anchor files
@pytest.mark.parametrize("name,content,problem", [
    ("no-key.npz", {"states": np.zeros((3, 4))}, "the .npz has no 'anchors' array .it has: states"),
    ("shape.npz", {"anchors": np.zeros((3, 5))}, r"expected shape \(m, 4\)"),
    ("dtype.npz", {"anchors": np.array([["a"] * 4] * 3)}, "dtype <U1, expected real numbers"),
    ("bool.npz", {"anchors": np.ones((3, 4), bool)}, "dtype bool, expected real numbers"),
    ("nan.npz", {"anchors": np.full((3, 4), np.inf)}, "values must be finite .*12 non-finite"),
])
def test_a_malformed_npz_anchor_file_names_the_file_and_the_problem(tmp_path, name, content,
                                                                     problem):
    path = tmp_path / name
    np.savez(path, **content)
    with pytest.raises(ValueError, match=f"anchor file {path}: {problem}"):
        load_anchors(path, "CartPole-v1")


def test_npz_anchor_files_load_and_non_archives_are_refused(tmp_path):
    good = tmp_path / "good.npz"
    np.savez(good, anchors=np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(load_anchors(good, "CartPole-v1"),
                                  np.arange(12.0).reshape(3, 4))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match=f"anchor file {junk}: cannot read"):
        load_anchors(junk, "CartPole-v1")


# ------------------------------------------------------------------ in a run
def test_a_run_refuses_or_flags_a_far_out_shard_and_records_it(tmp_path):
    # mutation checked: not sending value-flags in fqi's train metrics leaves the rows
    # without it, and this test fails
    from fedqhd.client.app import app as client_app
    from fedqhd.data import generate_client_shard, shard_filename
    from fedqhd.server import app as server_app
    from fedqhd.server.inprocess import InProcessGrid

    data = tmp_path / "shards"
    data.mkdir()
    for i in range(3):
        shard = generate_client_shard("CartPole-v1", "iid", i, 3, 2, 0, 1.0, 1.0)
        if i == 2:
            shard.rewards[0] = 3e38  # the issue's example
        _write_raw(data / shard_filename(i), shard)
    rows = {}
    for check in ("refuse", "warn"):
        cfg = RunConfig(output_dir=str(tmp_path / check), data_dir=str(data), hd_dim=100,
                        num_server_rounds=1, eval_episodes=1, min_success_fraction=0.5)
        grid = InProcessGrid([client_app] * 3, run_config=cfg.to_run_config(),
                             node_configs=[{"value-check": check}] * 3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, out_dir = server_app.run_federation(grid, cfg)
        rows[check] = json.loads((out_dir / "results.json").read_text())["rounds"][0]
    # refused: the client fails (its error names the shard), the round goes on without it
    assert (rows["refuse"]["replies-failed"], rows["refuse"]["replies-ok"]) == (1, 2)
    assert C.VALUE_FLAGS not in rows["refuse"]
    # flagged: recorded in the row; the readout it yields is huge, and the server's norm
    # bound refuses it (counted with the flag even so)
    assert (rows["warn"]["replies-failed"], rows["warn"][C.VALUE_FLAGS]) == (0, 1)
    assert rows["warn"]["replies-norm-refused"] == 1
