"""The paper's truncate-and-average baseline and the pooled-data oracle of the online
protocol, in the Flower app (in process): exact aggregation, exact pooled ridge FQI, and
both through the paper suite."""

from __future__ import annotations

import json

import numpy as np
import pytest
from online_spies import spy_clients

from fedqhd.client.app import app as client_app
from fedqhd.config import ConfigError, RunConfig
from fedqhd.learners.fqi_online import (
    STATE_ARRAYS,
    STATE_META,
    TRAIN_RETURN_LAST100,
    _new_client,
)
from fedqhd.online import OnlineClient
from fedqhd.server.app import run_federation
from fedqhd.server.inprocess import InProcessGrid
from fedqhd.strategies import FedQHDPooled, truncate
from fedqhd.strategies import contract as C
from fedqhd.strategies.truncate import truncated_mean, with_head

#: small manual settings; the paper's plain transition weights (weight-cap-factor 0) and
#: every client acting with the global readout, as the paper suite runs
SMALL = {"protocol": "online", "preset": "manual", "hd-dim": 100, "gamma": 0.9,
         "ridge": 1.0, "proximal": 0.01, "local-iterations": 3, "episodes-per-round": 10,
         "eval-episodes": 2, "min-nodes": 2, "weight-cap-factor": 0.0, "seed": 3}


def _federate(tmp_path, n_clients: int = 2, **keys) -> tuple[list[dict], InProcessGrid]:
    """An in-process run of the app: its rounds' rows and its grid (the nodes' states)."""
    cfg = RunConfig.from_run_config({**SMALL, "min-nodes": n_clients,
                                     "output-dir": str(tmp_path), **keys})
    grid = InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config())
    final, out_dir = run_federation(grid, cfg)
    assert final["status"] == "completed", final
    return json.loads((out_dir / "results.json").read_text())["rounds"], grid


def _node_arrays(grid: InProcessGrid) -> list[dict[str, np.ndarray]]:
    """Each node's saved client (partition order): its buffer rows, readout, ..."""
    return [{k: v.numpy() for k, v in grid.contexts[node].state[STATE_ARRAYS].items()}
            for node in sorted(grid.contexts)]


def test_truncated_mean_of_readouts_of_different_dims():
    """FedQHDTruncate's arithmetic: the weighted mean of the first min D_i rows; each
    client continues from it in those rows and keeps its own rows beyond."""
    rng = np.random.default_rng(0)
    readouts = [rng.normal(size=(d, 2)) for d in (4, 6, 5)]
    weights = np.array([0.2, 0.5, 0.3])
    head = truncated_mean(readouts, weights)
    mean = 0.2 * readouts[0][:4] + 0.5 * readouts[1][:4] + 0.3 * readouts[2][:4]
    np.testing.assert_allclose(head, mean, rtol=0, atol=1e-15)
    for r in readouts:
        m = with_head(r, head)
        assert m.shape == r.shape
        np.testing.assert_allclose(m[:4], mean, rtol=0, atol=1e-15)
        np.testing.assert_array_equal(m[4:], r[4:])  # own rows beyond min D kept
        assert m is not r and not np.shares_memory(m, r)  # a copy
    same = truncated_mean(readouts[1:2] * 2, [0.25, 0.75])  # equal D: the mean
    np.testing.assert_allclose(with_head(readouts[1], same), readouts[1], rtol=0, atol=1e-15)
    # a head longer than a readout (clients with more rows sampled) is cut in turn
    np.testing.assert_array_equal(with_head(readouts[0], readouts[1]), readouts[1][:4])
    with pytest.raises(ValueError, match="one weight per readout"):
        truncated_mean(readouts, [1.0])
    with pytest.raises(ValueError, match="same number of actions"):
        truncated_mean([readouts[0], rng.normal(size=(4, 3))], [0.5, 0.5])
    with pytest.raises(ValueError, match="does not fit"):
        with_head(readouts[0], rng.normal(size=(4, 3)))


def test_truncate_clients_continue_from_the_truncated_average(tmp_path, monkeypatch):
    """Heterogeneous encoders (D_i 500 and 1000) under strategy truncate: the server's head
    is the transition-weighted mean of the round's readouts' first 500 rows, and each
    client's next fit starts from it in those rows and from its own readout beyond."""
    heads: list[np.ndarray] = []
    real_mean = truncate.truncated_mean

    def spy(readouts, weights):
        heads.append(real_mean(readouts, weights))
        return heads[-1]

    monkeypatch.setattr(truncate, "truncated_mean", spy)
    _, starts, fitted = spy_clients(monkeypatch)
    rows, _ = _federate(tmp_path, encoder="heterogeneous", strategy="truncate",
                        **{"num-server-rounds": 2})
    assert [r[C.REPLIES_OK] for r in rows] == [2, 2] and len(heads) == 2
    (r0, n0), (r1, n1) = fitted[0][0], fitted[1][0]
    assert (r0.shape, r1.shape) == ((500, 2), (1000, 2))  # D_i cycled from 500, 1000, ...
    np.testing.assert_allclose(heads[0], (n0 * r0[:500] + n1 * r1[:500]) / (n0 + n1),
                               rtol=1e-12, atol=1e-12)
    assert np.abs(r1[500:]).max() > 0  # the larger client has rows of its own to keep
    # round 2 starts each client's fit from what round 1's truncate-average gave it
    for pid, own in ((0, r0), (1, r1)):
        np.testing.assert_array_equal(starts[pid][1], with_head(own, heads[0]))
    np.testing.assert_array_equal(starts[1][1][500:], r1[500:])


