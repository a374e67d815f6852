"""A custom environment registered with gymnasium only: no fedqhd import, no
``register_env``.

``GymDrift-v0`` is ``MyEnv-v0`` of ``my_env.py`` (keep a drifting point inside
``(-1, 1)``; action 1 pushes right, 0 left; reward +1 per step; leaving ends the
episode) registered the way gymnasium users already do, with ``gym.register`` and a
time limit of 100 steps. Its observation is a 2 x 3 matrix in an unbounded Box and its
actions are Discrete(2): fedqhd makes its registry entry from those spaces and the spec
(flattened to 6 numbers, scales inferred from random rollouts, the spec's 100 steps).

Run it from this folder (no heuristic controller: random behaviour, epsilon 1)::

    flwr run . --stream --federation-config "num-supernodes=5" --run-config \
      "env-module='gym_env' env-id='GymDrift-v0' partition='iid' epsilon-min=1.0 epsilon-max=1.0"

or in process, with this folder on PYTHONPATH::

    fedqhd bench --env-module gym_env --env GymDrift-v0 --only avg \
      --set "partition='iid'" --set epsilon-min=1.0 --set epsilon-max=1.0
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

ENV_ID = "GymDrift-v0"


class GymDrift(gym.Env):
    """Keep a drifting point inside ``(-1, 1)``; the time limit is the registration's."""

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


if ENV_ID not in gym.registry:  # importing this module twice is harmless
    gym.register(ENV_ID, entry_point=GymDrift, max_episode_steps=100)
