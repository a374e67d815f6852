"""The paper suite's files: a stopped suite resumes with only its missing cells, a repeated
command does not overwrite hours of runs, and suites from several runs merge into one table
(refusing cells that disagree or protocols that differ)."""

import json
import re

import numpy as np
import pytest

from fedqhd.commands.main import main
from fedqhd.studies import paper


class FakeCell:
    """Stands in for :func:`fedqhd.studies.paper.run_cell`: a result that is a function of the
    cell, and a record of the cells it was asked for; raises on call ``fail_at``."""

    def __init__(self, fail_at: int | None = None, offset: float = 0.0) -> None:
        self.calls: list[tuple] = []
        self.fail_at, self.offset = fail_at, offset

    def __call__(self, method, env_id, setting, seed, episodes, clients):
        self.calls.append((method, env_id, setting, seed))
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise KeyboardInterrupt
        value = 10.0 * seed + (1.0 if setting == "shared" else 2.0) + self.offset
        return {"train-return-last100": value, "greedy-return": value, "wall-s": 1.0,
                "cpu-s": 1.0, "curve": [(20, value - 5), (40, value)]}


def suite(out, seeds, cell, **kw):
    return paper.run_suite(["CartPole-v1"], ["shared", "heterogeneous"], ["fedqhd"], seeds,
                           out, episodes=40, clients=2, progress=False, cell=cell, **kw)


def test_a_stopped_suite_keeps_its_cells_and_resume_runs_only_the_missing_ones(tmp_path):
    stopped = FakeCell(fail_at=3)
    with pytest.raises(KeyboardInterrupt):
        suite(tmp_path, [0, 1], stopped)
    kept = json.loads((tmp_path / "paper.json").read_text())  # whole, two cells
    assert [paper.cell_key(c) for c in kept["cells"]] == [
        ("fedqhd", "CartPole-v1", "shared", 0), ("fedqhd", "CartPole-v1", "shared", 1)]
    assert kept["environment"]["numpy"] == np.__version__

    with pytest.raises(FileExistsError, match="holds 2 cells"):
        suite(tmp_path, [0, 1], FakeCell())
    assert json.loads((tmp_path / "paper.json").read_text()) == kept  # untouched

    rest = FakeCell()
    summary = suite(tmp_path, [0, 1, 2], rest, resume=True)
    assert rest.calls == [("fedqhd", "CartPole-v1", "shared", 2)] + [
        ("fedqhd", "CartPole-v1", "heterogeneous", s) for s in (0, 1, 2)]
    assert len(summary["cells"]) == 6 and summary["started"] == kept["started"]
    table = (tmp_path / "paper-table.md").read_text()
    assert "11.0 +- 8.2 (466.3)" in table and "12.0 +- 8.2 (351.1)" in table
    assert (tmp_path / "curves-CartPole-v1.png").stat().st_size > 0

    nothing = FakeCell()
    suite(tmp_path, [0, 1, 2], nothing, resume=True)
    assert nothing.calls == []
    with pytest.raises(ValueError, match="same clients and episodes"):
        paper.run_suite(["CartPole-v1"], ["shared"], ["fedqhd"], [0], tmp_path,
                        episodes=600, clients=2, progress=False, cell=FakeCell(), resume=True)
    again = FakeCell()
    suite(tmp_path, [0], again, overwrite=True)
    assert len(again.calls) == 2
    assert len(json.loads((tmp_path / "paper.json").read_text())["cells"]) == 2


def test_cells_that_cannot_run_are_skipped_saying_why(tmp_path, capsys):
    """The pooled oracle sums FQI statistics of one feature space: on a task whose preset
    learns by TD (LunarLander), or with heterogeneous encoders, its cell is skipped, named
    with the run config's refusal, where CartPole's shared cell runs; FedAvg of networks has
    no heterogeneous cell. A cell asked for alone is refused likewise."""
    cell = FakeCell()
    summary = paper.run_suite(["CartPole-v1", "LunarLander-v3"], ["shared", "heterogeneous"],
                              ["pooled", "fedavg-dqn"], [0], tmp_path, episodes=40, clients=2,
                              cell=cell)
    assert cell.calls == [("pooled", "CartPole-v1", "shared", 0),
                          ("fedavg-dqn", "CartPole-v1", "shared", 0),
                          ("fedavg-dqn", "LunarLander-v3", "shared", 0)]
    skipped = {(x["method"], x["env-id"], x["setting"]): x["reason"]
               for x in summary["skipped"]}
    assert "update = 'fqi', got 'td'" in skipped["pooled", "LunarLander-v3", "shared"]
    assert "'encoder' = 'shared'" in skipped["pooled", "CartPole-v1", "heterogeneous"]
    assert len(skipped) == 5  # and the four heterogeneous cells of the two methods
    assert ("no pooled LunarLander-v3 shared: run-config key 'strategy' = 'pooled'"
            in capsys.readouterr().err)
    with pytest.raises(ValueError, match="update = 'fqi', got 'td'"):
        paper.run_cell("pooled", "MountainCar-v0", "shared", 0)