def test_truncate_with_the_shared_encoder_is_fedqhd_readout_averaging(tmp_path):
    """With one shared encoder every readout has the same D: the truncated mean is the
    whole readouts' mean, so truncate runs FedQHDAvg's (readout averaging's) rounds: the
    same training returns and transitions every round, the same value biases and the same
    readouts in every client (to rounding)."""
    keys = {"num-server-rounds": 3, "encoder": "shared"}
    avg, avg_grid = _federate(tmp_path / "avg", n_clients=3, strategy="avg", **keys)
    trunc, trunc_grid = _federate(tmp_path / "truncate", n_clients=3, strategy="truncate",
                                  **keys)
    for key in (TRAIN_RETURN_LAST100, C.NUM_TRANSITIONS):
        assert [r[key] for r in trunc] == [r[key] for r in avg], key
    # the same clients' value biases, averaged in another order (the strategies' own)
    assert [r["value-bias"] for r in trunc] == pytest.approx([r["value-bias"] for r in avg],
                                                             rel=1e-12)
    for a, t in zip(_node_arrays(avg_grid), _node_arrays(trunc_grid), strict=True):
        # FedQHDAvg normalises its weights in another order: the same readouts to rounding
        np.testing.assert_allclose(t["readout"], a["readout"], rtol=1e-12, atol=1e-12)
    assert len({r[TRAIN_RETURN_LAST100] for r in avg}) > 1  # the clients learn


def test_truncate_with_heterogeneous_encoders_is_not_the_independent_learners(tmp_path):
    """Under heterogeneous encoders truncate mixes unrelated features, but it aggregates:
    its clients are the independent learners (strategy none) until the first head arrives
    and differ after."""
    keys = {"num-server-rounds": 2, "encoder": "heterogeneous"}
    trunc, trunc_grid = _federate(tmp_path / "truncate", strategy="truncate", **keys)
    alone, alone_grid = _federate(tmp_path / "none", strategy="independent", **keys)
    assert trunc[0][TRAIN_RETURN_LAST100] == alone[0][TRAIN_RETURN_LAST100]
    assert trunc[1][TRAIN_RETURN_LAST100] != alone[1][TRAIN_RETURN_LAST100]
    for t, a in zip(_node_arrays(trunc_grid), _node_arrays(alone_grid), strict=True):
        assert t["readout"].shape == a["readout"].shape
        assert np.abs(t["readout"] - a["readout"]).max() > 1e-6


def test_the_pooled_oracle_makes_every_client_act_with_one_readout(tmp_path, monkeypatch):
    """strategy pooled: no client fits; from round 2 on every client collects with the one
    pooled readout of the round before (and keeps it in its state), a fit of its own
    that moves every round; its curve is not readout averaging's. One feature space
    only: heterogeneous encoders are refused."""
    acted, _, _ = spy_clients(monkeypatch)
    monkeypatch.setattr(OnlineClient, "fit", lambda *a, **k: pytest.fail("a local fit"))
    keys = {"num-server-rounds": 3, "hd-dim": 60}
    pooled, grid = _federate(tmp_path / "pooled", n_clients=3, strategy="pooled", **keys)
    assert [r[C.REPLIES_OK] for r in pooled] == [3, 3, 3]
    assert all(not np.any(acted[pid][0]) for pid in range(3))  # round 1: the zero readout
    for rnd in (1, 2):
        one = acted[0][rnd]
        assert one.shape == (60, 2) and np.abs(one).max() > 0
        for pid in (1, 2):
            np.testing.assert_array_equal(acted[pid][rnd], one)
    assert np.abs(acted[0][2] - acted[0][1]).max() > 1e-6  # a new pooled fit each round
    states = [a["readout"] for a in _node_arrays(grid)]
    for s in states:
        np.testing.assert_array_equal(s, acted[0][2])
    monkeypatch.undo()
    avg, _ = _federate(tmp_path / "avg", n_clients=3, strategy="avg", **keys)
    assert [r[TRAIN_RETURN_LAST100] for r in pooled] != [r[TRAIN_RETURN_LAST100] for r in avg]
    with pytest.raises(ConfigError, match="needs 'encoder' = 'shared'"):
        RunConfig.from_run_config({**SMALL, "strategy": "pooled", "encoder": "heterogeneous"})


