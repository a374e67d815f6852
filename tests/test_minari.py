"""Minari datasets in and out: a locally made dataset round-trips through shards and a
federated run (extra ``minari``; nothing is downloaded)."""

import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

from fedqhd.commands.main import main as fedqhd_main
from fedqhd.config import RunConfig
from fedqhd.data import load_shard, save_shard

minari = pytest.importorskip("minari")


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A private Minari dataset folder (never the user's ~/.minari)."""
    path = tmp_path / "minari"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path


def _collect(dataset_id: str, episodes: int = 12, seed: int = 0):
    """A random-policy CartPole dataset, made locally with Minari's own collector."""
    env = minari.DataCollector(gym.make("CartPole-v1"))
    rng = np.random.default_rng(seed)
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            done = terminated or truncated
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return env.create_dataset(dataset_id=dataset_id, algorithm_name="random")


def _rows(dataset) -> np.ndarray:
    """Every transition of a Minari dataset as one sortable row."""
    rows = []
    for ep in dataset.iterate_episodes():
        rows.append(np.column_stack([ep.observations[:-1], ep.actions, ep.rewards,
                                     ep.observations[1:], ep.terminations, ep.truncations]))
    table = np.concatenate(rows).astype(np.float64)
    return table[np.lexsort(table.T[::-1])]


def test_minari_dataset_round_trips_through_shards_and_a_federated_run(root, tmp_path):
    from fedqhd.client.app import app as client_app
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    original = _collect("cartpole/random-v0")
    shards = tmp_path / "shards"
    assert fedqhd_main(["data", "import", "--minari", "cartpole/random-v0",
                        "--num-partitions", "3", "--out", str(shards)]) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    assert manifest["settings"]["env_id"] == "CartPole-v1"  # taken from the dataset
    assert sum(e["n_transitions"] for e in manifest["shards"]) == original.total_steps

    cfg = RunConfig(output_dir=str(tmp_path / "out"), env_id="CartPole-v1", hd_dim=300,
                    eval_episodes=2, num_server_rounds=2, seed=3)
    grid = InProcessGrid([client_app] * 3, run_config=cfg.to_run_config(),
                         node_configs=[{"data-dir": str(shards)}] * 3)
    final, _ = run_federation(grid, cfg)
    assert final["status"] == "completed" and final["replies"]["replies-ok"] == 6

    assert fedqhd_main(["data", "export", str(shards), "--minari", "cartpole/fedqhd-v0"]) == 0
    exported = minari.load_dataset("cartpole/fedqhd-v0")
    assert (exported.total_steps, exported.total_episodes) == (original.total_steps,
                                                               original.total_episodes)
    np.testing.assert_array_equal(_rows(exported), _rows(original))
    assert exported.spec.env_spec.id == "CartPole-v1"


def test_import_never_downloads_and_names_what_is_missing(root, tmp_path, capsys):
    assert fedqhd_main(["data", "import", "--minari", "cartpole/expert-v0",
                        "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "cartpole/expert-v0" in err and "minari download" in err
    assert not (tmp_path / "s").exists()


def test_export_refuses_broken_episodes_and_existing_ids(root, tmp_path, capsys):
    _collect("cartpole/random-v0", episodes=4)
    shards = tmp_path / "shards"
    assert fedqhd_main(["data", "import", "--minari", "cartpole/random-v0",
                        "--out", str(shards)]) == 0
    assert fedqhd_main(["data", "export", str(shards), "--minari", "cartpole/random-v0"]) == 2
    assert "exists" in capsys.readouterr().err

    shard = load_shard(shards / "shard-0.npz")
    order = np.random.default_rng(0).permutation(shard.n_transitions)  # rows out of order
    for key in ("observations", "actions", "rewards", "next_observations", "terminated",
                "truncated", "episode_ids"):
        setattr(shard, key, getattr(shard, key)[order])
    save_shard(shard, shards / "shard-0.npz")
    assert fedqhd_main(["data", "export", str(shards), "--minari", "cartpole/new-v0"]) == 2
    assert "not one chain" in capsys.readouterr().err
    assert "cartpole/new-v0" not in minari.list_local_datasets()


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """Run ``fedqhd``; its exit code and its one line on stderr (no traceback)."""
    code = fedqhd_main(list(argv))
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return code, lines[0]


def _tree(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() \
        else []


@pytest.fixture
def shards(tmp_path):
    folder = tmp_path / "shards"
    assert fedqhd_main(["data", "generate", "--num-partitions", "2", "--episodes", "1",
                        "--out", str(folder)]) == 0
    return folder


# mutation checked: with check_dataset_id returning at once, export raises minari's
# ValueError/TypeError and leaves <root>/<id>/data, and import says "not in ..." (exit 2,
# no "--minari:" prefix)
@pytest.mark.parametrize("dataset_id", ["not a valid id", "", "cartpole/test"])
def test_a_malformed_minari_id_is_refused_before_anything_is_made(root, tmp_path, shards,
                                                                  capsys, dataset_id):
    code, line = run_cli(capsys, "data", "export", str(shards), "--minari", dataset_id)
    assert code == 2 and line == (f"error: --minari: {dataset_id!r} is not a Minari dataset "
                                  "id: ids are (namespace/)name-v<version>, e.g. "
                                  "cartpole/fedqhd-v0")
    code, line = run_cli(capsys, "data", "import", "--minari", dataset_id,
                         "--out", str(tmp_path / "s"))
    assert code == 2 and line.startswith("error: --minari: ")
    assert not root.exists() and not (tmp_path / "s").exists()
    assert fedqhd_main(["data", "export", str(shards), "--minari", "cartpole/t5-v0"]) == 0


# mutation checked: without the rmtree of `created` in export_to_minari the interrupted
# export leaves cartpole/t5-v0/data, and the second export says "exists"
def test_a_failed_export_leaves_no_folder_behind(root, shards, capsys, monkeypatch):
    def interrupted(dataset_id, **kwargs):  # as if Ctrl-C came after minari made the folder
        (root / dataset_id / "data").mkdir(parents=True)
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:  # (undo() would drop root's MINARI_DATASETS_PATH)
        patch.setattr(minari, "create_dataset_from_buffers", interrupted)
        code, line = run_cli(capsys, "data", "export", str(shards), "--minari", "cartpole/t5-v0")
    assert code == 130 and line == "fedqhd data: interrupted"
    assert not root.exists()  # this export made it: removed again
    assert fedqhd_main(["data", "export", str(shards), "--minari", "cartpole/t5-v0"]) == 0
    assert _tree(root / "cartpole") == ["namespace_metadata.json", "t5-v0", "t5-v0/data",
                                        "t5-v0/data/main_data.hdf5", "t5-v0/data/metadata.json"]


# mutation checked: without the try/except in _local_datasets, minari's ValueError is a
# traceback
def test_a_folder_that_is_not_a_dataset_is_one_error(root, shards, tmp_path, capsys):
    (root / "not a valid id" / "data").mkdir(parents=True)
    for argv in (["export", str(shards), "--minari", "cartpole/t5-v0"],
                 ["import", "--minari", "cartpole/t5-v0", "--out", str(tmp_path / "s")]):
        code, line = run_cli(capsys, "data", *argv)
        assert code == 2 and line.startswith(f"error: minari cannot list the datasets in {root}")
    assert _tree(root) == ["not a valid id", "not a valid id/data"]
    assert not (tmp_path / "s").exists()


# mutation checked: without `writable_folder("--minari-root", ...)` in cmd_export the
# command goes on to read the shards first (here: "no such file")
def test_export_refuses_a_file_as_minari_root_up_front(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("mine")
    code, line = run_cli(capsys, "data", "export", str(tmp_path / "no-shards"), "--minari",
                         "cartpole/t4-v0", "--minari-root", str(afile))
    assert code == 2 and line == f"fedqhd data: error: --minari-root {afile}: {afile} is a " \
                                 "file, not a folder"
    assert afile.read_text() == "mine"


# mutation checked: calling _local_datasets(minari) in _load whether or not the folder
# exists makes minari create it
def test_import_from_a_missing_minari_root_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, line = run_cli(capsys, "data", "import", "--minari", "cartpole/x-v0",
                         "--minari-root", "nosuchroot", "--out", "m")
    assert code == 2 and f"is not in {tmp_path / 'nosuchroot'} (no such folder)" in line
    assert "minari download cartpole/x-v0" in line
    assert list(tmp_path.iterdir()) == []
