"""The factor study's paired comparison (benchmarks/factor_cell.py, BENCHMARKS.md's
"paired on the same seeds" numbers)."""

import math

import numpy as np
import pytest

from benchmarks.factor_cell import frozen_returns, paired_difference
from fedqhd.learners import fqi
from fedqhd.strategies import contract as C
from fedqhd.studies import paper


def _cell(seed: int, value: float, setting: str = "shared", method: str = "fedqhd") -> dict:
    return {"method": method, "env-id": "Acrobot-v1", "setting": setting, "seed": seed,
            "train-return-last100": value}


def _row(seed: int, value: float, setting: str = "shared") -> dict:
    return {"env": "Acrobot-v1", "setting": setting, "seed": seed,
            "train-return-last100": value}


def test_the_change_is_taken_seed_by_seed_against_the_same_cell():
    # seeds far apart (-80 against -100) but every one 2 better than its baseline, one 4:
    # the paired mean is 2.5 with the spread of the differences alone
    cells = [_cell(1, -82.0), _cell(2, -102.0), _cell(3, -92.0), _cell(4, -90.0),
             _cell(1, -60.0, setting="heterogeneous"), _cell(2, -50.0, method="fedavg-dqn")]
    rows = [_row(1, -80.0), _row(2, -100.0), _row(3, -90.0), _row(4, -86.0),
            _row(9, 0.0)]  # a seed the baseline lacks is left out
    d = paired_difference(rows, cells)
    assert d["seeds"] == 4
    assert d["difference"] == pytest.approx(2.5)
    assert d["se"] == pytest.approx(math.sqrt(1.0 / 4))  # sample std 1 over sqrt(4)


def test_one_seed_has_no_standard_error_and_no_common_seed_is_refused():
    assert math.isnan(paired_difference([_row(1, -80.0)], [_cell(1, -81.0)])["se"])
    with pytest.raises(ValueError, match="none of these seeds"):
        paired_difference([_row(5, -80.0)], [_cell(1, -81.0)])


def test_frozen_returns_score_each_rounds_replies_and_the_aggregate_they_gave(monkeypatch):
    # a readout filled with v "returns" v; round r sends the aggregate of round r - 1's
    # replies, so round r's replies pair with round r + 1's sent readout
    seen = []

    def greedy_return(cfg, encoder, readout, *args, **kwargs):
        seen.append(cfg.eval_episodes)
        return np.array([float(readout[0, 0])])

    monkeypatch.setattr(fqi, "greedy_return", greedy_return)

    def readout(v: float) -> dict:
        return {C.READOUT: np.full((2, 2), v)}

    rounds = [{"sent": readout(1000.0 + r), "replies": [readout(10.0 * r + c) for c in range(3)]}
              for r in range(5)]
    keys = paper.app_run_config("fedqhd", "CartPole-v1", "shared", 0)
    got = frozen_returns(keys, rounds, episodes=7, last=2)
    # rounds 2 and 3 (the last two with an aggregate after them): replies 20-22 and 30-32,
    # aggregates 1003 and 1004; the last round's replies have no aggregate and are left out
    assert got == {"rounds": 2, "episodes": 7, "replies": 26.0, "aggregates": 1003.5}
    assert set(seen) == {7}
    with pytest.raises(ValueError, match="shared encoder only"):
        frozen_returns(paper.app_run_config("fedqhd", "CartPole-v1", "heterogeneous", 0),
                       rounds, episodes=7, last=2)


def test_set_reaches_the_cells_run_config_and_a_bad_key_stops_before_any_run(monkeypatch,
                                                                             capsys, tmp_path):
    """``--set norm-bound-factor=0`` (a run-config key as flwr run reads it) is in the run
    config the cell runs with and in the printed row; an unknown key or a bad value stops
    the script before its first seed."""
    import sys

    from benchmarks import factor_cell

    seen = []

    def cell(method, env_id, setting, seed):
        seen.append(paper.app_run_config(method, env_id, setting, seed))
        return {"curve": [(5, 1.0)], "value-bias": [(5, 0.0)], "train-return-last100": 1.0,
                "greedy-return": 1.0, "replies-rejected": 0, "cpu-s": 1.0}

    monkeypatch.setattr(paper, "run_app_cell", cell)
    row = factor_cell.run("CartPole-v1", "shared", 3, None, False,
                          overrides={"norm-bound-factor": 0.0, "weighting": "uniform"})
    assert seen[0]["norm-bound-factor"] == 0.0 and seen[0]["seed"] == 3
    assert seen[0]["weighting"] == "uniform" and row["weighting"] == "uniform"
    assert row["set"] == {"norm-bound-factor": 0.0, "weighting": "uniform"}
    assert "norm-bound-factor" not in paper.app_run_config("fedqhd", "CartPole-v1", "shared", 3)
    for bad in ("norm-bound-factr=0", "norm-bound-factor=-1", "norm-bound-factor"):
        monkeypatch.setattr(sys, "argv", ["factor_cell.py", "--seeds", "3", "--set", bad,
                                          "--out", str(tmp_path / "rows.jsonl")])
        with pytest.raises(SystemExit) as err:
            factor_cell.main()
        assert err.value.code == 2 and "norm-bound-factor" in capsys.readouterr().err
    assert len(seen) == 1 and not (tmp_path / "rows.jsonl").exists()
