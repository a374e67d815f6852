"""Issue 11, "huge but finite data": one client's shard holds a reward of 3e38 (or an
observation of 1e30); what does a run do with it?

Writes 5 CartPole-v1 client shards (``fedqhd data generate`` settings: behaviour-skew,
5 episodes, the seed) to a temporary ``data-dir``, sets reward row 0 of client 4 to
``--reward`` (or its cart velocity to ``--observation``) without validation, and runs
the real ServerApp logic and ClientApps in process (``InProcessGrid``) for
``--rounds`` rounds with the default run config. Prints JSON: the largest absolute
entry of the final global readout, the final greedy return, the reply counts of the
last round and the run's status.

    PYTHONPATH=. python benchmarks/huge_values.py --seed 0 [--value-check warn]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reward", type=float, default=3e38)
    parser.add_argument("--observation", type=float, default=None,
                        help="put this cart velocity in row 0 instead of the reward")
    parser.add_argument("--value-check", default=None, help="run-config value-check")
    parser.add_argument("--norm-bound-factor", type=float, default=None,
                        help="run-config norm-bound-factor (0: the server's norm bound off)")
    args = parser.parse_args()

    from fedqhd.client.app import app as client_app
    from fedqhd.config import RunConfig
    from fedqhd.data import generate_client_shard, shard_filename
    from fedqhd.server import app as server_app
    from fedqhd.server.inprocess import InProcessGrid

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "shards"
        data.mkdir()
        for i in range(5):
            shard = generate_client_shard("CartPole-v1", "behaviour-skew", i, 5, 5, args.seed)
            if i == 4:
                if args.observation is None:
                    shard.rewards[0] = args.reward
                else:
                    shard.observations[0, 1] = args.observation
            np.savez(data / shard_filename(i), **shard.arrays(),
                     metadata=np.array(json.dumps(shard.metadata)))
        keys: dict = {"value_check": args.value_check} if args.value_check else {}
        if args.norm_bound_factor is not None:
            keys["norm_bound_factor"] = args.norm_bound_factor
        cfg = RunConfig(seed=args.seed, data_dir=str(data), num_server_rounds=args.rounds,
                        output_dir=str(Path(tmp) / "out"), **keys)
        grid = InProcessGrid([client_app] * 5, run_config=cfg.to_run_config())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            final, out_dir = server_app.run_federation(grid, cfg)
        results = json.loads((out_dir / "results.json").read_text())
        readout = np.load(out_dir / "final_model.npz")["readout"]
    last = results["rounds"][-1]
    print(json.dumps({
        "seed": args.seed, "value_check": args.value_check or "(none)",
        "norm_bound_factor": cfg.norm_bound_factor,
        "readout_max_abs": float(np.abs(readout).max()),
        "return_mean": final.get("return-mean"), "status": final.get("status"),
        **{k: last.get(k) for k in ("replies-ok", "replies-failed", "replies-rejected",
                                    "replies-norm-refused", "value-flags")}}))


if __name__ == "__main__":
    main()
