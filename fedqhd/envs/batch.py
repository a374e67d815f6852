"""Batches of environments stepped together: numpy steppers that reproduce gymnasium's
dynamics for CartPole, MountainCar and Acrobot (one vectorised step for ``n`` episodes),
and a fallback that steps a list of gymnasium envs one after another (any registered
env, LunarLander's Box2D among them).

Online clients collect their episodes side by side with these, and greedy evaluations
(:func:`fedqhd.envs.classic.batch_rollout_returns`) step their episodes with them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from fedqhd.envs.classic import episode_seeds, make_env, validate_dynamics
from fedqhd.envs.registry import get_spec

__all__ = ["AcrobotBatch", "BatchEnv", "BatchPolicy", "CartPoleBatch", "GymBatch",
           "MountainCarBatch", "batch_rollout_returns", "make_batch_env", "numpy_stepper"]

BatchPolicy = Callable[[np.ndarray], np.ndarray]


class BatchEnv(Protocol):
    """``n`` environments: ``reset(idx)`` starts the slots ``idx`` and returns their
    observations; ``step(actions)`` moves every slot (observations, rewards, terminated)."""

    def reset(self, idx: np.ndarray) -> np.ndarray: ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class CartPoleBatch:
    """``n`` CartPole-v1 environments stepped together with gymnasium's dynamics
    (euler integrator, float64 state, float32 observations, reward 1 per step)."""

    def __init__(self, n: int, rng: np.random.Generator,
                 dynamics: dict[str, float] | None = None) -> None:
        p = validate_dynamics("CartPole-v1", dynamics)
        self.gravity, self.masscart = p["gravity"], p["masscart"]
        self.masspole, self.length = p["masspole"], p["length"]
        self.total_mass = self.masspole + self.masscart
        self.polemass_length = self.masspole * self.length
        self.force_mag, self.tau = 10.0, 0.02
        self.theta_threshold = 12 * 2 * math.pi / 360
        self.x_threshold = 2.4
        self.rng = rng
        self.state = np.zeros((n, 4))

    def reset(self, idx: np.ndarray) -> np.ndarray:
        self.state[idx] = self.rng.uniform(-0.05, 0.05, size=(len(idx), 4))
        return self.state[idx].astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(actions == 1, self.force_mag, -self.force_mag)
        costheta, sintheta = np.cos(theta), np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass))
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        self.state = np.stack([x + self.tau * x_dot, x_dot + self.tau * xacc,
                               theta + self.tau * theta_dot, theta_dot + self.tau * thetaacc],
                              axis=1)
        x, theta = self.state[:, 0], self.state[:, 2]
        terminated = ((x < -self.x_threshold) | (x > self.x_threshold)
                      | (theta < -self.theta_threshold) | (theta > self.theta_threshold))
        return self.state.astype(np.float32), np.ones(len(x)), terminated


class MountainCarBatch:
    """``n`` MountainCar-v0 environments stepped together with gymnasium's dynamics."""

    def __init__(self, n: int, rng: np.random.Generator,
                 dynamics: dict[str, float] | None = None) -> None:
        p = validate_dynamics("MountainCar-v0", dynamics)
        self.force, self.gravity = p["force"], p["gravity"]
        self.rng = rng
        self.state = np.zeros((n, 2))

    def reset(self, idx: np.ndarray) -> np.ndarray:
        self.state[idx, 0] = self.rng.uniform(-0.6, -0.4, size=len(idx))
        self.state[idx, 1] = 0.0
        return self.state[idx].astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        position, velocity = self.state[:, 0].copy(), self.state[:, 1].copy()
        velocity += (actions - 1) * self.force + np.cos(3 * position) * (-self.gravity)
        velocity = np.clip(velocity, -0.07, 0.07)
        position += velocity
        position = np.clip(position, -1.2, 0.6)
        velocity[(position == -1.2) & (velocity < 0)] = 0.0
        terminated = (position >= 0.5) & (velocity >= 0.0)
        self.state = np.stack([position, velocity], axis=1)
        return self.state.astype(np.float32), np.full(len(position), -1.0), terminated


