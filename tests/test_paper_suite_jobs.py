"""The paper suite on several processes (``--jobs``): the same numbers as one
single-threaded process, cells written in job order as each ends, a failing cell stops
the suite with the finished cells kept; seed ranges; the spread table."""

import json
import os
import time
from pathlib import Path

import pytest
from threadpoolctl import threadpool_limits

from fedqhd.studies import paper
from fedqhd.threads import blas_threads


def slow_or_failing_cell(method, env_id, setting, seed, episodes, clients):
    """Module level, so spawned workers can unpickle it: seed 1 fails at once, the others
    take a while (seed 0 is still running when seed 1 fails)."""
    if seed == 1:
        raise RuntimeError("cell seed 1 failed")
    time.sleep(1.0)
    value = 10.0 * seed
    return {"train-return-last100": value, "greedy-return": value, "wall-s": 1.0,
            "cpu-s": 1.0, "curve": [(episodes, value)]}


def late_first_cell(method, env_id, setting, seed, episodes, clients):
    """Seed 0 ends last (cells finish in another order than the jobs'); its greedy return
    is the number of cells in ``$PAPER_JSON`` by then (written after each cell?)."""
    time.sleep(4.0 if seed == 0 else 0.05)
    seen = -1.0
    if seed == 0:
        seen = float(len(json.loads(Path(os.environ["PAPER_JSON"]).read_text())["cells"]))
    return {"train-return-last100": float(seed), "greedy-return": seen, "wall-s": 1.0,
            "cpu-s": 1.0, "curve": [], "blas-threads": blas_threads()}


def test_cells_are_written_in_job_order_whatever_order_they_end_in(tmp_path, monkeypatch):
    monkeypatch.setenv("PAPER_JSON", str(tmp_path / "paper.json"))
    summary = paper.run_suite(["CartPole-v1"], ["shared"], ["fedqhd"], [0, 1, 2, 3],
                              tmp_path, episodes=40, clients=2, progress=False,
                              cell=late_first_cell, jobs=2)
    assert [c["seed"] for c in summary["cells"]] == [0, 1, 2, 3]
    assert [c["train-return-last100"] for c in summary["cells"]] == [0.0, 1.0, 2.0, 3.0]
    on_disk = json.loads((tmp_path / "paper.json").read_text())["cells"]
    assert [c["seed"] for c in on_disk] == [0, 1, 2, 3]
    assert summary["cells"][0]["greedy-return"] == 3.0  # the others were on disk already
    assert {c["blas-threads"] for c in summary["cells"]} == {1}  # whatever the cores


def test_parallel_cells_are_the_single_threaded_runs_in_job_order(tmp_path):
    args = (["CartPole-v1"], ["shared", "heterogeneous"], ["fedqhd"], [3, 4])
    with threadpool_limits(limits=1):
        one = paper.run_suite(*args, tmp_path / "one", episodes=40, clients=2,
                              progress=False)
    two = paper.run_suite(*args, tmp_path / "two", episodes=40, clients=2, progress=False,
                          jobs=2)
    keys = [paper.cell_key(c) for c in two["cells"]]
    assert keys == [("fedqhd", "CartPole-v1", s, seed) for s in ("shared", "heterogeneous")
                    for seed in (3, 4)]
    assert keys == [paper.cell_key(c) for c in one["cells"]]
    for a, b in zip(one["cells"], two["cells"], strict=True):
        assert a["train-return-last100"] == b["train-return-last100"]
        assert a["curve"] == b["curve"] and a["greedy-return"] == b["greedy-return"]
    assert len({c["train-return-last100"] for c in two["cells"]}) > 1  # not one number
    assert json.loads((tmp_path / "two" / "paper.json").read_text())["cells"][0]["seed"] == 3


def test_a_failing_cell_stops_the_parallel_suite_and_keeps_the_finished_ones(tmp_path):
    args = (["CartPole-v1"], ["shared"], ["fedqhd"], list(range(12)))
    with pytest.raises(RuntimeError, match="cell seed 1 failed"):
        paper.run_suite(*args, tmp_path, episodes=40, clients=2, progress=False,
                        cell=slow_or_failing_cell, jobs=2)
    kept = [c["seed"] for c in json.loads((tmp_path / "paper.json").read_text())["cells"]]
    assert 0 in kept and 1 not in kept          # the running cell was waited for
    assert kept == sorted(kept), kept           # job order
    assert len(kept) <= 6, kept                 # the cells not started were cancelled
    calls = []

    def rest(method, env_id, setting, seed, episodes, clients):
        calls.append(seed)
        return {"train-return-last100": 0.0, "greedy-return": 0.0, "wall-s": 1.0,
                "cpu-s": 1.0, "curve": []}

    summary = paper.run_suite(*args, tmp_path, episodes=40, clients=2, progress=False,
                              cell=rest, resume=True)
    assert sorted(calls) == [s for s in range(12) if s not in kept]
    assert sorted(c["seed"] for c in summary["cells"]) == list(range(12))


def test_seed_ranges_and_bad_seeds_or_jobs_are_refused(tmp_path):
    assert paper.parse_seeds("42-45") == [42, 43, 44, 45]
    assert paper.parse_seeds("7, 1-2,9") == [7, 1, 2, 9]
    for bad, msg in (("5-3", "A <= B"), ("x", "not a seed"), ("1,1-2", "given twice"),
                     ("-3", "not a seed"), (",", "no seeds")):
        with pytest.raises(ValueError, match=msg):
            paper.parse_seeds(bad)
    with pytest.raises(ValueError, match="jobs must be an integer"):
        paper.run_suite(["CartPole-v1"], ["shared"], ["fedqhd"], [0], tmp_path, jobs=0)
    assert not (tmp_path / "paper.json").exists()  # refused before anything ran


def test_the_table_gives_seeds_standard_error_and_replies_left_out_per_cell():
    cells = [{"method": "fedqhd", "env-id": "CartPole-v1", "setting": "shared", "seed": s,
              "train-return-last100": v, "wall-s": 1.0, "cpu-s": 1.0}
             for s, v in ((0, 1.0), (1, 11.0), (2, 21.0))]
    cells.append({**cells[0], "setting": "heterogeneous"})
    table = paper.markdown_table({"protocol": {"clients": 5, "episodes": 600},
                                  "cells": cells})
    assert "11.0 +- 8.2 (466.3)" in table
    assert "| fedqhd | 3 / 5.8 | 1 / - |" in table  # sample std 10 / sqrt(3)
    assert "left out" not in table
    cells[1]["replies-rejected"] = 2
    table = paper.markdown_table({"protocol": {"clients": 5, "episodes": 600},
                                  "cells": cells})
    assert table.rstrip().endswith("by run: fedqhd CartPole-v1 shared seed 1: 2.")