def test_the_pooled_oracle_is_ridge_fqi_on_the_union_of_the_buffers(tmp_path, monkeypatch):
    """The server's pooled fit from the clients' statistics (per-action Grams, transitions
    per action, reward ranges and one phi-y per sweep) is the ridge FQI one client with
    every client's buffer would fit, from the round's readout, pulled toward it; not the
    average of the clients' own fits."""
    globals_: list[np.ndarray] = []
    real = FedQHDPooled.aggregate_train

    def spy(self, server_round, replies):
        arrays, metrics = real(self, server_round, replies)
        globals_.append(arrays[C.READOUT].numpy())
        return arrays, metrics

    monkeypatch.setattr(FedQHDPooled, "aggregate_train", spy)
    # a proximal pull of 0.1 keeps the systems well conditioned: the float32 sums of the
    # clients' statistics and of the union's agree to ~1e-5 of the readout
    n, keys = 3, {"num-server-rounds": 2, "hd-dim": 60, "strategy": "pooled", "proximal": 0.1}
    _, grid = _federate(tmp_path, n_clients=n, **keys)
    assert len(globals_) == 2
    cfg = RunConfig.from_run_config({**SMALL, "min-nodes": n, **keys})
    # round 2's fit: from round 1's readout, which every client adopted and saved, on
    # the buffers every client saved after its round-2 collection
    nodes = _node_arrays(grid)
    start = nodes[0]["readout"]
    np.testing.assert_array_equal(start, globals_[0])
    metas = [grid.contexts[node].state[STATE_META] for node in sorted(grid.contexts)]
    union, _ = _new_client(cfg, 0, n)
    rows = {k: np.concatenate([a[k] for a in nodes])
            for k in ("states", "actions", "rewards", "next-states", "continues")}
    assert len(rows["actions"]) <= union.capacity
    union.append(rows["states"], rows["actions"], rows["rewards"], rows["next-states"],
                 rows["continues"] == 0, continues=rows["continues"],
                 reward_range=(min(float(m["r-min"]) for m in metas),
                               max(float(m["r-max"]) for m in metas)))
    assert union.size == sum(len(a["actions"]) for a in nodes)
    want = union.fit(cfg.local_iterations, init=start, prior=start)
    np.testing.assert_allclose(globals_[1], want, rtol=1e-4, atol=1e-5)  # float32 sums
    # not the average of the clients' own fits from the same start
    own = []
    for pid, a in enumerate(nodes):
        client, _ = _new_client(cfg, pid, n)
        client.append(a["states"], a["actions"], a["rewards"], a["next-states"],
                      a["continues"] == 0, continues=a["continues"])
        own.append(client.fit(cfg.local_iterations, init=start, prior=start))
    assert np.abs(globals_[1] - np.mean(own, axis=0)).max() > 1e-2 * np.abs(want).max()


def test_paper_suite_runs_truncate_and_the_pooled_oracle(tmp_path):
    from fedqhd.commands.main import main
    from fedqhd.studies import paper

    rc = main(["bench", "--suite", "paper", "--envs", "CartPole-v1", "--methods",
               "truncate,pooled", "--seeds", "0", "--clients", "2", "--episodes", "40",
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "paper.json").read_text())
    cells = {(c["method"], c["setting"]): c for c in data["cells"]}
    assert set(cells) == {("truncate", "shared"), ("truncate", "heterogeneous"),
                          ("pooled", "shared")}
    # each cell ran the app with its method's strategy, on the task's table (auto)
    assert [cells[k]["config"]["strategy"] for k in sorted(cells)] == [
        "pooled", "truncate", "truncate"]
    for (_, setting), c in cells.items():
        assert (c["config"]["encoder"], c["config"]["preset"]) == (setting, "auto")
        assert np.isfinite(c["train-return-last100"]) and c["curve"]
        assert c["curve"][-1][0] >= 40  # episodes per client
    table = (tmp_path / "paper-table.md").read_text()
    assert "| truncate |" in table and "(230.8)" in table and "(112.6)" in table
    pooled_row = next(line for line in table.splitlines() if line.startswith("| pooled |"))
    assert "(" not in pooled_row and pooled_row.rstrip().endswith("| - |")
    with pytest.raises(ValueError, match="'encoder' = 'shared'"):
        paper.run_cell("pooled", "CartPole-v1", "heterogeneous", 0)


def test_a_suite_of_the_old_method_names_loads_under_the_new_ones(tmp_path):
    """paper.json files written before the methods took the strategies' names (truncate-avg,
    oracle) still load, resume and merge, under truncate and pooled."""
    from fedqhd.studies import paper

    old = {"protocol": {"clients": 5, "episodes": 600}, "cells": [
        {"method": "truncate-avg", "env-id": "CartPole-v1", "setting": "shared", "seed": 42,
         "train-return-last100": 200.0},
        {"method": "oracle", "env-id": "CartPole-v1", "setting": "shared", "seed": 42,
         "train-return-last100": 300.0}]}
    path = tmp_path / "paper.json"
    path.write_text(json.dumps(old))
    cells = paper.load_summary(path)["cells"]
    assert [c["method"] for c in cells] == ["truncate", "pooled"]
    assert all(c["method"] in paper.METHODS for c in cells)
