"""Privacy that holds across runs: secure fresh noise by default, and one on-disk ledger
per shard whose budget every run and restart of a node shares."""

from __future__ import annotations

import json
import math
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
    assert math.isfinite(pl.ledger_metrics(a, led, 0, fresh)[C.EPSILON])

    seeded = fresh
    c, led = _release(seeded, **SEEDED)
    d, _ = _release(seeded, **SEEDED)
    np.testing.assert_array_equal(c.n_sa, d.n_sa)
    np.testing.assert_array_equal(c.n_sas, d.n_sas)
    assert c.noise == "numpy-seeded (NOT secure)"
    metrics = pl.ledger_metrics(c, led, 0, seeded)
    assert metrics[C.NOISE_REPRODUCIBLE] == 1
    # whoever holds the run config regenerates the noise: no finite epsilon
    assert metrics[C.EPSILON] == metrics[C.EPSILON_CKS] == metrics[C.EPSILON_EXACT] == math.inf
    assert led.entries[-1]["reproducible"] is True


def test_releases_of_one_shard_share_one_budget_on_disk(tmp_path, private_ledger_dir):
    cfg = _cfg(tmp_path, **{"privacy-rho": 4.0})  # budget 10
    node = {**NUMPY, "rho": 4.0}  # a node that allows releases of rho 4
    _release(cfg, **node)
    _, second = _release(cfg, **node)  # a new run (or restarted node) on the same shard
    assert second.rho_spent == pytest.approx(8.0)
    with pytest.raises(BudgetExceededError, match=r"rho=4 refused; spent 8 of budget 10"):
        _release(cfg, **node)
    _, other = _release(cfg, pid=1, **node)  # a different shard has its own ledger
    assert other.rho_spent == pytest.approx(4.0)
    files = sorted(private_ledger_dir.glob("*.json"))
    assert len(files) == 2
    stored = [json.loads(f.read_text()) for f in files]
    assert sorted(s["rho_spent"] for s in stored) == [4.0, 8.0]
    assert all(f.stat().st_mode & 0o077 == 0 for f in files)  # what a node spent is its own
    # a node-config directory is honoured, and starts its own ledgers
    _, elsewhere = _release(cfg, **node, **{"ledger-dir": str(tmp_path / "node-a")})
    assert elsewhere.rho_spent == pytest.approx(4.0)
    assert len(list((tmp_path / "node-a").glob("*.json"))) == 1


def test_a_release_beyond_the_budget_is_a_failed_reply_in_a_new_run(tmp_path):
    cfg = _cfg(tmp_path, **{"privacy-rho": 6.0})
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


#: a node's own privacy, as its operator sets it: OpenDP noise, budget 2, at most 1.5 a release
NODE_OWNED = {"noise": "opendp", "rho-budget": 2.0, "rho": 1.5, "reproducible-noise": False}


