"""``fedqhd bench`` on a tiny problem: every baseline is run and the fidelity is sane."""

import json

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.data import pooled
from fedqhd.learners.fqi import FQILearner, shared_encoder
from fedqhd.studies.bench import client_shards, greedy_return, run_bench


def test_bench_reports_every_baseline_and_fidelity_to_pooled(tmp_path):
    summary = run_bench("CartPole-v1", n_clients=3, seeds=[0], rounds=2, out=tmp_path,
                        overrides={"hd_dim": 200, "eval_episodes": 1, "num_anchors": 100})
    row = summary["per-seed"][0]
    # the pooled row is ridge FQI on the clients' shards pooled, scored on the server's
    # evaluation episodes; recomputed here from the parts
    cfg = RunConfig(seed=0, num_server_rounds=2, hd_dim=200, eval_episodes=1, num_anchors=100)
    shards = client_shards(cfg, 3)
    learner = FQILearner(pooled(shards), shared_encoder(cfg), 2, cfg.gamma, cfg.ridge,
                         proximal=0.0)
    learner.train(cfg.num_server_rounds * cfg.local_iterations)
    assert row["pooled"] == greedy_return(cfg, learner)
    assert row["transitions"] == sum(s.n_transitions for s in shards)
    avg = row["fedqhd-avg"]
    assert 0 < avg["q-error-vs-pooled"] < 1 and 0.5 <= avg["greedy-agreement"] <= 1
    assert np.isfinite(row["fedqhd-anchor"]["return-mean"])
    assert json.loads((tmp_path / "bench.json").read_text())["mean"] == summary["mean"]


def test_paper_suite_writes_json_table_and_curves_with_the_papers_numbers(tmp_path):
    from fedqhd.commands.main import main

    rc = main(["bench", "--suite", "paper", "--envs", "CartPole-v1", "--methods",
               "fedqhd,independent", "--seeds", "0", "--clients", "2", "--episodes", "40",
               "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "paper.json").read_text())
    cells = {(c["method"], c["setting"]) for c in data["cells"]}
    assert cells == {(m, s) for m in ("fedqhd", "independent")
                     for s in ("shared", "heterogeneous")}
    for c in data["cells"]:
        assert np.isfinite(c["train-return-last100"]) and c["cpu-s"] > 0 and c["curve"]
    table = (tmp_path / "paper-table.md").read_text()
    assert "(466.3)" in table and "(351.1)" in table and "(26.1)" in table
    assert (tmp_path / "curves-CartPole-v1.png").stat().st_size > 0


def test_paper_suite_refuses_unknown_names_and_fedavg_dqn_heterogeneous(capsys):
    import pytest

    from fedqhd.commands.main import main
    from fedqhd.studies import paper

    assert main(["bench", "--suite", "paper", "--methods", "fedqhd,magic"]) == 2
    assert capsys.readouterr().err.startswith("fedqhd bench: error: --methods: unknown")
    with pytest.raises(ValueError, match="shared setting"):
        paper.run_cell("fedavg-dqn", "CartPole-v1", "heterogeneous", 0)


def test_bench_refuses_bad_counts_and_seeds_in_one_line_naming_the_flag(capsys):
    import pytest

    from fedqhd.commands.main import main

    for args, flag, why in ((["--clients", "-1"], "--clients", "must be >= 1, got -1"),
                            (["--rounds", "0"], "--rounds", "must be >= 1, got 0"),
                            (["--suite", "paper", "--episodes", "0"], "--episodes", ">= 1"),
                            (["--suite", "federation-gap", "--seeds", "x"], "--seeds",
                             "'x' is not a seed"),
                            (["--seeds", "3-1"], "--seeds", "A <= B"),
                            (["--suite", "paper", "--jobs", "0"], "--jobs", ">= 1"),
                            (["--speed", "--dim", "two"], "--dim", "expected an integer")):
        with pytest.raises(SystemExit) as exit_info:
            main(["bench", *args])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert f"argument {flag}: " in err and why in err, err
    from fedqhd.commands.args import seed_list

    assert seed_list("0-2,7") == [0, 1, 2, 7]  # every suite takes ranges


def test_bench_refuses_flags_of_another_suite_bad_sets_and_outs_before_any_work(
        tmp_path, capsys, monkeypatch):
    import os

    from fedqhd.commands.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    os.mkfifo(tmp_path / "pipe")
    for args, says in (
            (["--merge", "a.json", "--out", "m"],
             "--merge: only for --suite paper, not the default bench"),
            (["--quick"], "--quick: only for --suite federation-gap, not the default bench"),
            (["--suite", "paper", "--only", "avg"],
             "--only: only for the default bench (no --suite), not --suite paper"),
            (["--suite", "federation-gap", "--no-flwr", "--rounds", "3"],
             "--no-flwr: only for --suite scale, not --suite federation-gap"),
            (["--dim", "64"], "--dim: only for --speed or --suite scale"),
            (["--suite", "federation-gap", "--dim", "64"], "--dim: only for --speed or"),
            (["--suite", "paper", "--rounds", "3"], "--rounds: not for --suite paper"),
            (["--set", "foo"], "--set 'foo': expected KEY=VALUE"),
            (["--set", "hd-dim="], "--set 'hd-dim=': expected KEY=VALUE"),
            (["--suite", "federation-gap", "--quick", "--out", "afile"],
             "--out afile: afile is a file, not a folder"),
            (["--suite", "paper", "--resume", "--overwrite", "--out", "o"],
             "exclude each other")):
        assert main(["bench", *args]) == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("fedqhd bench: error: ") and says in err[-1], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "pipe"]  # nothing ran
    from fedqhd.commands.args import writable_file
    from fedqhd.config import ConfigError

    (tmp_path / "link").symlink_to(tmp_path / "afile")
    for name, says in (("pipe", "not a regular file"), ("link", "is a link")):
        try:
            writable_file("--out", tmp_path / name)  # a writer would replace it
        except ConfigError as exc:
            assert says in str(exc)
        else:
            raise AssertionError(f"{name} accepted")
