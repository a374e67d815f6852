"""Privacy primitives checked against dp-accounting and OpenDP."""

import json
import math

import numpy as np
import pytest

from fedqhd.privacy import (
    BudgetExceededError,
    GaussianMechanism,
    NumpyNoise,
    OpenDPNoise,
    PrivacyLedger,
    epsilon_cks,
    epsilon_exact,
    gaussian_sigma,
    make_noise_source,
    release_counts,
)


def test_epsilon_reference_values():
    assert epsilon_cks(1.0, 1e-5) == pytest.approx(7.077, abs=1e-3)
    assert epsilon_exact(1.0, 1e-5) == pytest.approx(6.573, abs=1e-3)


def test_sigma_calibration_matches_opendp_map():
    import opendp.prelude as dp

    dp.enable_features("contrib")
    h = 8  # 2H = 16, so the L2 sensitivity sqrt(2H) = 4 is an integer for OpenDP
    sigma = gaussian_sigma(math.sqrt(2 * h), 0.5)  # POOL: sigma^2 = 2H/rho with rho/2 per family
    assert sigma**2 == pytest.approx(2 * h / 1.0)
    meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int),
                              scale=sigma)
    # OpenDP's privacy map at the same sensitivity gives back the rho we asked for
    assert meas.map(4) == pytest.approx(0.5, rel=1e-6)


@pytest.mark.parametrize("source", [NumpyNoise(0), OpenDPNoise()], ids=["numpy", "opendp"])
def test_noise_variance_matches_sigma(source):
    h, rho = 5, 1.0
    fams = {"n_sa": np.zeros(4000, dtype=np.int64), "n_sas": np.full(4000, 50, dtype=np.int64)}
    release = release_counts(fams, rho, math.sqrt(2 * h), source, clip_at_zero=False)
    assert release.sigma == pytest.approx(math.sqrt(2 * h / rho))
    out = release.values
    target = 2 * h / rho
    for name, counts in fams.items():
        noise = out[name] - counts
        assert noise.var() == pytest.approx(target, rel=0.1), name  # fails if noise were skipped
        assert abs(noise.mean()) < 0.3
    if source.secure:
        assert np.all(out["n_sa"] == np.round(out["n_sa"]))


def test_clipping_at_zero():
    out = release_counts({"a": np.zeros(1000, dtype=int)}, 1.0, 3.0, NumpyNoise(1)).values
    assert out["a"].min() >= 0 and out["a"].max() > 0


def test_ledger_composes_and_refuses():
    led = PrivacyLedger(budget_rho=1.0, delta=1e-5, client_id="c0")
    GaussianMechanism(1.0, 0.5).release(np.zeros(3), NumpyNoise(), led, label="first")
    led.spend(0.5, label="second")
    assert led.rho_spent == pytest.approx(1.0)
    assert led.epsilon_cks() == pytest.approx(7.077, abs=1e-3)
    assert led.epsilon_exact() == pytest.approx(6.573, abs=1e-3)
    with pytest.raises(BudgetExceededError, match="refused"):
        led.spend(0.01)
    # a multi-family release is checked as a whole before any noise is drawn
    led2 = PrivacyLedger(budget_rho=0.6)
    with pytest.raises(BudgetExceededError):
        release_counts({"a": np.zeros(2), "b": np.zeros(2)}, 1.0, 1.0, NumpyNoise(0), led2)
    assert led2.rho_spent == 0.0


def test_regenerable_noise_has_infinite_epsilon_in_every_report():
    """Seeded noise is regenerable by whoever knows the seed: no finite epsilon, however
    small the rho; the rho still counts against the budget."""
    led = PrivacyLedger(budget_rho=1.0, delta=1e-5, client_id="c0")
    GaussianMechanism(1.0, 0.25).release(np.zeros(3), NumpyNoise(), led, label="fresh")
    assert math.isfinite(led.epsilon()) and not led.regenerable
    GaussianMechanism(1.0, 0.25).release(np.zeros(3), NumpyNoise(7), led, label="seeded")
    assert led.regenerable and led.rho_spent == pytest.approx(0.5)
    assert led.conversion == "regenerable"
    assert led.epsilon() == led.epsilon_cks() == led.epsilon_exact() == math.inf
    by_noise = led.epsilon_by_noise()
    assert by_noise["numpy-seeded (NOT secure)"]["epsilon"] == math.inf
    assert math.isfinite(by_noise["numpy-fresh-entropy (NOT secure)"]["epsilon"])
    stored = json.loads(led.to_json())  # Python's JSON: the token Infinity, read back as inf
    assert stored["noise_regenerable"] is True
    assert all(stored[k] == math.inf for k in ("epsilon", "epsilon_cks",
                                               "epsilon_exact_gaussian"))
    assert PrivacyLedger.from_dict(stored).epsilon() == math.inf
    with pytest.raises(BudgetExceededError):
        led.spend(0.6)


def test_ledger_json_round_trip():
    led = PrivacyLedger(budget_rho=2.0, client_id="x")
    led.spend(0.3, label="n_sa", sigma=1.2)
    d = json.loads(led.to_json())
    assert d["rho_spent"] == pytest.approx(0.3)
    assert d["epsilon_exact_gaussian"] < d["epsilon_cks"]
    back = PrivacyLedger.from_dict(d)
    assert back.rho_spent == pytest.approx(0.3) and back.entries[0]["sigma"] == 1.2


