"""Tests of fedqhd.data: collection, partitions, shard validation, cache, CLI."""

from __future__ import annotations

import json
import re
import shutil
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
from fedqhd.data.folder import shard_index
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
        (garbage, r"not a .npz archive \(no zip directory"),
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
    assert "shard-2.npz: not a .npz archive" in capsys.readouterr().err


def test_partitions_constant() -> None:
    assert PARTITIONS == ("iid", "behaviour-skew", "dynamics-skew")


# ---------------------------------------------------------------- CLI: bad input


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Run ``fedqhd`` (an argparse refusal included); its exit code and stderr."""
    try:
        code = fedqhd_main(list(argv))
    except SystemExit as exc:  # argparse: usage lines, then "error: argument ..."
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    """The only line of ``err`` (no progress bar before it, no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _generate(out: Path, n: int, *extra: str, env: str = "CartPole-v1") -> None:
    assert fedqhd_main(["data", "generate", "--env", env, "--num-partitions", str(n),
                        "--episodes", "1", "--out", str(out), *extra]) == 0


def _transitions(path: Path, rows: slice = slice(None)) -> Path:
    """A user's .npz of CartPole transitions (``rows`` of them) for ``data import``."""
    shard = collect_shard("CartPole-v1", 3, 1.0, seed=0)
    np.savez(path, **{k: getattr(shard, k)[rows] for k in ("observations", "actions",
                                                            "rewards", "next_observations",
                                                            "terminated", "truncated")})
    return path


def _import(npz: Path, out: Path, *extra: str) -> list[str]:
    return ["data", "import", "--npz", str(npz), "--env", "CartPole-v1", "--out", str(out),
            *extra]


# mutation checked: without the `rows == 0` check in arrays._floats the zero-length case
# says "cannot reshape array of size 0"; with read_npz's non-zip branch `return`ing (as
# before) the text and empty files get numpy's "pickled (object) data ... allow_pickle"
# line; without BadZipFile/EOFError in read_npz's except the bad CRC is a traceback
@pytest.mark.parametrize(("damage", "message"), [
    ("crc", r"cannot read as a .npz archive \(Bad CRC-32"),
    ("truncated", r"not a .npz archive \(no zip directory"),
    ("empty", r"not a .npz archive \(no zip directory"),
    ("json", r"not a .npz archive \(no zip directory"),
    ("zero rows", "observations: no transitions"),
])
def test_import_refuses_unreadable_or_empty_arrays_in_one_line(tmp_path: Path, capsys,
                                                               damage: str,
                                                               message: str) -> None:
    npz = _transitions(tmp_path / "mine.npz", slice(0, 0) if damage == "zero rows"
                       else slice(None))
    data = npz.read_bytes()
    if damage == "crc":
        npz.write_bytes(data[:200] + bytes([data[200] ^ 0xFF]) + data[201:])
    elif damage == "truncated":
        npz.write_bytes(data[:-100])
    elif damage == "empty":
        npz.write_bytes(b"")
    elif damage == "json":
        npz.write_text(json.dumps({"shards": []}))
    code, err = run_cli(capsys, *_import(npz, tmp_path / "out"))
    assert code == 2 and re.search(message, one_line(err)), err
    assert "allow_pickle" not in err and not (tmp_path / "out").exists()
    if damage not in ("zero rows", "crc"):  # inspect says the same, one "invalid:" line
        code, err = run_cli(capsys, "data", "inspect", str(npz))
        assert code == 1 and re.search(message, one_line(err)) and "invalid: " in err


# mutation checked: without writable_folder in _open_out a file as --out is "cannot write
# there (File exists)", not "is a file"; without the OSError -> ConfigError there,
# /proc/nope exits 1 via main's OSError line; with `type=Path` for --out, "" is the
# current folder and shard-0.npz lands in it
@pytest.mark.parametrize(("out", "message"), [
    ("afile", "--out afile: afile is a file, not a folder"),
    ("afile/sub", "--out afile/sub: afile is a file, not a folder"),
    ("", "argument --out: expected a path, got ''"),
    pytest.param("/proc/nope", "--out /proc/nope: cannot write there",
                 marks=pytest.mark.skipif(not Path("/proc/self").exists(), reason="Linux")),
])
@pytest.mark.parametrize("command", ["generate", "import"])
def test_an_output_folder_that_cannot_be_made_is_refused_up_front(
        tmp_path: Path, capsys, monkeypatch, out: str, message: str, command: str) -> None:
    npz = _transitions(tmp_path.parent / f"{tmp_path.name}.npz")
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("mine")
    argv = (["data", "generate", "--episodes", "1", "--out", out] if command == "generate"
            else _import(npz, Path(out)))
    if out == "":
        argv[-1] = ""
    code, err = run_cli(capsys, *argv)
    assert code == 2 and message in err.strip().splitlines()[-1], err
    assert "shards:" not in err  # refused before the progress bar
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


# mutation checked: with --seed `type=int` again, generate (after its progress bar) and
# import fail with "error: expected non-negative integer", naming no flag
@pytest.mark.parametrize("command", ["generate", "import"])
def test_a_negative_seed_is_refused_naming_the_flag(tmp_path: Path, capsys,
                                                    command: str) -> None:
    argv = (["data", "generate", "--episodes", "1", "--out", str(tmp_path / "s")]
            if command == "generate" else _import(_transitions(tmp_path / "m.npz"),
                                                  tmp_path / "s"))
    code, err = run_cli(capsys, *argv, "--seed", "-1")
    assert code == 2
    assert err.strip().splitlines()[-1].endswith("argument --seed: must be >= 0, got -1")
    assert not (tmp_path / "s").exists()


# mutation checked: without the check_client_shards(...) call in cmd_generate, each error
# comes after a "0/2" progress bar (two lines on stderr)
@pytest.mark.parametrize(("extra", "message"), [
    (["--epsilon-min", "0.9", "--epsilon-max", "0.5"], "need 0 <= epsilon_min <= epsilon_max"),
    (["--env", "FrozenLake-v1"], "FrozenLake-v1: no heuristic controller registered"),
    (["--env", "fedqhd/Inventory-v0", "--env-module", "fedqhd.envs.inventory"],
     "it has no EnvSpec"),
])
def test_generate_refuses_bad_settings_before_its_progress_bar(tmp_path: Path, capsys,
                                                               extra: list[str],
                                                               message: str) -> None:
    code, err = run_cli(capsys, "data", "generate", "--num-partitions", "2", "--episodes", "1",
                        "--out", str(tmp_path / "s"), *extra)
    assert code == 2 and message in one_line(err)
    assert not (tmp_path / "s").exists()


def _interrupt_after(monkeypatch, calls: int) -> None:
    """Ctrl-C during the next ``data generate``, after ``calls`` shards."""
    import fedqhd.commands.data as data_cli

    count = [0]

    def generate(*args, **kwargs):
        count[0] += 1
        if count[0] > calls:
            raise KeyboardInterrupt
        return generate_client_shard(*args, **kwargs)

    monkeypatch.setattr(data_cli, "generate_client_shard", generate)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


# mutation checked: with ShardSetWriter.__exit__ not removing the folder it created, the
# new folder is left (holding the staging folder); with ShardSetWriter.path giving
# `self.out / name` (writing in place, as before), the interrupted --force run has
# replaced the old set's shard-0/1.npz
def test_an_interrupted_generate_leaves_no_partial_set(tmp_path: Path, capsys,
                                                       monkeypatch) -> None:
    new, old = tmp_path / "new", tmp_path / "old"
    _generate(old, 4)
    before = _files(old)
    _interrupt_after(monkeypatch, 2)
    code, err = run_cli(capsys, "data", "generate", "--num-partitions", "5", "--episodes", "1",
                        "--out", str(new))
    assert code == 130 and err.strip().endswith("fedqhd data: interrupted")
    assert not new.exists()
    _interrupt_after(monkeypatch, 2)
    code, _ = run_cli(capsys, "data", "generate", "--num-partitions", "3", "--episodes", "1",
                      "--seed", "9", "--out", str(old), "--force")
    assert code == 130 and _files(old) == before  # the old set, untouched
    monkeypatch.undo()
    _generate(new, 5)  # a rerun without --force: nothing in the way
    assert fedqhd_main(["data", "inspect", str(new)]) == 0


# mutation checked: without the loop removing the old set's shards in
# ShardSetWriter.commit, shard-1/2.npz stay and inspect exits 1 ("beyond num_partitions");
# with would_replace listing the manifest only, the stale shard-5.npz (of a set without
# one) is no reason to refuse
@pytest.mark.parametrize("command", ["generate", "import"])
def test_force_leaves_exactly_the_new_set(tmp_path: Path, capsys, command: str) -> None:
    out = tmp_path / "s"
    _generate(out, 3)
    (out / "notes.txt").write_text("mine")
    (out / "shard-0.npz.bak").write_bytes(b"mine")
    if command == "generate":
        _generate(out, 1, "--force")
    else:
        assert fedqhd_main(_import(_transitions(tmp_path / "m.npz"), out, "--force")) == 0
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "notes.txt",
                                                     "shard-0.npz", "shard-0.npz.bak"]
    capsys.readouterr()
    assert fedqhd_main(["data", "inspect", str(out)]) == 0
    stale = tmp_path / "stale"
    stale.mkdir()
    save_shard(load_shard(out / "shard-0.npz"), stale / "shard-5.npz")
    code, err = run_cli(capsys, "data", "generate", "--num-partitions", "2", "--episodes", "1",
                        "--out", str(stale))
    assert code == 2 and "would overwrite shard-5.npz (use --force" in one_line(err)