def test_the_run_config_cannot_loosen_a_nodes_privacy(tmp_path, private_ledger_dir):
    """The real ServerApp and ClientApps: a run asking for non-private releases and a huge
    rho, or naming the node's own keys, loosens nothing; a run may ask for more privacy."""
    from flwr.app import Context, RecordDict

    from fedqhd.config import ConfigError
    from fedqhd.learners import pool as pool_learner
    from fedqhd.pool import count_visits
    from fedqhd.seeding import pool_data_seed
    from fedqhd.server.app import RunFailed
    from fedqhd.server.app import main as server_main

    preset = write_preset(tmp_path, "pool-small", trajectories=200, **{"eval-episodes": 50})
    loose = {**SMALL, "preset": preset, "non-private": True, "privacy-rho": 1000.0}

    def serve(run_config: dict, name: str) -> tuple[InProcessGrid, dict]:
        run_config = {**run_config, "output-dir": str(tmp_path / name)}
        grid = InProcessGrid([client_app] * 2, run_config=run_config,
                             node_configs=[NODE_OWNED] * 2)
        server_main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                                  run_config=run_config))
        return grid, json.loads(next((tmp_path / name).glob("*/*/results.json")).read_text())

    def on_disk() -> list[dict]:
        return [json.loads(f.read_text()) for f in sorted(private_ledger_dir.glob("*.json"))]

    # the node's keys are no run-config keys: refused by name, by the ServerApp ...
    for key, value in {"pool-rho-budget": 1e6, "pool-noise": "none",
                       "reproducible-noise": True, "rho-budget": 1e6, "noise": "none"}.items():
        with pytest.raises(ConfigError, match=rf"unknown run-config key.*'{key}' -> node-config"):
            serve({**loose, key: value}, f"refused-{key}")
        # ... and by every ClientApp, before it releases anything
        cfg = RunConfig.from_run_config({**loose, "output-dir": str(tmp_path / "c")})
        grid = InProcessGrid([client_app] * 2, run_config={**cfg.to_run_config(), key: value},
                             node_configs=[NODE_OWNED] * 2)
        # (both refuse it the same way: the run ends at round 1 with that error)
        with pytest.raises(RunFailed, match=rf"all 2 replies .* same error: ConfigError: "
                                            rf"unknown run-config key.*'{key}' -> node-config"):
            run_federation(grid, cfg)
    assert on_disk() == []

    # non-private = true and privacy-rho = 1000: the nodes draw OpenDP noise at their own 1.5
    grid, first = serve(loose, "loose")
    assert first["final"]["status"] == "completed"
    for entry in first["final"]["privacy-ledgers"].values():
        assert entry["private"] is True and entry["rho-spent"] == pytest.approx(1.5)
        assert entry["noise-secure"] == 1 and entry["noise-reproducible"] == 0
        assert 0 < entry["epsilon"] < math.inf
    cfg = RunConfig.from_run_config({**loose, "output-dir": str(tmp_path)})
    zones, cells = pl.zoning(cfg)
    for context in grid.contexts.values():
        pid = int(context.node_config["partition-id"])
        data = pl.generate_dataset(pl.inventory_model(cfg), cfg.pool.trajectories,
                                   random_state=pool_data_seed(cfg.seed, pid))
        released = context.state[pool_learner.STATE_COUNTS]["n_sas"].numpy()
        assert not np.array_equal(released, count_visits(data.states, data.actions, zones,
                                                         cells).n_sas)  # noise was drawn
    assert [[(e["rho"], e["noise"]) for e in led["entries"]] for led in on_disk()] == [
        [(0.75, "opendp-discrete-gaussian")] * 2] * 2

    # a run may ask for more privacy: privacy-rho 0.25 fits the 0.5 left
    _, stricter = serve({**loose, "privacy-rho": 0.25}, "stricter")
    assert [e["rho-spent"] for e in stricter["final"]["privacy-ledgers"].values()] == [1.75] * 2

    # the next loose run would take each shard past its node's budget: refused, on disk too
    # (both clients refuse it the same way: the run ends at round 1, RoundFailed)
    with pytest.raises(RunFailed, match="all 2 replies of a round failed with the same error"):
        serve(loose, "past-budget")
    past = json.loads(next((tmp_path / "past-budget").glob("*/*/results.json")).read_text())
    assert past["final"]["replies"][C.REPLIES_FAILED] == 2
    assert [led["rho_spent"] for led in on_disk()] == [pytest.approx(1.75)] * 2
    assert all(led["budget_rho"] == 2.0 for led in on_disk())


def test_fedqhd_privacy_ledgers_reports_seeded_noise_as_infinite_epsilon(tmp_path, capsys):
    from fedqhd.commands.main import main

    cfg = _cfg(tmp_path)
    _release(cfg, 0, **NUMPY, **{"ledger-dir": str(tmp_path / "fresh")})
    _release(cfg, 0, **SEEDED, **{"ledger-dir": str(tmp_path / "seeded")})
    assert main(["privacy", "ledgers", "--ledger-dir", str(tmp_path / "fresh")]) == 0
    fresh = capsys.readouterr().out
    assert "rho spent 1 of 10" in fresh and "(exact-gaussian)" in fresh and "inf" not in fresh
    assert main(["privacy", "ledgers", "--ledger-dir", str(tmp_path / "seeded")]) == 0
    assert "epsilon at delta 1e-05: inf (regenerable" in capsys.readouterr().out


def test_a_ledger_folder_is_tightened_to_0700_whatever_the_umask_or_its_mode(
        tmp_path, private_ledger_dir, monkeypatch):
    """Another local user must not delete a ledger (and so reset a budget): a folder made
    under umask 000, or chmod 0777 since, is 0700 once a release opens it; one another
    user owns is refused."""
    import os

    old = os.umask(0)
    try:
        private_ledger_dir.mkdir(mode=0o777)
        assert private_ledger_dir.stat().st_mode & 0o777 == 0o777
        store = LedgerStore(private_ledger_dir)
        fp = data_fingerprint(np.arange(3))
        with store.open(fp, 1.0, 1e-5, "c") as ledger:
            ledger.spend(0.5)
        assert private_ledger_dir.stat().st_mode & 0o777 == 0o700
        assert store.path(fp).stat().st_mode & 0o777 == 0o600
        fresh = LedgerStore(tmp_path / "new" / "ledgers")  # made under umask 000
        with fresh.open(fp, 1.0, 1e-5, "c") as ledger:
            ledger.spend(0.5)
        assert fresh.directory.stat().st_mode & 0o777 == 0o700
    finally:
        os.umask(old)
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # as if another user owned it
    with pytest.raises(LedgerFileError, match=r"owned by uid \d+, not by this user"), \
            store.open(fp, 1.0, 1e-5, "c"):
        pass
