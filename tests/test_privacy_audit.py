"""``fedqhd privacy audit``: the empirical epsilon lower bound stays below POOL's claim
and refutes a broken mechanism."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import pytest
from presets_util import write_preset

from fedqhd.commands.main import main
from fedqhd.config import RunConfig
from fedqhd.pool.counts import count_sensitivity
from fedqhd.privacy import NumpyNoise
from fedqhd.privacy.audit import ScaledNoise, audit_release, clopper_pearson_upper
from fedqhd.studies.pool_audit import neighbouring_counts

H = 7
CFG = RunConfig.from_run_config({
    "learner": "pool", "env-id": "fedqhd/Inventory-v0",
    "preset": write_preset(Path(tempfile.mkdtemp(prefix="fedqhd-audit-")), "pool",
                           horizon=H, trajectories=300)})


@pytest.fixture(scope="module")
def neighbours():
    return neighbouring_counts(CFG, "replace")


def _audit(neighbours, rho: float, factor: float = 1.0, releases: int = 100_000):
    d, d_prime = neighbours
    return audit_release(d, d_prime, rho, count_sensitivity(H),
                         ScaledNoise(NumpyNoise(0), factor), releases, seed=0)


def test_neighbours_move_the_full_sensitivity():
    d, d_prime = neighbouring_counts(CFG, "replace")
    assert {k: float(((d_prime[k] - d[k]) ** 2).sum()) for k in d} == {"n_sa": 2 * H,
                                                                        "n_sas": 2 * H}
    d, d_prime = neighbouring_counts(CFG, "add")
    assert {k: float(((d_prime[k] - d[k]) ** 2).sum()) for k in d} == {"n_sa": H, "n_sas": H}


@pytest.mark.parametrize("rho, least", [(0.1, 0.1), (1.0, 2.5)])
def test_bound_stays_below_the_claim_and_has_power(neighbours, rho, least):
    res = _audit(neighbours, rho)
    assert res.claim_conversion == "exact-gaussian"
    assert res.claimed_epsilon == pytest.approx({0.1: 1.760, 1.0: 6.573}[rho], abs=1e-3)
    assert least < res.epsilon_lower_bound < res.claimed_epsilon and not res.flagged
    assert res.neighbour_l2 == {"n_sa": pytest.approx(math.sqrt(2 * H)),
                                "n_sas": pytest.approx(math.sqrt(2 * H))}
    assert res.epsilon_opendp > res.epsilon_exact_gaussian  # the discrete Gaussian's own map


def test_a_mechanism_with_a_tenth_of_the_noise_is_flagged(neighbours):
    res = _audit(neighbours, 1.0, factor=0.1)
    assert res.flagged and res.epsilon_lower_bound > res.claimed_epsilon + 1
    assert "BROKEN" in res.noise


def test_clopper_pearson_upper_bound():
    assert float(clopper_pearson_upper(0, 1000, 0.05)) == pytest.approx(1 - 0.05 ** (1 / 1000))
    assert float(clopper_pearson_upper(1000, 1000, 0.05)) == 1.0
    assert 0.5 < float(clopper_pearson_upper(500, 1000, 0.05)) < 0.53


def test_cli_exit_code_and_json(tmp_path, capsys):
    common = ["privacy", "audit", "--rho", "1", "--releases", "20000", "--trajectories", "300"]
    assert main([*common, "--out", str(tmp_path / "ok.json")]) == 0
    assert "consistent" in capsys.readouterr().out
    assert main([*common, "--noise-scale-factor", "0.1", "--out", str(tmp_path / "bad.json")]) == 1
    out = capsys.readouterr().out
    assert "FLAGGED" in out and "claimed epsilon (exact-gaussian): 6.573" in out
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["flagged"] and bad["noise_scale_factor"] == 0.1 and bad["seed"] == 0