def _damage(folder: Path, acrobot: Path, case: str) -> None:
    """Make the 3-shard CartPole folder ``folder`` inconsistent in one way."""
    if case == "missing":
        (folder / "shard-1.npz").unlink()
    elif case == "twice":
        shutil.copy(folder / "shard-0.npz", folder / "shard-1.npz")
    elif case == "mixed envs":
        shutil.copy(acrobot / "shard-2.npz", folder / "shard-2.npz")
        (folder / "manifest.json").unlink()
    elif case == "4 of 50":
        for p in folder.iterdir():
            p.unlink()
        _generate(folder, 50, "--force")
        for p in folder.iterdir():
            if p.name == "manifest.json" or shard_index(p) >= 4:
                p.unlink()
    elif case == "changed":
        shard = load_shard(folder / "shard-1.npz")
        shard.metadata["note"] = "edited"
        save_shard(shard, folder / "shard-1.npz")
    elif case == "manifest":
        (folder / "manifest.json").write_text("{not json")
    elif case == "fewer in manifest":
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["settings"]["num_partitions"] = 2
        manifest["shards"] = manifest["shards"][:2]
        (folder / "manifest.json").write_text(json.dumps(manifest))


# mutation checked, one at a time: without `_disagreements(valid)` in folder_problems,
# "mixed envs" passes; without `_partition_ids(valid)`, "twice" reports only the sha256
# line; without the `missing` block, "missing" and "4 of 50" pass; without the sha256
# comparison in _manifest_problems, "changed" passes
@pytest.mark.parametrize(("case", "lines"), [
    ("missing", ["missing 1 of 3 shards: shard-1.npz"]),
    ("twice", ["shard-1.npz holds partition 0 (its metadata's partition_id), which clients "
               "load from shard-0.npz", "partition 0 is in 2 files: shard-0.npz, shard-1.npz",
               "sha256 differs from manifest.json's (changed since it was written): "
               "shard-1.npz"]),
    ("mixed envs", ['the shards disagree on env_id: "CartPole-v1" (shard-0.npz, shard-1.npz); '
                    '"Acrobot-v1" (shard-2.npz)']),
    ("4 of 50", ["missing 46 of 50 shards: shard-4.npz, shard-5.npz, shard-6.npz, shard-7.npz,"
                 " shard-8.npz and 41 more"]),
    ("changed", ["sha256 differs from manifest.json's (changed since it was written): "
                 "shard-1.npz"]),
    ("manifest", ["manifest.json: cannot be read as JSON (Expecting property name enclosed "
                  "in double quotes: line 1 column 2 (char 1))"]),
    ("fewer in manifest", ["manifest.json says num_partitions = 2, the shards 3",
                           "beyond num_partitions = 2: shard-2.npz",
                           "not in manifest.json: shard-2.npz"]),
])
def test_inspect_reports_each_inconsistency_of_a_folder(tmp_path: Path, capsys, case: str,
                                                        lines: list[str]) -> None:
    folder, acrobot = tmp_path / "s", tmp_path / "acrobot"
    _generate(folder, 3)
    _generate(acrobot, 3, env="Acrobot-v1")
    capsys.readouterr()
    assert fedqhd_main(["data", "inspect", str(folder)]) == 0
    assert capsys.readouterr().err == ""
    _damage(folder, acrobot, case)
    capsys.readouterr()
    assert fedqhd_main(["data", "inspect", str(folder)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"inconsistent: {folder}: {line}"
                                                    for line in lines]
    single = sorted(folder.glob("shard-*.npz"))[-1]  # a file alone: as before
    assert fedqhd_main(["data", "inspect", str(single)]) == 0


# ---------------------------------------------------- paths that are no file or folder
class _Fifo:
    """A named pipe at ``path`` whose writer opens and closes it whenever it is read, so
    code that (wrongly) reads it gets an empty file instead of blocking the test."""

    def __init__(self, path: Path) -> None:
        import os
        import threading

        os.mkfifo(path)
        self.path, self._stop = path, threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        import os

        while not self._stop.is_set():
            os.close(os.open(self.path, os.O_WRONLY))  # blocks until a reader opens it

    def close(self) -> None:
        import os

        self._stop.set()
        for _ in range(50):  # unblock the writer: a reader that does not wait
            if not self._thread.is_alive():
                break
            os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))
            self._thread.join(0.1)