class AcrobotBatch:
    """``n`` Acrobot-v1 environments stepped together with gymnasium's dynamics ("book"
    equations, one RK4 step of dt = 0.2 with the torque held, angles wrapped to
    [-pi, pi], velocities clipped; reward -1 per step, 0 on the terminating step).
    Link masses and lengths follow :func:`fedqhd.envs.make_env` (centres of mass at
    mid-length, moments of inertia 1)."""

    dt = 0.2
    max_vel_1, max_vel_2 = 4 * math.pi, 9 * math.pi

    def __init__(self, n: int, rng: np.random.Generator,
                 dynamics: dict[str, float] | None = None) -> None:
        p = validate_dynamics("Acrobot-v1", dynamics)
        self.m1, self.m2 = p["link_mass_1"], p["link_mass_2"]
        self.l1 = p["link_length_1"]
        self.lc1, self.lc2 = p["link_length_1"] / 2, p["link_length_2"] / 2
        self.rng = rng
        self.state = np.zeros((n, 4))

    def reset(self, idx: np.ndarray) -> np.ndarray:
        # gymnasium draws the start in float32 and integrates in float64
        self.state[idx] = self.rng.uniform(-0.1, 0.1, size=(len(idx), 4)).astype(np.float32)
        return self._obs(self.state[idx])

    @staticmethod
    def _obs(s: np.ndarray) -> np.ndarray:
        return np.stack([np.cos(s[:, 0]), np.sin(s[:, 0]), np.cos(s[:, 1]), np.sin(s[:, 1]),
                         s[:, 2], s[:, 3]], axis=1).astype(np.float32)

    def _rk4(self, y: tuple[Any, ...], a: Any, cos: Callable[[Any], Any],
             sin: Callable[[Any], Any]) -> tuple[Any, ...]:
        """One RK4 step of ``dt`` of the book equations with the torque ``a`` held, from
        the state's four components: the batch's columns (arrays, ``np.cos``) or one slot's
        floats (``math.cos``, :meth:`step_one`), the same operations in the same order."""
        m1, m2, l1, lc1, lc2 = self.m1, self.m2, self.l1, self.lc1, self.lc2
        i1 = i2 = 1.0
        g = 9.8

        def dsdt(theta1: Any, theta2: Any, dtheta1: Any, dtheta2: Any) -> tuple[Any, ...]:
            d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos(theta2)) + i1 + i2
            d2 = m2 * (lc2**2 + l1 * lc2 * cos(theta2)) + i2
            phi2 = m2 * lc2 * g * cos(theta1 + theta2 - math.pi / 2.0)
            phi1 = (-m2 * l1 * lc2 * (dtheta2 * dtheta2) * sin(theta2)
                    - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin(theta2)
                    + (m1 * lc1 + m2 * l1) * g * cos(theta1 - math.pi / 2) + phi2)
            ddtheta2 = ((a + d2 / d1 * phi1 - m2 * l1 * lc2 * (dtheta1 * dtheta1) * sin(theta2)
                         - phi2) / (m2 * lc2**2 + i2 - (d2 * d2) / d1))
            return dtheta1, dtheta2, -(d2 * ddtheta2 + phi1) / d1, ddtheta2

        dt = self.dt
        dt2 = dt / 2.0
        k1 = dsdt(*y)
        k2 = dsdt(*(v + dt2 * k for v, k in zip(y, k1, strict=True)))
        k3 = dsdt(*(v + dt2 * k for v, k in zip(y, k2, strict=True)))
        k4 = dsdt(*(v + dt * k for v, k in zip(y, k3, strict=True)))
        return tuple(v + dt / 6.0 * (p + 2 * q + 2 * r + s)
                     for v, p, q, r, s in zip(y, k1, k2, k3, k4, strict=True))

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        torque = np.asarray(actions, dtype=np.float64) - 1.0  # (-1, 0, +1)
        ns = np.stack(self._rk4(tuple(self.state.T), torque, np.cos, np.sin), axis=1)
        for j in (0, 1):  # gymnasium's wrap(): subtract / add 2 pi until inside
            col = ns[:, j]
            while (col > math.pi).any():
                col[col > math.pi] -= 2 * math.pi
            while (col < -math.pi).any():
                col[col < -math.pi] += 2 * math.pi
        ns[:, 2] = np.minimum(np.maximum(ns[:, 2], -self.max_vel_1), self.max_vel_1)
        ns[:, 3] = np.minimum(np.maximum(ns[:, 3], -self.max_vel_2), self.max_vel_2)
        self.state = ns
        terminated = -np.cos(ns[:, 0]) - np.cos(ns[:, 1] + ns[:, 0]) > 1.0
        return self._obs(ns), np.where(terminated, 0.0, -1.0), terminated

    def step_one(self, action: int) -> tuple[np.ndarray, float, bool]:
        """:meth:`step` of a one-slot batch in Python floats (the same bits: tested), for
        a TD client's step-by-step episodes, where numpy's per-call cost on length-1
        arrays made the step 70 % of the learner's time (96 of 137 us a step, D 10,000):
        ``action -> (observation, reward, terminated)``."""
        ns = list(self._rk4(tuple(self.state[0].tolist()), float(action) - 1.0, math.cos,
                            math.sin))
        for j in (0, 1):
            while ns[j] > math.pi:
                ns[j] -= 2 * math.pi
            while ns[j] < -math.pi:
                ns[j] += 2 * math.pi
        ns[2] = min(max(ns[2], -self.max_vel_1), self.max_vel_1)
        ns[3] = min(max(ns[3], -self.max_vel_2), self.max_vel_2)
        self.state[0] = ns
        c1, c12 = math.cos(ns[0]), math.cos(ns[1] + ns[0])
        terminated = -c1 - c12 > 1.0
        obs = np.array([c1, math.sin(ns[0]), math.cos(ns[1]), math.sin(ns[1]), ns[2], ns[3]],
                       dtype=np.float32)
        return obs, 0.0 if terminated else -1.0, terminated


