"""Round time of a real deployment: a small offline run through ``flwr run`` on a
LocalDeployment (SuperLink, SuperExecs and SuperNodes as separate processes on loopback,
TLS, authenticated SuperNodes, as ``docker-compose.yml``), each round's wall time from
its results. BENCHMARKS.md, "Checkpoint and resume" (deployment rounds).

    PATH=$VENV/bin:$PATH OMP_NUM_THREADS=1 python benchmarks/deployment_rounds.py --rounds 8

Everything started is stopped on exit, also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedqhd.deploy.launcher import LocalDeployment, interrupts_as_exceptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--supernodes", type=int, default=3)
    args = parser.parse_args()
    keys = {"min-nodes": args.supernodes, "eval-episodes": 2, "hd-dim": 200, "seed": 4,
            "num-server-rounds": args.rounds}
    root = Path(tempfile.mkdtemp(prefix="fedqhd-deployment-rounds-"))
    shards = root / "shards"
    subprocess.run([sys.executable, "-m", "fedqhd.commands", "data", "generate",
                    "--num-partitions", str(args.supernodes), "--episodes", "3", "--seed",
                    "0", "--out", str(shards), "--force"], check=True, capture_output=True)
    app = Path(__file__).resolve().parents[1]
    with LocalDeployment(root / "run", num_supernodes=args.supernodes, shards_dir=shards,
                         app_dir=app) as deployment:
        t0 = time.perf_counter()
        results = deployment.run(keys, timeout_s=600)
        wall = time.perf_counter() - t0
    rows = json.loads(results.read_text())["rounds"]
    ends = [r["wall-time-s"] for r in rows]
    print(json.dumps({"wall-s": round(wall, 2), "rounds": len(rows),
                      "round-s": [round(b - a, 2) for a, b in zip([0.0, *ends[:-1]], ends,
                                                                  strict=True)],
                      "return-mean": rows[-1].get("return-mean"), "results": str(results)}))


if __name__ == "__main__":
    with interrupts_as_exceptions():
        main()