def test_merge_joins_suites_refuses_disagreeing_cells_and_other_protocols(tmp_path, capsys):
    a, b, c, d = (tmp_path / n for n in "abcd")
    suite(a, [0, 1], FakeCell())
    suite(b, [1, 2], FakeCell())          # seed 1 again, the same results: kept once
    suite(c, [2], FakeCell(offset=0.5))   # seed 2 with another result
    paper.run_suite(["CartPole-v1"], ["shared"], ["fedqhd"], [3], d, episodes=600,
                    clients=2, progress=False, cell=FakeCell())

    merged = paper.merge([a / "paper.json", b / "paper.json"])
    assert sorted(paper.cell_key(x)[2:] for x in merged["cells"]) == [
        (s, seed) for s in ("heterogeneous", "shared") for seed in (0, 1, 2)]
    assert all(x["environment"]["numpy"] == np.__version__ for x in merged["cells"])
    assert "11.0 +- 8.2 (466.3)" in paper.markdown_table(merged)

    with pytest.raises(ValueError, match=r"different results.*remove one"):
        paper.merge([b / "paper.json", c / "paper.json"])
    with pytest.raises(ValueError, match="protocol"):
        paper.merge([a / "paper.json", d / "paper.json"])
    (tmp_path / "other.json").write_text(json.dumps({"rounds": []}))
    with pytest.raises(ValueError, match="not a paper suite"):
        paper.merge([tmp_path / "other.json"])

    out = tmp_path / "all"
    assert main(["bench", "--suite", "paper", "--merge", str(a / "paper.json"),
                 str(b / "paper.json"), "--out", str(out)]) == 0
    assert "11.0 +- 8.2 (466.3)" in (out / "paper-table.md").read_text()
    assert (out / "curves-CartPole-v1.png").stat().st_size > 0
    assert len(json.loads((out / "paper.json").read_text())["merged-from"]) == 2
    capsys.readouterr()
    assert main(["bench", "--suite", "paper", "--merge", str(b / "paper.json"),
                 str(c / "paper.json"), "--out", str(tmp_path / "bad")]) == 2
    assert "different results" in capsys.readouterr().err
    # would replace a table not among its inputs
    assert main(["bench", "--suite", "paper", "--merge", str(c / "paper.json"),
                 "--out", str(a)]) == 2
    assert "exists" in capsys.readouterr().err


def test_the_command_refuses_to_overwrite_a_suite_before_running_anything(tmp_path, capsys):
    suite(tmp_path, [0], FakeCell())
    before = (tmp_path / "paper.json").read_text()
    assert main(["bench", "--suite", "paper", "--envs", "CartPole-v1", "--methods", "fedqhd",
                 "--seeds", "0", "--clients", "2", "--episodes", "40", "--out",
                 str(tmp_path)]) == 2
    assert re.search("holds 2 cells.*--resume / --overwrite", capsys.readouterr().err)
    assert (tmp_path / "paper.json").read_text() == before


def test_the_commit_is_fedqhds_own_and_not_a_repository_a_wheel_sits_in(tmp_path):
    import subprocess

    def git(cwd, *args):
        return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                              text=True).stdout.strip()

    repo = tmp_path / "checkout"
    (repo / "fedqhd").mkdir(parents=True)
    (repo / ".venv" / "site-packages" / "fedqhd").mkdir(parents=True)
    (repo / "fedqhd" / "x.py").write_text("a = 1\n")
    git(repo, "init", "-q")
    git(repo, "add", "fedqhd")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = git(repo, "rev-parse", "HEAD")
    assert paper.checkout_commit(repo / "fedqhd") == head
    (repo / "fedqhd" / "x.py").write_text("a = 2\n")
    assert paper.checkout_commit(repo / "fedqhd") == head + "-dirty"
    assert paper.checkout_commit(repo / ".venv" / "site-packages" / "fedqhd") is None
    (tmp_path / "loose" / "fedqhd").mkdir(parents=True)
    assert paper.checkout_commit(tmp_path / "loose" / "fedqhd") is None


def test_a_round_whose_replies_were_all_refused_leaves_the_curve_and_a_last_one_is_refused():
    """A diverging run can complete with rounds that accepted no reply (no training return
    in their row): the cell skips them in its curves; without one in the last round there
    is no final figure, and the cell says why rather than failing on a missing key."""
    def row(r, ret=None, refused=0):
        out = {"round": r, "return-mean": -90.0, "replies-sampled": 5,
               "replies-norm-refused": refused, "replies-ok": 5 - refused}
        if ret is not None:
            out.update({"train-return-last100": ret, "value-bias": 1.0})
        return out

    rows = [row(1, -200.0), row(2, refused=5), row(3, -120.0)]
    cell = paper.cell_from_rounds(rows, 5, "fedqhd Acrobot-v1 shared seed 0")
    assert cell["train-return-last100"] == -120.0 and cell["greedy-return"] == -90.0
    assert cell["curve"] == [(5, -200.0), (15, -120.0)]
    assert cell["value-bias"] == [(5, 1.0), (15, 1.0)]
    with pytest.raises(RuntimeError, match=r"seed 0: the last round \(3\) accepted no train "
                                           r"reply \(replies-sampled 5, replies-norm-refused 5"):
        paper.cell_from_rounds(rows[:2] + [row(3, refused=5)], 5, "fedqhd Acrobot-v1 shared seed 0")


@pytest.mark.parametrize("setting", paper.SETTINGS)
def test_a_paper_cell_neither_clips_nor_caps_and_keeps_the_default_norm_screen(setting):
    """The paper's table is of its weighted means as users get them: no honest reply is
    clipped or has its weight capped in a study, and the default norm screen, which
    leaves out a far-off reply on a few seeds (BENCHMARKS.md), stays on."""
    from fedqhd.learners import get_learner, parse_run_config
    from fedqhd.server.app import strategy_kwargs
    from fedqhd.strategies.screening import Safeguards

    cfg = parse_run_config(paper.app_run_config("fedqhd", "LunarLander-v3", setting, 0))
    # the strategy the ServerApp builds for the cell
    guards = get_learner(cfg.learner_key).server_plan(cfg, **strategy_kwargs(cfg)
                                                      ).strategy.safeguards
    assert guards == Safeguards(clip_factor=0.0, weight_cap_factor=0.0)
    assert guards.norm_bound_factor > 0
