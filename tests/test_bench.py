"""``fedqhd bench`` on a tiny problem: every baseline is run and the fidelity is sane."""

import json

import numpy as np

from fedqhd.bench import run_bench


def test_bench_reports_every_baseline_and_fidelity_to_pooled(tmp_path):
    summary = run_bench("CartPole-v1", n_clients=3, seeds=[0], rounds=2, out=tmp_path,
                        overrides={"hd_dim": 200, "eval_episodes": 1, "num_anchors": 100})
    row = summary["per-seed"][0]
    for key in ("pooled", "lone-shared-mean", "lone-heterogeneous-mean"):
        assert row[key] >= 8  # CartPole returns at least 8 steps
    avg = row["fedqhd-avg"]
    assert 0 < avg["q-error-vs-pooled"] < 1 and 0.5 <= avg["greedy-agreement"] <= 1
    assert np.isfinite(row["fedqhd-anchor"]["return-mean"])
    assert json.loads((tmp_path / "bench.json").read_text())["mean"] == summary["mean"]
