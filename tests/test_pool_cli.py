"""The ``fedqhd pool`` sub-commands write JSON and PNG."""

import json

import pytest

from fedqhd.commands import pool as cli
from fedqhd.commands.main import main


def test_pool_rho_cli_writes_outputs(tmp_path):
    rc = main(["pool", "rho", "--reps", "1", "--rhos", "1", "--methods", "pool,nonprivate",
               "--w", "1", "--H", "3", "--n", "300", "--M", "10", "--out", str(tmp_path),
               "--no-progress", "--seed", "4"])
    assert rc == 0
    data = json.loads((tmp_path / "rho_uniform.json").read_text())
    assert data["seed"] == 4 and len(data["rows"]) == 2
    assert (tmp_path / "rho_uniform.png").stat().st_size > 0


def test_pool_grid_cli(tmp_path):
    assert main(["pool", "grid", "--reps", "1", "--Ms", "10", "--w", "1", "--H", "2",
                 "--n", "200", "--out", str(tmp_path), "--no-progress"]) == 0
    rows = json.loads((tmp_path / "grid_wd2.json").read_text())["rows"]
    assert {r["setting"]["zoning"] for r in rows} == {"post-decision", "norm", "grid"}


# ---------------------------------------------------------------- bad arguments
#: (arguments, the one-line error naming the flag). ``FILE``: a file where --out wants a
#: folder; ``OUT``: the (absent) output folder, added to the arguments unless given.
BAD_ARGUMENTS = [
    (["rho", "--reps", "0"], "argument --reps: must be >= 1, got 0"),
    (["grid", "--reps", "-2"], "argument --reps: must be >= 1, got -2"),
    (["rho", "--seed", "-1"], "argument --seed: must be >= 0, got -1"),
    (["rho", "--w", "0"], "argument --w: must be >= 1, got 0"),
    (["rho", "--H", "0"], "argument --H: must be >= 1, got 0"),
    (["rho", "--M", "0"], "argument --M: must be >= 1, got 0"),
    (["rho", "--n", "0"], "argument --n: must be >= 1, got 0"),
    (["rho", "--n-cells", "0"], "argument --n-cells: must be >= 1, got 0"),
    (["rho", "--lam", "-1"], "argument --lam: must be in (0, 1], got -1"),
    (["sweep", "--param", "M", "--values", "5", "--lam", "1.5"],
     "argument --lam: must be in (0, 1], got 1.5"),
    (["rho", "--rho", "0"], "argument --rho: must be in (0, inf), got 0"),
    (["rho", "--rhos", "0"], "argument --rhos: must be in (0, inf), got 0"),
    (["rho", "--rhos", "1,-1"], "argument --rhos: must be in (0, inf), got -1"),
    (["rho", "--rhos", "1;5"], "argument --rhos: expected a number, got '1;5'"),
    (["rho", "--rhos", ""], "argument --rhos: expected a comma-separated list, got ''"),
    (["rho", "--methods", "pool,foo"], "argument --methods: expected one of nonprivate, pool, "
     "input, output, got 'foo'"),
    (["rho", "--threshold", "high"], "argument --threshold: expected auto, erho or a number "
     "of noise sigmas >= 0, got 'high'"),
    (["rho", "--threshold", "-3"], "argument --threshold: expected auto, erho or a number "
     "of noise sigmas >= 0, got '-3'"),
    (["grid", "--Ms", "0"], "argument --Ms: must be >= 1, got 0"),
    (["grid", "--Ms", "2.7"], "argument --Ms: expected an integer, got '2.7'"),
    (["grid", "--Ms", ""], "argument --Ms: expected a comma-separated list, got ''"),
    (["rho", "--zoning", "norm", "--kernel", "shared"],
     "--kernel shared needs --zoning post-decision, got --zoning norm"),
    (["grid", "--zoning", "grid", "--kernel", "shared"],
     "--kernel shared needs --zoning post-decision, got --zoning grid"),
    (["sweep", "--param", "H", "--values=0"], "--values (--param H): must be >= 1, got 0"),
    (["sweep", "--param", "H", "--values", "2.5"],
     "--values (--param H): expected an integer, got '2.5'"),
    (["sweep", "--param", "M", "--values=-5,0"], "--values (--param M): must be >= 1, got -5"),
    (["sweep", "--param", "wd", "--values", "2,3"],
     "--values (--param wd): must be even (w + d = 2w), got 3"),
    (["sweep", "--param", "lam", "--values", "0.5,0"],
     "--values (--param lam): must be in (0, 1], got 0"),
    (["sweep", "--param", "lam", "--values", "a,b"],
     "--values (--param lam): expected a number, got 'a'"),
    (["sweep", "--param", "M", "--values", ""],
     "--values (--param M): expected a comma-separated list, got ''"),
    (["rho", "--out", "FILE"], "--out FILE: FILE is a file, not a folder"),
    (["sweep", "--param", "M", "--values", "5", "--out", "FILE/sub"],
     "--out FILE/sub: FILE is a file, not a folder"),
    (["grid", "--out", "FILE"], "--out FILE: FILE is a file, not a folder"),
    (["rho", "--rhos", "1", "--out", "BUSY"],
     "--out BUSY/rho_uniform.json: is a folder; give a file name"),
    (["federated", "--out", "FILE"], "--out FILE: FILE is a file, not a folder"),
    (["federated", "--seeds", "0"], "argument --seeds: must be >= 1, got 0"),
    (["federated", "--clients", "0"], "argument --clients: must be >= 1, got 0"),
    (["federated", "--trajectories", "0"], "argument --trajectories: must be >= 1, got 0"),
    (["federated", "--rho", "-1"], "argument --rho: must be in (0, inf), got -1"),
    (["federated", "--clients", "200000"],
     "--clients: expected an integer in [1, 100000], got 200000"),
    (["federated", "--rho", "2e6"], "--rho: expected a number in (0.0, 1000000.0], got 2000000.0"),
    (["federated", "--clients", "5", "--trajectories", "3000000"],
     "--clients * --trajectories (the pooled row's trajectories): expected an integer in "
     "[1, 10000000], got 15000000"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_ARGUMENTS,
                         ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_in_one_line_naming_its_flag_before_any_work(
        argv, message, tmp_path, monkeypatch, capsys):
    def no_work(*args, **kwargs):
        raise AssertionError("the study ran before the arguments were checked")

    monkeypatch.setattr(cli, "run_grid", no_work)
    monkeypatch.setattr(cli, "federated_study", no_work)
    (tmp_path / "FILE").write_text("mine")
    (tmp_path / "BUSY" / "rho_uniform.json").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # FILE and BUSY: relative paths, as in the messages
    before = sorted(tmp_path.rglob("*"))
    argv = ["pool", *argv] + ([] if "--out" in argv else ["--out", "OUT"])
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: its usage, then the error line
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fedqhd pool") and last.endswith(f"error: {message}"), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert (tmp_path / "FILE").read_text() == "mine"


class _Stop(Exception):
    """Raised instead of running a study: what it was given is enough."""


def test_sweep_values_reach_the_study_as_the_swept_flag_takes_them(tmp_path, monkeypatch):
    seen = []

    def record(settings, *args):
        seen.extend(settings)
        raise _Stop

    monkeypatch.setattr(cli, "run_grid", record)
    for param, values in (("wd", "2,4"), ("H", "3"), ("lam", "0.5,1"), ("M", "7")):
        with pytest.raises(_Stop):
            main(["pool", "sweep", "--param", param, "--values", values,
                  "--out", str(tmp_path / "o")])
    assert [(s.w, s.horizon, s.lam, s.n_zones) for _, s, _ in seen] == [
        (1, 7, 1.0, 50), (2, 7, 1.0, 50), (2, 3, 1.0, 50), (2, 7, 0.5, 50), (2, 7, 1.0, 50),
        (2, 7, 1.0, 7)]
    assert [label for label, _, _ in seen] == ["wd=2", "wd=4", "H=3", "lam=0.5", "lam=1", "M=7"]
    assert not (tmp_path / "o").exists()


def test_sweep_help_says_how_to_pass_a_list_starting_with_a_minus(capsys):
    with pytest.raises(SystemExit):
        main(["pool", "sweep", "--help"])
    assert "--values=-5,0" in " ".join(capsys.readouterr().out.split())


def test_federated_takes_a_rho_above_a_node_s_default_budget(tmp_path):
    """The study's nodes are simulated (their ledgers in a temporary folder): each one's
    budget is its one release, so a rho above the default budget (10) is measured, not
    refused by the first round."""
    assert main(["pool", "federated", "--clients", "2", "--seeds", "1", "--trajectories", "20",
                 "--rho", "20", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "federated.json").read_text())
    assert res["rho"] == 20 and len(res["runs"]) == 1
