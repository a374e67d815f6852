"""Two environments nobody tuned, run with the settings fedqhd derives for them.

The issue-34 bar: with derived settings (``preset = "auto"``, :mod:`fedqhd.presets.derive`)
and defaults otherwise, the federated greedy policy beats a uniform-random policy and the
best constant action on at least 4 of 5 seeds (20 evaluation episodes each), offline and
online, on two user envs that are not built-in tasks:

* PointMass-v0: 1-D point mass, observations (x, v) in an UNBOUNDED Box, 3 actions (push
  -1 / 0 / +1), dt 0.1, v += 0.1 push + N(0, 0.01), x += 0.1 v; start x ~ U(-2, 2),
  v ~ U(-0.1, 0.1); reward -|x| per step; horizon 200, never terminates.
* ReachTarget-v0: a 2-D gridless walk, observations (x, y) in Box(-10, 10) (bounded, but
  the visited states fill a small part of it), 4 actions (E / W / N / S, step 0.5 plus
  N(0, 0.05) per axis), start U(-1, 1)^2, a disc of radius 1 at (2.5, 2.5): +1000 and the
  episode ends on reaching it, -10 per step otherwise; horizon 50.

    OMP_NUM_THREADS=1 python benchmarks/user_envs.py [--seeds 0-4] [--envs PointMass-v0,...]
        [--protocols offline,online] [--out user-envs.json]

Prints one markdown row per (env, protocol) and writes every run's numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

from fedqhd.envs import register_env


class PointMass(gym.Env):
    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(3)

    def __init__(self, dt: float = 0.1, noise: float = 0.01) -> None:
        self.dt, self.noise = dt, noise
        self.x = self.v = 0.0

    def _obs(self):
        return np.array([self.x, self.v], dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-2.0, 2.0))
        self.v = float(self.np_random.uniform(-0.1, 0.1))
        return self._obs(), {}

    def step(self, action):
        push = float(int(action) - 1)
        self.v += self.dt * push + float(self.np_random.normal(0.0, self.noise))
        self.x += self.dt * self.v
        return self._obs(), -abs(self.x), False, False, {}


class ReachTarget(gym.Env):
    observation_space = gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(4)
    MOVES = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    TARGET = np.array([2.5, 2.5])

    def __init__(self, step: float = 0.5, noise: float = 0.05, radius: float = 1.0) -> None:
        self.step_size, self.noise, self.radius = step, noise, radius
        self.p = np.zeros(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.p = self.np_random.uniform(-1.0, 1.0, size=2)
        return self.p.copy(), {}

    def step(self, action):
        move = self.MOVES[int(action)] * self.step_size
        self.p = np.clip(self.p + move + self.np_random.normal(0.0, self.noise, size=2),
                         -10.0, 10.0)
        if np.linalg.norm(self.p - self.TARGET) <= self.radius:
            return self.p.copy(), 1000.0, True, False, {}
        return self.p.copy(), -10.0, False, False, {}


register_env("PointMass-v0", factory=PointMass, max_episode_steps=200, overwrite=True)
register_env("ReachTarget-v0", factory=ReachTarget, max_episode_steps=50, overwrite=True)


def run(env_id: str, protocol: str, seed: int, out: Path) -> dict:
    """One federation of 5 clients with the derived settings; its final greedy return
    (20 episodes) against the run's references."""
    from flwr.common.logger import FLOWER_LOGGER

    from fedqhd.client.app import app as client_app
    from fedqhd.learners import parse_run_config
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    FLOWER_LOGGER.setLevel(logging.WARNING)
    cfg = parse_run_config({"env-id": env_id, "protocol": protocol, "seed": seed,
                            "min-nodes": 5, "eval-episodes": 20, "eval-every": 100_000,
                            "output-dir": str(out)})
    cpu = time.process_time()
    final, _ = run_federation(InProcessGrid([client_app] * 5, run_config=cfg.to_run_config()),
                              cfg)
    ref = final["reference"]
    ret = float(final["return-mean"])
    return {"env-id": env_id, "protocol": protocol, "seed": seed, "greedy-return": ret,
            "random": ref["random-mean"], "best-constant": ref["best-constant-mean"],
            "beats-both": ret > ref["random-mean"] and ret > ref["best-constant-mean"],
            "cpu-s": time.process_time() - cpu, "settings": cfg.record()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-4")
    p.add_argument("--envs", default="PointMass-v0,ReachTarget-v0")
    p.add_argument("--protocols", default="offline,online")
    p.add_argument("--out", type=Path, default=Path("user-envs.json"))
    a = p.parse_args()
    from fedqhd.studies.paper import parse_seeds

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for env_id in a.envs.split(","):
            for protocol in a.protocols.split(","):
                cell = [run(env_id, protocol, s, Path(tmp)) for s in parse_seeds(a.seeds)]
                rows += cell
                a.out.write_text(json.dumps(rows, indent=1))
                wins = sum(r["beats-both"] for r in cell)
                print(f"| {env_id} | {protocol} | "
                      + " / ".join(f"{r['greedy-return']:.1f}" for r in cell)
                      + f" | {np.mean([r['random'] for r in cell]):.1f} | "
                      f"{np.mean([r['best-constant'] for r in cell]):.1f} | {wins} of "
                      f"{len(cell)} | {np.mean([r['cpu-s'] for r in cell]):.0f} |", flush=True)


if __name__ == "__main__":
    main()
