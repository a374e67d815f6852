"""A small custom environment, registered with fedqhd when this module is imported.

``MyEnv-v0``: keep a point near the centre of a line. The point drifts with its
velocity; action 1 pushes right, action 0 pushes left (a little noise is added).
Reward +1 per step while ``|x| < 1``; leaving the interval terminates the episode;
the registry adds a time limit of 100 steps. Uniform random pushes leave the
interval after a few dozen steps; a linear rule (push right when ``x + 5 v < 0``)
stays in for all 100.

The observation is a 2 x 3 matrix (a Box of rank 2, unbounded): position and
velocity features in the first row, a constant and two mixed features in the
second. fedqhd flattens it to 6 numbers and infers the encoder's scale from
random rollouts (``obs_bound="data"``; the constant coordinate gets scale 1).

Used by ``run-config env-module='my_env'`` (this folder is the Flower app, so the
module is importable in the ServerApp and every ClientApp) and by
``fedqhd bench --env-module my_env`` with this folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from fedqhd.envs import register_env

ENV_ID = "MyEnv-v0"


class MyEnv(gym.Env):
    """Keep a drifting point inside ``(-1, 1)``; no render modes, no time limit of its own."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2, 3), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, push: float = 0.02, noise: float = 0.005) -> None:
        self.push, self.noise = push, noise
        self.x = self.v = 0.0

    def _obs(self) -> np.ndarray:
        x, v = self.x, self.v
        return np.array([[x, v, 10.0 * v], [3.0, x + v, x - 10.0 * v]], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-0.3, 0.3))
        self.v = float(self.np_random.uniform(-0.02, 0.02))
        return self._obs(), {}

    def step(self, action):
        direction = 1.0 if int(action) == 1 else -1.0
        self.v += direction * self.push + float(self.np_random.normal(0.0, self.noise))
        self.x += self.v
        terminated = abs(self.x) >= 1.0
        return self._obs(), 1.0, terminated, False, {}


# importing this module twice (as a script and as a module) is harmless
register_env(ENV_ID, factory=MyEnv, obs_bound="data", max_episode_steps=100, overwrite=True)