# mutation checked: with `_special` returning None, inspect and import of the pipe exit 1
# ("not a .npz archive", the pipe having been opened) instead of 2; without read_npz's
# S_ISREG check the pipe inside a folder is opened ("no zip directory"); with the inspect
# path and --npz typed `Path` again, "" is "." (inspect: "no shard-*.npz files", exit 1)
def test_inspect_and_import_refuse_a_path_that_is_no_file_or_folder(tmp_path: Path,
                                                                    capsys) -> None:
    fifo = _Fifo(tmp_path / "ff.npz")
    folder = tmp_path / "set"
    folder.mkdir()
    inner = _Fifo(folder / "shard-0.npz")
    try:
        says = "not a folder or a regular file (a device, pipe or socket?); not read"
        code, err = run_cli(capsys, "data", "inspect", str(fifo.path))
        assert code == 2 and one_line(err) == f"error: {fifo.path}: {says}"
        code, err = run_cli(capsys, *_import(fifo.path, tmp_path / "out"))
        assert code == 2 and one_line(err) == f"error: --npz {fifo.path}: {says}"
        code, err = run_cli(capsys, "data", "inspect", str(folder))
        assert code == 1 and one_line(err) == (f"invalid: {folder / 'shard-0.npz'}: not a "
                                               "regular file (a device, pipe or socket?); "
                                               "not read")
    finally:
        fifo.close()
        inner.close()
    for argv in (["data", "inspect", ""], _import(Path(""), tmp_path / "out")):
        code, err = run_cli(capsys, *[a if a != "." else "" for a in argv])
        assert code == 2 and one_line(err.splitlines()[-1]).endswith(
            "expected a path, got ''"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ff.npz", "set"]


# mutation checked, one at a time: without the n_transitions comparison, without the
# format_version check, and with `_settings_problems` finding no value different, the
# matching cases pass (exit 0); without `_recorded_seed`'s base_seed branch the generated
# seed case passes, and without its `seed` of an imported shard the "import" case does
@pytest.mark.parametrize(("edit", "line"), [
    (lambda m: m["shards"][1].update(n_transitions=1),
     "n_transitions differs from manifest.json's: shard-1.npz"),
    (lambda m: m["settings"].update(seed=7), "manifest.json says seed = 7, not so in "
                                             "shard-0.npz, shard-1.npz"),
    (lambda m: m["settings"].update(episodes=2), "manifest.json says episodes = 2, not so "
                                                 "in shard-0.npz, shard-1.npz"),
    (lambda m: m.update(format_version=99), "manifest.json: unsupported format_version 99 "
                                            "(this code reads 1)"),
    (lambda m: m.pop("format_version"), "manifest.json: unsupported format_version None "
                                        "(this code reads 1)"),
    ("import", "manifest.json says seed = 5, not so in shard-0.npz, shard-1.npz"),
])
def test_inspect_reports_a_manifest_setting_the_shards_record_otherwise(
        tmp_path: Path, capsys, edit, line: str) -> None:
    folder = tmp_path / "s"
    if edit == "import":
        assert fedqhd_main(_import(_transitions(tmp_path / "t.npz"), folder,
                                   "--num-partitions", "2")) == 0
    else:
        _generate(folder, 2)
    capsys.readouterr()
    assert fedqhd_main(["data", "inspect", str(folder)]) == 0
    assert capsys.readouterr().err == ""
    manifest = json.loads((folder / "manifest.json").read_text())
    if edit == "import":
        manifest["settings"]["seed"] = 5
    else:
        edit(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    before = _files(folder)
    assert fedqhd_main(["data", "inspect", str(folder)]) == 1
    assert capsys.readouterr().err.splitlines() == [f"inconsistent: {folder}: {line}"]
    assert _files(folder) == before
