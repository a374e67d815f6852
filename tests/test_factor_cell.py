"""The factor study's paired comparison (benchmarks/factor_cell.py, BENCHMARKS.md's
"paired on the same seeds" numbers)."""

import math

import pytest

from benchmarks.factor_cell import paired_difference


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
