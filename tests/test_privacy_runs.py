"""Privacy that holds across runs: secure fresh noise by default, and one on-disk ledger
per shard whose budget every run and restart of a node shares."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from presets_util import write_preset

from fedqhd.client.app import app as client_app
from fedqhd.config import RunConfig
from fedqhd.learners import pool_federated as pl
from fedqhd.privacy import BudgetExceededError
from fedqhd.privacy.store import LedgerFileError, LedgerStore, data_fingerprint
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C

SMALL = {"learner": "pool", "env-id": "fedqhd/Inventory-v0", "num-server-rounds": 1,
         "num-anchors": 200, "anchor-source": "uniform", "min-nodes": 2}
NUMPY = {"noise": "numpy"}  #: a node that draws numpy noise (experiments only)
SEEDED = {"noise": "numpy", "reproducible-noise": True}  #: ... seeded from the run config


def _cfg(tmp_path: Path, **changes: object) -> RunConfig:
    preset = write_preset(tmp_path, "pool-small", trajectories=200, **{"eval-episodes": 200})
    return RunConfig.from_run_config({**SMALL, "preset": preset, "output-dir": str(tmp_path),
                                      **changes})


def _release(cfg: RunConfig, pid: int = 0, **node: object):
    return pl.release(cfg, pid, pl.ClientPrivacy.of(cfg, dict(node)))


def test_the_app_default_is_secure_fresh_noise_recorded_in_the_reply(tmp_path):
    cfg = _cfg(tmp_path)
    privacy = pl.ClientPrivacy.of(cfg, {})  # a node that says nothing
    assert privacy.noise == "opendp" and privacy.reproducible is False
    assert privacy.budget == 10.0 and cfg.pool.trajectories == 200
    counts, ledger = _release(cfg)
    assert counts.noise == "opendp-discrete-gaussian"
    metrics = pl.ledger_metrics(counts, ledger, 0, cfg)
    assert metrics[C.NOISE_SECURE] == 1 and metrics[C.NOISE_REPRODUCIBLE] == 0
    assert all(e["secure"] and not e["reproducible"] for e in ledger.entries)


def test_numpy_noise_is_fresh_unless_the_node_asks_for_reproducible_noise(tmp_path):
    fresh = _cfg(tmp_path)
    a, led = _release(fresh, **NUMPY)
    b, _ = _release(fresh, **NUMPY)  # same run config, same shard: an attacker's regeneration
    assert not np.array_equal(a.n_sas, b.n_sas)
    assert a.noise == "numpy-fresh-entropy (NOT secure)"
    assert pl.ledger_metrics(a, led, 0, fresh)[C.NOISE_REPRODUCIBLE] == 0

    seeded = fresh
    c, led = _release(seeded, **SEEDED)
    d, _ = _release(seeded, **SEEDED)
    np.testing.assert_array_equal(c.n_sa, d.n_sa)
    np.testing.assert_array_equal(c.n_sas, d.n_sas)
    assert c.noise == "numpy-seeded (NOT secure)"
    assert pl.ledger_metrics(c, led, 0, seeded)[C.NOISE_REPRODUCIBLE] == 1
    assert led.entries[-1]["reproducible"] is True


def test_releases_of_one_shard_share_one_budget_on_disk(tmp_path, private_ledger_dir):
    cfg = _cfg(tmp_path, **{"pool-rho": 4.0})  # budget 10
    _release(cfg, **NUMPY)
    _, second = _release(cfg, **NUMPY)  # a new run (or restarted node) on the same shard
    assert second.rho_spent == pytest.approx(8.0)
    with pytest.raises(BudgetExceededError, match=r"rho=4 refused; spent 8 of budget 10"):
        _release(cfg, **NUMPY)
    _, other = _release(cfg, pid=1, **NUMPY)  # a different shard has its own ledger
    assert other.rho_spent == pytest.approx(4.0)
    files = sorted(private_ledger_dir.glob("*.json"))
    assert len(files) == 2
    stored = [json.loads(f.read_text()) for f in files]
    assert sorted(s["rho_spent"] for s in stored) == [4.0, 8.0]
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)  # what a node spent is its own
    # a node-config directory is honoured, and starts its own ledgers
    _, elsewhere = _release(cfg, **NUMPY, **{"ledger-dir": str(tmp_path / "node-a")})
    assert elsewhere.rho_spent == pytest.approx(4.0)
    assert len(list((tmp_path / "node-a").glob("*.json"))) == 1


def test_a_release_beyond_the_budget_is_a_failed_reply_in_a_new_run(tmp_path):
    cfg = _cfg(tmp_path)
    # deterministic noise; budget 10: client 0 fits once, client 1 ten times
    nodes = [{"rho": 6.0, **SEEDED}, {"rho": 1.0, **SEEDED}]

    def run() -> dict:
        grid = InProcessGrid([client_app] * 2, run_config=cfg.to_run_config(),
                             node_configs=nodes)
        _, out_dir = run_federation(grid, cfg)
        return json.loads((out_dir / "results.json").read_text())

    first, second = run(), run()
    assert first["rounds"][0][C.REPLIES_OK] == 2
    row = second["rounds"][0]
    assert row[C.REPLIES_OK] == 1 and row[C.REPLIES_FAILED] == 1
    assert second["final"]["privacy-ledgers"]["1"]["rho-spent"] == pytest.approx(2.0)
    assert "0" not in second["final"]["privacy-ledgers"]


def test_an_unreadable_ledger_refuses_the_release(tmp_path, private_ledger_dir):
    store = LedgerStore(private_ledger_dir)
    fp = data_fingerprint(np.arange(3))
    assert fp != data_fingerprint(np.arange(3.0)) and fp == data_fingerprint(np.arange(3))
    with store.open(fp, 1.0, 1e-5, "c") as ledger:
        ledger.spend(0.5)
    assert store.read(fp).rho_spent == 0.5
    store.path(fp).write_text("{not json")
    with pytest.raises(LedgerFileError, match="unreadable"), store.open(fp, 1.0, 1e-5, "c"):
        pass