def test_sources_by_name_and_labels():
    assert not make_noise_source("numpy", 0).secure
    assert make_noise_source("opendp").secure
    with pytest.raises(ValueError):
        make_noise_source("nope")
    a = NumpyNoise(3).add_noise(np.zeros(5), 1.0)
    b = NumpyNoise(3).add_noise(np.zeros(5), 1.0)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError):
        OpenDPNoise().add_noise(np.array([0.5]), 1.0)
    with pytest.raises(ValueError):
        gaussian_sigma(1.0, 0.0)


def test_every_ledger_entry_of_a_release_records_whether_its_sampler_is_secure():
    families = {"n_sa": np.zeros(4, dtype=int), "n_sas": np.zeros((4, 3), dtype=int)}
    for source, secure in ((OpenDPNoise(), True), (NumpyNoise(0), False)):
        ledger = PrivacyLedger(budget_rho=5.0)
        release_counts(families, 1.0, 2.0, source, ledger)
        assert [e["secure"] for e in ledger.entries] == [secure, secure]
        assert [e["noise"] for e in ledger.entries] == [source.label] * 2


def test_ledgers_lists_every_readable_ledger_and_names_what_is_wrong_with_each_bad_one(
        tmp_path, capsys):
    from fedqhd.commands.main import main

    good = PrivacyLedger(10.0, 1e-5, "c0")
    good.spend(1.0, noise="numpy-gaussian")
    record = good.to_dict()
    files = {"aa": good.to_json(), "bb": "{not json", "cc": "",
             "dd": json.dumps({k: v for k, v in record.items() if k != "budget_rho"}),
             "ee": "[1, 2]", "ff": json.dumps({**record, "entries": [{"label": "x"}]}),
             "gg": json.dumps({**record, "delta": 2}), "zz": good.to_json()}
    for name, text in files.items():
        (tmp_path / f"{name}.json").write_text(text)
    assert main(["privacy", "ledgers", "--ledger-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out.count("c0: rho spent 1 of 10") == 2  # zz, sorted after the bad files, too
    lines = err.strip().splitlines()
    assert lines[-1] == "fedqhd privacy ledgers: 6 of 8 ledger file(s) unreadable"
    for line, (name, why) in zip(lines, (("bb", "Expecting property name"),
                                         ("cc", "empty file"),
                                         ("dd", "missing field 'budget_rho'"),
                                         ("ee", "not a JSON object: [1, 2]"),
                                         ("ff", "entry 0 has no non-negative number 'rho'"),
                                         ("gg", "field 'delta' = 2 is not in (0, 1)")),
                                 strict=False):
        assert f"{name}.json is unreadable ({why}" in line, line


def test_ledgers_report_epsilon_at_the_delta_asked_for(tmp_path, capsys):
    from fedqhd.commands.main import main
    from fedqhd.privacy.ledger import epsilon_exact

    ledger = PrivacyLedger(10.0, 1e-5, "c0")
    ledger.spend(1.0, noise="numpy-gaussian")
    (tmp_path / "aa.json").write_text(ledger.to_json())
    for argv, delta in (([], 1e-5), (["--delta", "1e-9"], 1e-9)):
        assert main(["privacy", "ledgers", "--ledger-dir", str(tmp_path), *argv]) == 0
        out = capsys.readouterr().out
        assert f"epsilon at delta {delta:g}: {epsilon_exact(1.0, delta):.3f} (exact-gaussian)" \
            in out, out
    assert epsilon_exact(1.0, 1e-9) > epsilon_exact(1.0, 1e-5) + 1  # the two lines differ
    for bad in ("0", "1", "-1e-5", "x"):
        with pytest.raises(SystemExit) as exit_:
            main(["privacy", "ledgers", "--ledger-dir", str(tmp_path), "--delta", bad])
        assert exit_.value.code == 2
        assert "--delta" in capsys.readouterr().err


def test_ledgers_refuses_a_named_folder_that_is_not_there(tmp_path, capsys, monkeypatch,
                                                          private_ledger_dir):
    from fedqhd.commands.main import main

    (tmp_path / "afile").touch()
    for folder, why in ((tmp_path / "nosuchledgers", "no such folder"),
                        (tmp_path / "afile", "not a folder"), ("", "not a folder name")):
        assert main(["privacy", "ledgers", "--ledger-dir", str(folder)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err == f"fedqhd privacy: error: --ledger-dir {str(folder)!r}: {why}\n"
    assert not private_ledger_dir.exists()  # $FEDQHD_LEDGER_DIR named by the test fixture
    assert main(["privacy", "ledgers"]) == 2
    assert "$FEDQHD_LEDGER_DIR" in capsys.readouterr().err
    monkeypatch.delenv("FEDQHD_LEDGER_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))  # the default folder, not there yet: fine
    assert main(["privacy", "ledgers"]) == 0
    assert "nothing released on this node" in capsys.readouterr().out