class GymBatch:
    """Fallback: ``n`` unwrapped gymnasium envs stepped one after another."""

    def __init__(self, env_id: str, n: int, rng: np.random.Generator,
                 dynamics: dict[str, float] | None = None) -> None:
        self.envs = [make_env(env_id, dynamics).unwrapped for _ in range(n)]
        self.rng = rng
        self.obs = np.zeros((n, get_spec(env_id).obs_dim), dtype=np.float32)

    def reset(self, idx: np.ndarray) -> np.ndarray:
        for i in idx:  # unwrapped: no flattening wrapper, so flatten here (rank > 1 Box)
            obs, _ = self.envs[i].reset(seed=int(self.rng.integers(2**31 - 1)))
            self.obs[i] = np.asarray(obs).reshape(-1)
        return self.obs[idx].copy()

    def step(self, actions: np.ndarray, active: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(self.envs)
        rewards, terminated = np.zeros(n), np.zeros(n, dtype=bool)
        for i in (range(n) if active is None else np.flatnonzero(active)):
            obs, rewards[i], terminated[i], _, _ = self.envs[i].step(int(actions[i]))
            self.obs[i] = np.asarray(obs).reshape(-1)
        return self.obs.copy(), rewards, terminated


_BATCH: dict[str, type[CartPoleBatch] | type[MountainCarBatch] | type[AcrobotBatch]] = {
    "CartPole-v1": CartPoleBatch, "MountainCar-v0": MountainCarBatch,
    "Acrobot-v1": AcrobotBatch}


def numpy_stepper(env_id: str, n: int, rng: np.random.Generator,
                  dynamics: dict[str, float] | None = None
                  ) -> CartPoleBatch | MountainCarBatch | AcrobotBatch | None:
    """A numpy stepper of ``n`` copies of ``env_id``, or None where there is none."""
    cls = _BATCH.get(env_id)
    return None if cls is None else cls(n, rng, dynamics)


def make_batch_env(env_id: str, n: int, rng: np.random.Generator,
                   dynamics: dict[str, float] | None = None
                   ) -> CartPoleBatch | MountainCarBatch | AcrobotBatch | GymBatch:
    """A batch of ``n`` environments: numpy stepper where one exists, else :class:`GymBatch`."""
    if env_id in _BATCH:
        return _BATCH[env_id](n, rng, dynamics)
    return GymBatch(env_id, n, rng, dynamics)


def batch_rollout_returns(env_id: str, policy: BatchPolicy, n_episodes: int, seed: int,
                          dynamics: dict[str, float] | None = None) -> np.ndarray:
    """Returns of ``n_episodes`` episodes of ``policy`` stepped side by side: the episodes
    of :func:`fedqhd.envs.rollout_returns` (the same episode seeds and start states), with
    ``policy`` asked once per step for all running episodes (observations stacked, shape
    (k, obs_dim) -> k actions), so a policy that encodes states acts on a batch.

    Tasks with a numpy stepper are stepped by it from gymnasium's start states (the same
    dynamics, 5-10x less CPU than gymnasium's envs one by one); the others step a list of
    gymnasium envs."""
    if n_episodes < 1:
        raise ValueError(f"n_episodes must be >= 1, got {n_episodes}")
    n = int(n_episodes)
    seeds = episode_seeds(seed, n)
    stepper = numpy_stepper(env_id, n, np.random.default_rng(0), dynamics)
    if stepper is None:
        return _gym_rollout_returns(env_id, policy, seeds, dynamics)
    limit = get_spec(env_id).max_episode_steps
    env = make_env(env_id, dynamics)
    try:
        first = []
        for i, s in enumerate(seeds):
            first.append(np.asarray(env.reset(seed=int(s))[0], dtype=np.float32).reshape(-1))
            stepper.state[i] = np.asarray(env.unwrapped.state,  # type: ignore[attr-defined]
                                          dtype=np.float64)
        obs = np.stack(first)
    finally:
        env.close()
    returns = np.zeros(n)
    running = np.ones(n, dtype=bool)
    actions = np.zeros(n, dtype=np.int64)
    t = 0
    while running.any():
        live = np.flatnonzero(running)
        actions[live] = policy(obs[live])
        obs, rewards, terminated = stepper.step(actions)
        returns[live] += rewards[live]
        t += 1
        ended = running & terminated
        if ended.any():  # finished slots restart: their states stay bounded, returns kept
            stepper.reset(np.flatnonzero(ended))
        running &= ~terminated
        if limit is not None and t >= limit:
            break
    return returns


def _gym_rollout_returns(env_id: str, policy: BatchPolicy, seeds: np.ndarray,
                         dynamics: dict[str, float] | None) -> np.ndarray:
    envs = [make_env(env_id, dynamics) for _ in seeds]
    try:
        obs = [env.reset(seed=int(s))[0] for env, s in zip(envs, seeds, strict=True)]
        returns = np.zeros(len(envs))
        running = list(range(len(envs)))
        while running:
            actions = policy(np.stack([obs[i] for i in running]))
            still = []
            for i, action in zip(running, actions, strict=True):
                obs[i], reward, terminated, truncated, _ = envs[i].step(int(action))
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            running = still
        return returns
    finally:
        for env in envs:
            env.close()
