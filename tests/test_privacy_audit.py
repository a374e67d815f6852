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


def _refused(args: list[str], capsys) -> tuple[int, str]:
    """Exit code and last stderr line of ``fedqhd privacy audit ARGS`` (argparse exits, a
    config error returns 2); asserts nothing reached stdout, so no audit ran."""
    try:
        code = main(["privacy", "audit", *args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert out == "", out
    return code, err.strip().splitlines()[-1]


@pytest.mark.parametrize(("args", "says"), [
    (["--delta", "2"], "argument --delta: must be in (0, 1), got 2"),
    (["--delta", "0"], "argument --delta: must be in (0, 1), got 0"),  # claim inf: vacuous
    (["--releases", "1"], "argument --releases: must be >= 100, got 1"),
    (["--releases", "-10"], "argument --releases: must be >= 100, got -10"),
    (["--confidence", "95"], "argument --confidence: must be in (0, 1), got 95"),
    (["--noise-scale-factor", "0"], "argument --noise-scale-factor: must be in (0, inf)"),
    (["--horizon", "0"], "argument --horizon: expected an integer in [1, 100], got 0"),
    (["--trajectories", "0"], "argument --trajectories: expected an integer in [1, "),
    (["--seed", "-1"], "argument --seed: expected an integer in [0, "),
    (["--rho", "0"], "argument --rho: expected a number in (0.0, "),  # not 'privacy-rho'
    (["--release", "fedqhd", "--chunks", "0"], "argument --chunks: expected an integer in "),
    (["--release", "fedqhd", "--hd-dim", "-5"], "argument --hd-dim: expected an integer in "),
    (["--release", "fedqhd", "--anchors", "-3"], "argument --anchors: must be >= 0, got -3"),
    (["--release", "fedqhd", "--episodes", "0"], "argument --episodes: must be >= 1, got 0"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_flag(args, says, capsys):
    code, err = _refused(args, capsys)
    assert code == 2 and says in err, err


@pytest.mark.parametrize(("args", "says"), [
    (["--chunks", "0", "--hd-dim", "16"], "argument --chunks: expected an integer"),
    (["--chunks", "4", "--hd-dim", "16"], "--chunks, --hd-dim: only for --release fedqhd, "
                                          "not --release counts"),
    (["--release", "fedqhd", "--horizon", "7", "--clipped"],
     "--horizon, --clipped: only for --release counts"),
    (["--release", "fedqhd", "--neighbours", "replace"],
     "--neighbours replace: only for --release counts"),
])
def test_an_option_of_the_other_release_is_refused_not_ignored(args, says, capsys):
    code, err = _refused(args, capsys)
    assert code == 2 and says in err, err


def test_an_unwritable_out_is_refused_before_the_audit(tmp_path, capsys):
    (tmp_path / "folder").mkdir()
    (tmp_path / "afile").touch()
    for out, says in ((tmp_path / "folder", "is a folder"),
                      (tmp_path / "afile" / "res.json", "afile is a file, not a folder")):
        code, err = _refused(["--trajectories", "30", "--out", str(out)], capsys)
        assert code == 2 and err.startswith(f"fedqhd privacy: error: --out {out}: ") and \
            says in err, err
    assert not any((tmp_path / "folder").iterdir())


def test_opendp_needs_a_release_count_given_not_numpys_hour_long_default(capsys):
    code, err = _refused(["--noise", "opendp"], capsys)
    assert code == 2 and "--noise opendp" in err and "give --releases" in err, err
    assert main(["privacy", "audit", "--noise", "opendp", "--releases", "200",
                 "--trajectories", "30"]) == 0  # a count given is run as asked
    assert "200 releases per data set" in capsys.readouterr().out
