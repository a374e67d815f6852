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
