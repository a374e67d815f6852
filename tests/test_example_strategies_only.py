"""examples/strategies_only: a third-party Flower app that imports only fedqhd.strategies.

Fast: its ServerApp and ClientApps in one process (InProcessGrid). Slow: under a real
``flwr run`` (SuperLink in simulation mode, Ray, 4 SuperNodes), as its README says. Both
read the result file the ServerApp writes after checking the aggregates numerically.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from fedqhd.server.inprocess import InProcessGrid

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "strategies_only"
BIN = Path(sys.executable).parent


def _run_config(result: Path) -> dict:
    config = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    return {**config["config"], "result-file": str(result)}


@pytest.fixture
def example(monkeypatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    """The example's (client_app, server_app) modules, imported from its folder and
    forgotten afterwards (their names are generic)."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield importlib.import_module("client_app"), importlib.import_module("server_app")
    for name in ("client_app", "server_app", "task"):
        sys.modules.pop(name, None)


def test_example_app_in_process(tmp_path: Path, example) -> None:
    client_app, server_app = example
    run_config = _run_config(tmp_path / "result.json")
    grid = InProcessGrid([client_app.app] * 4, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    server_app.app(grid, context)
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["ok"] and result["nodes"] == 4, result
    assert result["avg-error"] < 1e-8 and result["exact-error"] < 1e-8, result


def test_example_app_fails_the_run_when_an_aggregate_is_wrong(tmp_path: Path, example,
                                                              monkeypatch) -> None:
    """The example's own check must catch a wrong aggregate (else CI proves nothing)."""
    client_app, server_app = example
    run_config = _run_config(tmp_path / "result.json")
    # clients report half their size: the weighted average shifts, the check must see it
    real = client_app.MetricRecord
    monkeypatch.setattr(client_app, "MetricRecord", lambda m: real(
        {**m, "num-examples": m["num-examples"] / 2 if m.get("partition-id") == 0
         else m["num-examples"]}))
    grid = InProcessGrid([client_app.app] * 4, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    with pytest.raises(RuntimeError, match="differs from its numpy reference"):
        server_app.app(grid, context)
    assert not json.loads((tmp_path / "result.json").read_text())["ok"]


def test_example_app_keeps_the_initial_model_when_no_round_aggregates(
        tmp_path: Path, example, monkeypatch, capsys) -> None:
    """Every FedQHDAvg train reply left out (a non-finite readout): Flower's
    ``Result.arrays`` is empty; the ServerApp says so, keeps the initial model and fails
    its check instead of a KeyError."""
    client_app, server_app = example
    run_config = _run_config(tmp_path / "result.json")
    monkeypatch.setattr(client_app, "ridge_fit",
                        lambda x, y, ridge: np.full((x.shape[1], 1), np.nan))
    grid = InProcessGrid([client_app.app] * 4, run_config)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(),
                      run_config=run_config)
    with pytest.raises(RuntimeError, match="differs from its numpy reference"):
        server_app.app(grid, context)
    assert ("no FedQHDAvg round aggregated anything (every train reply was left out); "
            "keeping the initial model") in capsys.readouterr().out
    checks = json.loads((tmp_path / "result.json").read_text())
    assert not checks["ok"] and not checks["avg-aggregated"] and checks["exact-aggregated"]
    assert checks["avg-replies-ok"] == 0 and checks["exact-error"] < 1e-8, checks
    # the clients evaluated the initial (zero) readout
    assert checks["evaluate-mse-error"] < 1e-8, checks


def test_example_lists_fedqhd_in_its_dependencies() -> None:
    """The documented dependency line (docs/strategies.md, "Your app's dependencies")."""
    project = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]
    assert "fedqhd" in project["dependencies"]


@pytest.mark.slow
def test_example_app_under_flwr_run(tmp_path: Path, monkeypatch) -> None:
    """The example as a user runs it: ``fedqhd`` in its ``[project] dependencies``, the
    SuperLink started with the per-run install off (as ``FLWR_DISABLE_RUNTIME_DEPENDENCY_
    INSTALLATION=1 flwr run`` starts it). The caller's folder is another app whose
    ``task.py`` makes other data: a SuperLink started there would give its clients that
    ``task.py`` (Ray puts the SuperLink's cwd on every worker's ``sys.path``) and the
    check below would fail; ``local_superlink`` starts it in an empty folder."""
    from fedqhd.studies.scale import local_superlink

    older_app = tmp_path / "older_app"
    older_app.mkdir()
    task = (EXAMPLE / "task.py").read_text()
    stale = task.replace("n = 40 + 30 * partition_id", "n = 41 + 30 * partition_id")
    assert stale != task
    (older_app / "task.py").write_text(stale)
    monkeypatch.chdir(older_app)
    result = tmp_path / "result.json"
    with local_superlink(tmp_path / "superlink") as (env, _):
        assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
        proc = subprocess.run(
            [str(BIN / "flwr"), "run", ".", "--stream", "--federation-config",
             "num-supernodes=4 client-resources-num-cpus=1",
             "--run-config", f"result-file='{result}'"],
            cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert result.exists(), log[-4000:]
    checks = json.loads(result.read_text())
    assert checks["ok"] and checks["nodes"] == 4, checks
    assert checks["avg-error"] < 1e-8 and checks["exact-error"] < 1e-8, checks
    assert "The SuperLink runs in" not in log, log[-4000:]  # nothing for the warning


def test_the_stale_clientapp_warning_names_the_modules_another_folder_shadows(
        tmp_path: Path, caplog) -> None:
    from fedqhd.strategies.stale import warn_if_stale_clientapp

    app, other, same = tmp_path / "app", tmp_path / "other_app", tmp_path / "same_app"
    for folder in (app, other, same):
        (folder / "pkg").mkdir(parents=True)
        (folder / "task.py").write_text(f"WHERE = {folder.name!r}\n")
        (folder / "client_app.py").write_text("from task import WHERE\n")
    (same / "task.py").write_text((app / "task.py").read_text())
    (app / "pkg" / "__init__.py").write_text("")
    with caplog.at_level("WARNING"):
        assert warn_if_stale_clientapp(app, cwd=other) == ["task"]
    assert f"The SuperLink runs in {other}" in caplog.text and "(task.py)" in caplog.text
    # the app's own folder, or one with the same files (where it was started): no warning
    assert warn_if_stale_clientapp(app, cwd=app) == []
    assert warn_if_stale_clientapp(app, cwd=same) == []
    assert warn_if_stale_clientapp(app, cwd=tmp_path / "missing") == []
    (other / "pkg" / "__init__.py").write_text("")
    assert warn_if_stale_clientapp(app, cwd=other) == ["pkg", "task"]
