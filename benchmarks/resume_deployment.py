"""Resume in a real deployment (issue 11): a 3-round run against a 2-round run resumed to 3
rounds, both through ``flwr run`` on a LocalDeployment (TLS, 3 authenticated SuperNodes,
consensus-ADMM clients; the SuperNodes keep their node ids between the runs).

    PATH=$VENV/bin:$PATH PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/resume_deployment.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from fedqhd.deploy.launcher import LocalDeployment, interrupts_as_exceptions

BASE = {"min-nodes": 3, "eval-episodes": 2, "hd-dim": 200, "seed": 4}


def _rows(run_dir: Path) -> list[dict]:
    rows = json.loads((run_dir / "results.json").read_text())["rounds"]
    return [{k: v for k, v in r.items() if k != "wall-time-s"} for r in rows]


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="fedqhd-resume-"))
    shards = root / "shards"
    subprocess.run([sys.executable, "-m", "fedqhd.commands", "data", "generate", "--num-partitions",
                    "3", "--episodes", "3", "--seed", "0", "--out", str(shards), "--force"],
                   check=True, capture_output=True)
    app = Path(__file__).resolve().parents[1]
    start = time.time()
    with LocalDeployment(root / "run", num_supernodes=3, shards_dir=shards, app_dir=app) as dep:
        reference = dep.run({**BASE, "num-server-rounds": 3}, timeout_s=400).parent
        stopped = dep.run({**BASE, "num-server-rounds": 2}, timeout_s=400).parent
        dep.run({**BASE, "num-server-rounds": 3, "resume-from": str(stopped)}, timeout_s=400)
    a = np.load(reference / "final_model.npz")["readout"]
    b = np.load(stopped / "final_model.npz")["readout"]
    print(f"{time.time() - start:.0f} s; final readout max |diff| {np.abs(a - b).max():.3g}")
    for x, y in zip(_rows(reference), _rows(stopped), strict=True):
        diff = {k: abs(x[k] - y[k]) for k in x if x[k] != y[k]}
        print(f"round {x['round']}: differing metrics {diff or 'none'}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    with interrupts_as_exceptions():  # a SIGTERM (timeout, CI) still stops the deployment
        main()
