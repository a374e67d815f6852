"""The ``fedqhd pool`` sub-commands write JSON and PNG."""

import json

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
