"""Tests of fedqhd.data: collection, partitions, shard validation, cache, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedqhd.commands.main import main as fedqhd_main
from fedqhd.data import (
    ARRAY_SCHEMA,
    PARTITIONS,
    Shard,
    ShardError,
    client_shard,
    collect_shard,
    generate_client_shard,
    load_shard,
    partition_settings,
    pooled,
    save_shard,
)
from fedqhd.envs import get_spec


def assert_same_shard(a: Shard, b: Shard) -> None:
    for key in ARRAY_SCHEMA:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype and x.shape == y.shape, key
        np.testing.assert_array_equal(x, y, err_msg=key)
    assert a.metadata == b.metadata


@pytest.fixture(scope="module")
def cartpole() -> Shard:
    return collect_shard("CartPole-v1", 4, 0.5, seed=3)


# ---------------------------------------------------------------- collection


def test_collect_schema_and_metadata(cartpole: Shard) -> None:
    cartpole.validate()
    for key, (ndim, dtype) in ARRAY_SCHEMA.items():
        assert getattr(cartpole, key).dtype == dtype and getattr(cartpole, key).ndim == ndim
    assert cartpole.observations.shape == (cartpole.n_transitions, 4)
    meta = cartpole.metadata
    assert meta["behaviour"] == {"kind": "epsilon-heuristic", "epsilon": 0.5}
    assert meta["seed"] == 3 and meta["n_episodes"] == 4 == cartpole.n_episodes
    assert meta["dynamics"] == get_spec("CartPole-v1").dynamics_defaults
    json.dumps(meta)


def test_collect_is_deterministic(cartpole: Shard) -> None:
    assert_same_shard(cartpole, collect_shard("CartPole-v1", 4, 0.5, seed=3))
    other = collect_shard("CartPole-v1", 4, 0.5, seed=4)
    assert other.n_transitions != cartpole.n_transitions or not np.array_equal(
        other.observations, cartpole.observations
    )


def test_episodes_are_chained_and_end_once(cartpole: Shard) -> None:
    for ep in np.unique(cartpole.episode_ids):
        rows = np.flatnonzero(cartpole.episode_ids == ep)
        assert np.array_equal(rows, np.arange(rows[0], rows[-1] + 1))  # contiguous
        np.testing.assert_array_equal(
            cartpole.observations[rows[1:]], cartpole.next_observations[rows[:-1]]
        )
        done = cartpole.terminated[rows] | cartpole.truncated[rows]
        assert done[-1] and not done[:-1].any()


def test_truncation_is_not_termination() -> None:
    # the heuristic balances CartPole for the full 500 steps: truncated, never terminated
    shard = collect_shard("CartPole-v1", 2, 0.0, seed=0)
    assert shard.n_transitions == 1000
    assert shard.truncated.sum() == 2 and not shard.terminated.any()
    # MountainCar at epsilon 1 never reaches the goal in 200 steps
    mc = collect_shard("MountainCar-v0", 2, 1.0, seed=0)
    assert mc.n_transitions == 400 and mc.truncated.sum() == 2 and not mc.terminated.any()
    # random CartPole falls: terminated, not truncated
    cp = collect_shard("CartPole-v1", 3, 1.0, seed=0)
    assert cp.terminated.sum() == 3 and not cp.truncated.any()


def test_flags_survive_a_file_round_trip(tmp_path: Path) -> None:
    shard = pooled(
        [collect_shard("CartPole-v1", 1, 0.0, 0), collect_shard("CartPole-v1", 2, 1.0, 0)]
    )
    back = load_shard(save_shard(shard, tmp_path / "flags.npz"))
    np.testing.assert_array_equal(back.terminated, shard.terminated)
    np.testing.assert_array_equal(back.truncated, shard.truncated)
    assert back.truncated.sum() == 1 and back.terminated.sum() == 2


def test_epsilon_controls_behaviour_quality() -> None:
    good = collect_shard("Acrobot-v1", 3, 0.0, seed=1).episode_returns().mean()
    bad = collect_shard("Acrobot-v1", 3, 1.0, seed=1).episode_returns().mean()
    assert good > bad + 200


def test_collect_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="epsilon"):
        collect_shard("CartPole-v1", 1, 1.5, seed=0)
    with pytest.raises(ValueError, match="n_episodes"):
        collect_shard("CartPole-v1", 0, 0.5, seed=0)
    with pytest.raises(ValueError, match="may not override env_id"):
        collect_shard("CartPole-v1", 1, 0.5, seed=0, metadata_extra={"env_id": "x"})
    with pytest.raises(ValueError, match="unknown dynamics parameter"):
        collect_shard("CartPole-v1", 1, 0.5, seed=0, dynamics={"mass": 1.0})


def test_dynamics_recorded_and_used() -> None:
    long_pole = collect_shard("CartPole-v1", 2, 0.0, seed=0, dynamics={"length": 1.0})
    assert long_pole.metadata["dynamics"]["length"] == 1.0
    stock = collect_shard("CartPole-v1", 2, 0.0, seed=0)
    np.testing.assert_array_equal(long_pole.observations[0], stock.observations[0])  # same start
    assert not np.allclose(long_pole.observations[:50], stock.observations[:50])


# ---------------------------------------------------------------- partitions


def test_partition_settings() -> None:
    eps = [partition_settings("behaviour-skew", i, 5, 0)["epsilon"] for i in range(5)]
    np.testing.assert_allclose(eps, [0.8, 0.85, 0.9, 0.95, 1.0])
    assert partition_settings("behaviour-skew", 0, 1, 0)["epsilon"] == pytest.approx(0.9)
    for i in range(3):
        assert partition_settings("iid", i, 3, 0) == {"epsilon": pytest.approx(0.9), "dynamics": {}}
    dyn = [partition_settings("dynamics-skew", i, 4, 7, env_id="Acrobot-v1") for i in range(4)]
    ranges = get_spec("Acrobot-v1").dynamics_ranges
    for name, (lo, hi) in ranges.items():
        values = sorted(d["dynamics"][name] for d in dyn)
        assert len(set(values)) == 4 and lo < values[0] and values[-1] < hi
    assert all(d["epsilon"] == pytest.approx(0.9) for d in dyn)
    again = partition_settings("dynamics-skew", 2, 4, 7, env_id="Acrobot-v1")
    assert again == dyn[2]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("bogus", 0, 2, 0), {}, "unknown partition 'bogus'; valid: iid, behaviour-skew"),
        (("iid", 2, 2, 0), {}, r"partition_id must be an integer in 0..1, got 2"),
        (("iid", -1, 2, 0), {}, "partition_id"),
        (("iid", 0, 0, 0), {}, "num_partitions must be a positive integer"),
        (("iid", 0, 2, 0, 0.9, 0.5), {}, "epsilon_min <= epsilon_max"),
        (("dynamics-skew", 0, 2, 0), {}, "needs env_id"),
    ],
)
def test_partition_settings_validation(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        partition_settings(*args, **kwargs)


def test_client_shards_differ_per_client_and_partition() -> None:
    args = ("MountainCar-v0", "dynamics-skew")
    a = generate_client_shard(*args, 0, 2, 1, seed=0)
    b = generate_client_shard(*args, 1, 2, 1, seed=0)
    assert a.metadata["dynamics"] != b.metadata["dynamics"]
    assert a.metadata["seed"] != b.metadata["seed"]
    assert a.metadata["partition"] == "dynamics-skew" and b.metadata["partition_id"] == 1
    assert not np.array_equal(a.observations[:10], b.observations[:10])


# ---------------------------------------------------------------- pooled


def test_pooled_keeps_episodes_apart() -> None:
    a = collect_shard("CartPole-v1", 3, 1.0, seed=1)
    b = collect_shard("CartPole-v1", 2, 1.0, seed=2)
    p = pooled([a, b])
    p.validate()
    assert p.n_transitions == a.n_transitions + b.n_transitions
    assert p.n_episodes == 5 and p.metadata["n_episodes"] == 5
    np.testing.assert_allclose(
        p.episode_returns(), np.concatenate([a.episode_returns(), b.episode_returns()])
    )
    assert len(p.metadata["pooled_from"]) == 2
    with pytest.raises(ValueError, match="different environments"):
        pooled([a, collect_shard("MountainCar-v0", 1, 1.0, seed=0)])
    with pytest.raises(ValueError, match="at least one"):
        pooled([])


# ---------------------------------------------------------------- file I/O and validation


def test_save_load_roundtrip(tmp_path: Path, cartpole: Shard) -> None:
    path = save_shard(cartpole, tmp_path / "sub" / "s.npz")
    assert path == tmp_path / "sub" / "s.npz" and path.is_file()
    assert_same_shard(cartpole, load_shard(path, expected_env_id="CartPole-v1"))
    assert not list(path.parent.glob("*.tmp"))


def _write(path: Path, shard: Shard, **changes) -> Path:
    """Write a shard file by hand, with some arrays replaced (None: removed)."""
    arrays: dict = {**shard.arrays(), "metadata": np.array(json.dumps(shard.metadata))}
    for key, value in changes.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    np.savez(path, **arrays)
    return path


def _meta(shard: Shard, **changes) -> np.ndarray:
    return np.array(json.dumps({**shard.metadata, **changes}))


def _bad_cases(s: Shard) -> dict[str, tuple[dict, str]]:
    n = s.n_transitions
    obs_nan = s.observations.copy()
    obs_nan[2, 1] = np.nan
    rew_inf = s.rewards.copy()
    rew_inf[0] = np.inf
    act = s.actions.copy()
    act[5] = 2
    neg_act = s.actions.copy()
    neg_act[0] = -1
    return {
        "missing": ({"rewards": None}, "missing arrays: rewards"),
        "unexpected": ({"extra": np.zeros(3)}, "unexpected arrays: extra"),
        "ndim": ({"actions": s.actions[:, None]}, r"actions has shape \(\d+, 1\), expected 1 dim"),
        "obs_ndim": ({"observations": s.observations.ravel()}, "observations has shape"),
        "dtype_obs": (
            {"observations": s.observations.astype(np.float64)},
            "observations has dtype float64, expected float32",
        ),
        "dtype_act": ({"actions": s.actions.astype(np.int32)}, "actions has dtype int32"),
        "dtype_flag": ({"terminated": s.terminated.astype(np.int8)}, "terminated has dtype int8"),
        "length": ({"rewards": s.rewards[:-1]}, f"inconsistent lengths: rewards has {n - 1} rows"),
        "obs_dim": (
            {"next_observations": s.next_observations[:, :3]},
            "next_observations has obs_dim 3, but CartPole-v1 observations have 4",
        ),
        "nan": (
            {"observations": obs_nan},
            r"observations has 1 non-finite values \(first in row 2",
        ),
        "inf": ({"rewards": rew_inf}, "rewards has 1 non-finite"),
        "action_range": (
            {"actions": act},
            r"actions out of range: 1 outside 0..1 \(first: 2 in row 5",
        ),
        "negative_action": ({"actions": neg_act}, "actions out of range"),
        "neg_episode": ({"episode_ids": s.episode_ids - 1}, "episode_ids must be >= 0"),
        "empty": (
            {k: getattr(s, k)[:0] for k in ARRAY_SCHEMA},
            "metadata n_episodes=4 but episode_ids hold 0|no transitions",
        ),
        "no_meta": ({"metadata": None}, "missing arrays: metadata"),
        "meta_json": ({"metadata": np.array("{not json")}, "metadata is not valid JSON"),
        "meta_nan": ({"metadata": np.array('{"env_id": NaN}')}, "metadata is not valid JSON"),
        "meta_list": ({"metadata": np.array("[1, 2]")}, "metadata must be a JSON object"),
        "meta_shape": ({"metadata": np.array(["{}", "{}"])}, "metadata must be a 0-d string"),
        "meta_env_missing": (
            {"metadata": np.array(json.dumps({"format_version": 1}))},
            "metadata lacks required key 'env_id'",
        ),
        "meta_env_unknown": ({"metadata": _meta(s, env_id="Pong-v5")}, "unknown env id 'Pong-v5'"),
        "meta_version": (
            {"metadata": _meta(s, format_version=99)},
            "unsupported format_version 99",
        ),
        "meta_episodes": (
            {"metadata": _meta(s, n_episodes=7)},
            "n_episodes=7 but episode_ids hold 4",
        ),
        "meta_types": ({"metadata": _meta(s, dynamics=[1])}, "'dynamics' must be a JSON dict"),
        "env_mismatch": (
            {"metadata": _meta(s, env_id="Acrobot-v1")},
            r"env spec mismatch: .* but Acrobot-v1 here has .*obs_shape: shard \[4\], env \[6\]",
        ),
        "env_mismatch_unrecorded": (  # a shard of older code, without env_spec
            {"metadata": np.array(json.dumps({k: v for k, v in
                                              {**s.metadata, "env_id": "Acrobot-v1"}.items()
                                              if k != "env_spec"}))},
            "observations has obs_dim 4, but Acrobot-v1 observations have 6",
        ),
    }


@pytest.mark.parametrize("case", list(_bad_cases(collect_shard("CartPole-v1", 1, 0.0, 0)).keys()))
def test_load_rejects_bad_shard(tmp_path: Path, cartpole: Shard, case: str) -> None:
    changes, message = _bad_cases(cartpole)[case]
    path = _write(tmp_path / f"bad-{case}.npz", cartpole, **changes)
    with pytest.raises(ShardError, match=message) as info:
        load_shard(path)
    assert str(info.value).startswith(f"{path}: ")


def test_load_rejects_env_mismatch(tmp_path: Path, cartpole: Shard) -> None:
    path = save_shard(cartpole, tmp_path / "cp.npz")
    with pytest.raises(ShardError, match="env mismatch: shard is 'CartPole-v1', expected 'Acrobot"):
        load_shard(path, expected_env_id="Acrobot-v1")


def test_load_rejects_unreadable_files(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"this is not a zip archive")
    npy = tmp_path / "array.npy"
    np.save(npy, np.zeros(3))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, metadata=np.array([{"a": 1}], dtype=object))
    for path, message in [
        (tmp_path / "missing.npz", "no such file"),
        (garbage, "cannot read as a .npz archive"),
        (npy, "not a .npz archive"),
        (pickled, "cannot read as a .npz archive"),
        (tmp_path, "is a directory|cannot read"),
    ]:
        with pytest.raises(ShardError, match=message) as info:
            load_shard(path)
        assert str(info.value).startswith(str(path))
    assert issubclass(ShardError, ValueError)


def test_save_refuses_invalid_shard(tmp_path: Path, cartpole: Shard) -> None:
    bad = Shard(
        **{**cartpole.arrays(), "actions": cartpole.actions + 5}, metadata=cartpole.metadata
    )
    with pytest.raises(ShardError, match="actions out of range"):
        save_shard(bad, tmp_path / "x.npz")
    nan_meta = Shard(**cartpole.arrays(), metadata={**cartpole.metadata, "note": float("nan")})
    with pytest.raises(ShardError, match="not JSON-serialisable"):
        save_shard(nan_meta, tmp_path / "y.npz")
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- client shards and cache


def test_client_shard_cache_hit_identical(tmp_path: Path) -> None:
    args = ("CartPole-v1", "behaviour-skew", 1, 3, 2, 11)
    first = client_shard(*args, cache_dir=str(tmp_path))
    files = list(tmp_path.glob("*.npz"))
    assert len(files) == 1 and "behaviour-skew-1of3" in files[0].name
    mtime = files[0].stat().st_mtime_ns
    second = client_shard(*args, cache_dir=str(tmp_path))
    assert_same_shard(first, second)
    assert files[0].stat().st_mtime_ns == mtime  # read, not rewritten
    assert_same_shard(first, generate_client_shard(*args))
    # any other setting is another cache entry
    client_shard(*args, cache_dir=str(tmp_path), epsilon_max=0.95)
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_client_shard_default_cache_dir_from_env(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FEDQHD_CACHE_DIR", str(tmp_path / "c"))
    client_shard("MountainCar-v0", "iid", 0, 2, 1, 0)
    assert len(list((tmp_path / "c").glob("MountainCar-v0-iid-0of2-*.npz"))) == 1


def test_client_shard_corrupt_cache_regenerated(tmp_path: Path) -> None:
    args = ("CartPole-v1", "iid", 0, 2, 1, 0)
    good = client_shard(*args, cache_dir=tmp_path)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"corrupt")
    with pytest.warns(UserWarning, match="regenerating invalid cached shard"):
        again = client_shard(*args, cache_dir=tmp_path)
    assert_same_shard(good, again)
    assert_same_shard(good, load_shard(entry))


def test_client_shard_from_data_dir(tmp_path: Path, cartpole: Shard) -> None:
    save_shard(cartpole, tmp_path / "shard-0.npz")
    loaded = client_shard("CartPole-v1", "iid", 0, 2, 99, 99, data_dir=str(tmp_path))
    assert_same_shard(cartpole, loaded)
    with pytest.raises(ShardError, match=r"shard-1.npz: no shard for partition 1"):
        client_shard("CartPole-v1", "iid", 1, 2, 1, 0, data_dir=str(tmp_path))
    with pytest.raises(ShardError, match="env mismatch"):
        client_shard("Acrobot-v1", "iid", 0, 2, 1, 0, data_dir=str(tmp_path))
    tagged = Shard(**cartpole.arrays(), metadata={**cartpole.metadata, "partition_id": 3})
    save_shard(tagged, tmp_path / "shard-1.npz")
    with pytest.raises(ShardError, match="metadata partition_id is 3, but loaded for partition 1"):
        client_shard("CartPole-v1", "iid", 1, 2, 1, 0, data_dir=str(tmp_path))


# ---------------------------------------------------------------- CLI


def test_cli_generate_and_inspect(tmp_path: Path, capsys) -> None:
    out = tmp_path / "shards"
    argv = ["data", "generate", "--env", "Acrobot-v1", "--partition", "behaviour-skew"]
    argv += ["--num-partitions", "3", "--episodes", "1", "--seed", "5", "--out", str(out)]
    assert fedqhd_main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["settings"]["num_partitions"] == 3 and len(manifest["shards"]) == 3
    for i, entry in enumerate(manifest["shards"]):
        shard = load_shard(out / f"shard-{i}.npz", expected_env_id="Acrobot-v1")
        assert entry["n_transitions"] == shard.n_transitions
        assert shard.metadata["partition_id"] == i
        # the same data a client would generate itself
        assert_same_shard(shard, generate_client_shard("Acrobot-v1", "behaviour-skew", i, 3, 1, 5))
    assert [e["epsilon"] for e in manifest["shards"]] == pytest.approx([0.8, 0.9, 1.0])
    assert fedqhd_main(argv) == 2  # refuses to overwrite
    assert "--force" in capsys.readouterr().err

    assert fedqhd_main(["data", "inspect", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count(": ok") == 3 and "Acrobot-v1" in printed
    assert fedqhd_main(["data", "inspect", str(out / "shard-1.npz"), "--env", "CartPole-v1"]) == 1
    assert "env mismatch" in capsys.readouterr().err
    (out / "shard-2.npz").write_bytes(b"x")
    assert fedqhd_main(["data", "inspect", str(out)]) == 1
    assert "shard-2.npz: cannot read" in capsys.readouterr().err


def test_partitions_constant() -> None:
    assert PARTITIONS == ("iid", "behaviour-skew", "dynamics-skew")
