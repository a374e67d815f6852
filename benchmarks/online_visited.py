"""Where an online run's buffer lives: percentiles of each scaled observation coordinate.

Runs :func:`fedqhd.online.run_online` once and records every state admitted to any
client's buffer (the regression's inputs), divided by the task's ``obs_bound``
(``fedqhd.envs``), so a coordinate whose high percentiles sit far below 1 is resolved
coarsely by an RFF kernel of length scale ~1 (``obs_scale`` in ``ONLINE_SETTINGS``
narrows it per coordinate). Single-threaded:

    OMP_NUM_THREADS=1 python benchmarks/online_visited.py --env Acrobot-v1 --seed 43
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from fedqhd.envs import get_spec
from fedqhd.online import OnlineClient, run_online


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Acrobot-v1")
    parser.add_argument("--encoder", default="shared", choices=["shared", "heterogeneous"])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--episodes", type=int, default=600)
    parser.add_argument("--last", type=int, default=200,
                        help="also report the states of each client's last LAST episodes' rounds")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=JSON")
    args = parser.parse_args()
    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    bound = np.asarray(get_spec(args.env).obs_bound, dtype=float)
    seen: list[tuple[int, np.ndarray]] = []  # (episodes collected so far, scaled states)
    original = OnlineClient.append

    def recording(self: OnlineClient, states: np.ndarray, *a, **k) -> None:
        seen.append((len(self.episode_returns), np.asarray(states) / bound))
        original(self, states, *a, **k)

    OnlineClient.append = recording  # type: ignore[method-assign]
    try:
        r = run_online(args.env, episodes=args.episodes, encoder=args.encoder,
                       seed=args.seed, **overrides)
    finally:
        OnlineClient.append = original  # type: ignore[method-assign]
    print(f"{args.env} {args.encoder} seed={args.seed}: last100 {r.train_return_last100:.1f} "
          f"greedy {r.greedy_return:.1f} cpu {r.cpu_s:.1f} s, overrides {overrides or 'none'}")
    late = args.episodes - args.last
    for name, rows in (("all episodes", [x for _, x in seen]),
                       (f"episodes > {late}", [x for n, x in seen if n > late])):
        x = np.abs(np.concatenate(rows))
        print(f"|scaled obs| percentiles 50 / 90 / 99 / max, {name} ({len(x)} states):")
        for j in range(x.shape[1]):
            p = np.percentile(x[:, j], [50, 90, 99, 100])
            print(f"  coord {j} (bound {bound[j]:.3g}): " + " / ".join(f"{v:.3f}" for v in p))


if __name__ == "__main__":
    main()
