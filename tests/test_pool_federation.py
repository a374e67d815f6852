"""POOL inside the federation: post-processing, refusal of noise-free clients, ledgers.

Everything runs in process (real ServerApp logic and ClientApp, no Ray) at small
sizes; the numbers of the study are in BENCHMARKS.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from presets_util import write_preset

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.envs.inventory import generate_dataset
from fedqhd.learners import parse_run_config
from fedqhd.learners import pool as pool_learner
from fedqhd.learners import pool_federated as pl
from fedqhd.pool import count_visits
from fedqhd.privacy import BudgetExceededError
from fedqhd.seeding import pool_data_seed
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import contract as C

SMALL = {"learner": "pool", "env-id": "fedqhd/Inventory-v0", "num-server-rounds": 1,
         "num-anchors": 300, "anchor-source": "uniform", "min-nodes": 2}
#: deterministic tests: nodes with seeded numpy noise (a node's default is OpenDP, fresh noise)
SEEDED = {"noise": "numpy", "reproducible-noise": True}
NO_NOISE = {"noise": "none", "reproducible-noise": False}  #: a node's consent to exact counts
OPENDP = {"noise": "opendp", "reproducible-noise": False}


def _cfg(tmp_path: Path, pool: dict | None = None, **changes) -> RunConfig:
    """A small POOL run: 300 trajectories and evaluation episodes, ``pool`` settings."""
    preset = write_preset(tmp_path, "pool-small", **{"trajectories": 300,
                                                     "eval-episodes": 300, **(pool or {})})
    return RunConfig.from_run_config({**SMALL, "preset": preset, "output-dir": str(tmp_path),
                                      **changes})


def _privacy(cfg: RunConfig, node: dict) -> pl.ClientPrivacy:
    return pl.ClientPrivacy.of(cfg, {**SEEDED, **node})


def _run(cfg: RunConfig, node_configs: list[dict], client_run_config: dict | None = None
         ) -> dict:
    """One in-process federation; returns results.json."""
    grid = InProcessGrid([client_app] * len(node_configs),
                         run_config=client_run_config or cfg.to_run_config(),
                         node_configs=[{**SEEDED, **node} for node in node_configs])
    _, out_dir = run_federation(grid, cfg)
    return json.loads((out_dir / "results.json").read_text())


def _context(cfg: RunConfig, pid: int) -> Context:
    return Context(run_id=1, node_id=pid, node_config={"partition-id": pid, "num-partitions": 2},
                   state=RecordDict(), run_config=cfg.to_run_config())


class _FixedRelease:
    """A 'noise source' whose output is a fixed release, whatever the input: the noise is
    chosen per client so that both clients publish exactly the same noisy counts."""

    secure, reproducible, label = False, False, "fixed (test)"

    def __init__(self, target: dict[tuple[int, ...], np.ndarray]) -> None:
        self.target = target

    def add_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        return self.target[np.shape(values)].copy()


def test_release_depends_on_the_data_only_through_the_noisy_counts(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path)
    model, (zones, cells) = pl.inventory_model(cfg), pl.zoning(cfg)
    shards = [generate_dataset(model, 300, random_state=s) for s in (11, 12)]
    raw = [count_visits(d.states, d.actions, zones, cells) for d in shards]
    assert not np.array_equal(raw[0].n_sas, raw[1].n_sas)  # the private data differ
    rng = np.random.default_rng(0)
    target = {c.shape: np.maximum(c + rng.normal(0, 3.7, c.shape), 0)
              for c in (raw[0].n_sa, raw[0].n_sas)}
    monkeypatch.setattr(pl, "generate_dataset", lambda m, n, random_state: shards[
        0 if random_state == pool_data_seed(cfg.seed, 0) else 1])
    monkeypatch.setattr(pl, "make_noise_source", lambda kind, random_state: _FixedRelease(target))
    anchors = np.random.default_rng(1).random((200, 2 * cfg.pool.products))
    contexts = [_context(cfg, pid) for pid in (0, 1)]
    first = [pool_learner.LEARNER.train(ctx, cfg, {C.ANCHORS: anchors}) for ctx in contexts]
    np.testing.assert_array_equal(first[0][0][C.Q_ANCHORS], first[1][0][C.Q_ANCHORS])
    assert first[0][0][C.Q_ANCHORS].shape == (200, cfg.pool.horizon)
    assert np.ptp(first[0][0][C.Q_ANCHORS]) > 0  # not trivially constant

    # later rounds rebuild from the stored release, never from the data
    monkeypatch.setattr(pl, "generate_dataset", lambda *a, **k: pytest.fail("data re-read"))
    teacher = first[0][0][C.Q_ANCHORS]
    again = pool_learner.LEARNER.train(contexts[1], cfg, {C.ANCHORS: anchors, C.TEACHER: teacher})
    np.testing.assert_array_equal(again[0][C.Q_ANCHORS], first[1][0][C.Q_ANCHORS])
    assert set(contexts[1].state.keys()) == {pool_learner.STATE_COUNTS, pool_learner.STATE_RELEASE}


def test_noise_off_is_refused_at_the_client_unless_the_run_is_non_private(tmp_path):
    cfg = _cfg(tmp_path)
    with pytest.raises(pl.NonPrivateRefusedError, match="not marked non-private"):
        pl.release(cfg, 0, _privacy(cfg, NO_NOISE))
    nodes = [NO_NOISE, {}, {}]
    refused = _run(cfg, nodes)
    assert all(r[C.REPLIES_FAILED] == 1 and r[C.REPLIES_OK] == 2 for r in refused["rounds"])
    assert set(refused["final"]["privacy-ledgers"]) == {"1", "2"}

    marked = _run(_cfg(tmp_path, **{"non-private": True}), nodes)
    assert all(r[C.REPLIES_OK] == 3 for r in marked["rounds"])
    exact = marked["final"]["privacy-ledgers"]["0"]
    assert exact["private"] is False and exact["epsilon-cks"] is None


def test_server_screens_out_non_private_replies_unless_the_run_is_non_private(tmp_path):
    cfg = _cfg(tmp_path)  # the server's run: not marked non-private
    clients_believe = {**cfg.to_run_config(), "non-private": True}  # a misconfigured client
    data = _run(cfg, [NO_NOISE, {}, {}], client_run_config=clients_believe)
    row = data["rounds"][0]
    assert row[C.REPLIES_REFUSED_NON_PRIVATE] == 1 and row[C.REPLIES_OK] == 2
    assert row[f"evaluate-{C.REPLIES_REFUSED_NON_PRIVATE}"] == 1  # its gaps are not used either
    assert set(data["final"]["privacy-ledgers"]) == {"1", "2"}


def test_every_client_ledger_is_in_results_and_budgets_are_enforced(tmp_path):
    cfg = _cfg(tmp_path, **{"num-server-rounds": 2, "privacy-rho": 5.0})
    fresh = {"reproducible-noise": False}  # numpy noise nobody can draw again
    data = _run(cfg, [fresh, {"rho": 4.0, **fresh}, {"rho": 5.0, "rho-budget": 1.0}, {}])
    ledgers = data["final"]["privacy-ledgers"]
    assert set(ledgers) == {"0", "1", "3"}  # client 2 asked for more than its budget
    # each node's own rho caps the run's privacy-rho = 5 (node 0 and 3: the default cap, 1)
    assert [ledgers[k]["rho-spent"] for k in ("0", "1", "3")] == [1.0, 4.0, 1.0]
    assert ledgers["0"]["epsilon-cks"] == pytest.approx(7.077, abs=1e-3)
    assert ledgers["0"]["epsilon-exact"] == pytest.approx(6.573, abs=1e-3)
    assert ledgers["1"]["epsilon-exact"] < ledgers["1"]["epsilon-cks"]
    # seeded noise (node 3) is regenerable from the run config: no finite epsilon
    assert ledgers["3"]["noise-reproducible"] == 1 and ledgers["0"]["noise-reproducible"] == 0
    assert all(ledgers["3"][k] == math.inf for k in ("epsilon", "epsilon-cks", "epsilon-exact"))
    assert all(e["private"] and e["noise-secure"] == 0 for e in ledgers.values())
    assert all(r[C.REPLIES_FAILED] == 1 for r in data["rounds"])
    # rho is spent once, however many rounds
    assert all(r[C.RHO_SPENT] == pytest.approx(2.0) for r in data["rounds"])
    with pytest.raises(BudgetExceededError, match=r"rho=5 refused; spent 0 of budget 1"):
        pl.release(cfg, 2, _privacy(cfg, {"rho": 5.0, "rho-budget": 1.0}))


def test_opendp_clients_are_reported_secure_and_numpy_clients_are_not(tmp_path):
    secure = _run(_cfg(tmp_path), [OPENDP, {"noise": "numpy"}])
    ledgers = secure["final"]["privacy-ledgers"]
    assert ledgers["0"]["noise-secure"] == 1 and ledgers["1"]["noise-secure"] == 0
    assert ledgers["0"]["noise-sigma"] == pytest.approx(math.sqrt(2 * 7 / 1.0))


def test_federated_pool_run_reports_a_finite_gap(tmp_path):
    data = _run(_cfg(tmp_path, **{"num-server-rounds": 2}), [{}, {}])
    for row in data["rounds"]:
        assert math.isfinite(row[C.GAP]) and row[C.C_STAR] > 0
        assert math.isfinite(row[C.GAP_OWN]) and math.isfinite(row[C.GAP_INFORMED])
    assert data["final"]["gap-percent"] == data["rounds"][-1][C.GAP]
    assert data["strategy"] == "anchor"
    # what the run shows a user is POOL's: the gaps it plots, not a greedy return of nan
    from fedqhd.learners.pool import LEARNER

    assert all(key in row for key, _ in LEARNER.curves.lines for row in data["rounds"])
    line = LEARNER.final_line(data["final"])
    assert f"gap {data['final']['gap-percent']:.1f}%" in line and "nan" not in line


def test_run_config_ties_learners_to_their_tasks():
    with pytest.raises(ConfigError, match="'learner' = 'pool' needs 'env-id'"):
        parse_run_config({"learner": "pool"})
    with pytest.raises(ConfigError, match="'learner' = 'fqi' needs 'env-id'"):
        parse_run_config({"env-id": "fedqhd/Inventory-v0"})
    with pytest.raises(ConfigError, match="expected bool"):
        RunConfig.from_run_config({"non-private": 1})


@pytest.mark.parametrize("zoning", ["post-decision", "norm"])
def test_adopt_teacher_compiles_a_representable_teacher_exactly(tmp_path, zoning):
    """A teacher that is some POOL fit's own Q on the anchors is recovered on those anchors
    (trust 1), also where a point mixes several post-decision zones; trust 0 keeps own."""
    cfg = _cfg(tmp_path, pool={"zoning": zoning, "zones": 25}, **{"privacy-rho": 5.0})
    assert pl.zoning(cfg)[0].kind == ("post-decision" if zoning == "post-decision" else "zones")
    assert pl.learner_options(cfg)["kernel"] == ("shared" if zoning == "post-decision"
                                                 else "zone")
    own = pl.fit(cfg, pl.release(cfg, 0, _privacy(cfg, {}))[0])
    other = pl.fit(cfg, pl.release(cfg, 1, _privacy(cfg, {"rho": 5.0}))[0])
    anchors = np.random.default_rng(0).random((2000, 4))
    teacher = pl.anchor_values(other, anchors)
    assert np.sqrt(np.mean((pl.anchor_values(own, anchors) - teacher) ** 2)) > 0.05
    adopted, rms = pl.adopt_teacher(own, anchors, teacher, ridge=1e-9)
    assert rms < 1e-3, rms
    np.testing.assert_allclose(pl.anchor_values(adopted, anchors), teacher, atol=1e-2)
    kept, _ = pl.adopt_teacher(own, anchors, teacher, trust=0.0)
    np.testing.assert_allclose(pl.anchor_values(kept, anchors), pl.anchor_values(own, anchors))


def test_server_policy_keeps_zones_few_anchors_touch(tmp_path):
    """The federated policy compiles the teacher with the zero prior: zones that rollout
    anchors barely touch (the post-decision corner y = (0, 0)) must keep the teacher's
    value, not be pulled toward zero (issue 9: gaps of 24 % and 19 % on two seeds)."""
    cfg = _cfg(tmp_path, **{"anchor-source": "rollouts", "num-anchors": 1000, "seed": 6})
    fits = [pl.fit(cfg, pl.release(cfg, pid, _privacy(cfg, {}))[0]) for pid in (0, 1)]
    anchors = pl.pool_anchors(cfg)
    teacher = np.mean([pl.anchor_values(f, anchors) for f in fits], axis=0)
    mean_qbar = np.mean([f.qbar_[0][:, 0] for f in fits], axis=0)
    prior = pl.empty_learner(cfg)
    ids, wts = prior.zones_.weights(0, anchors)
    touched = np.bincount(ids.ravel(), weights=wts.ravel(), minlength=len(mean_qbar)) > 0
    assert touched.all()
    policy, rms = pl.server_policy(prior, anchors, teacher)
    assert rms < 1e-3
    np.testing.assert_allclose(policy.qbar_[0][:, 0], mean_qbar, atol=0.02)
    states = np.random.default_rng(0).random((200, 2))
    np.testing.assert_allclose(policy.values(0, states),
                               np.mean([f.values(0, states) for f in fits], axis=0), atol=0.02)
    # the regime is the one that failed: a ridge of 1e-3 to the zero prior distorts it
    pulled, _ = pl.adopt_teacher(prior, anchors, teacher, ridge=1e-3)
    assert np.abs(pulled.qbar_[0][:, 0] - mean_qbar).max() > 0.1
    # and it is the policy whose gap the server reports
    from flwr.app import Array, ArrayRecord

    reported = pool_learner.TeacherEvaluator(cfg, anchors)(
        ArrayRecord({C.TEACHER: Array(teacher)}))
    assert reported is not None
    assert reported[C.GAP] == pytest.approx(pl.GapEvaluator(cfg)(policy)[C.GAP])
    assert reported[C.GAP] != pytest.approx(pl.GapEvaluator(cfg)(pulled)[C.GAP])
