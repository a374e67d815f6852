"""Experience replay for TD clients (``update = "td"``, preset key ``td-replay``).

A TD client learns once from each transition, as it steps. With replay it also keeps its
latest ``td-replay-size`` transitions, raw (a few MB: no features are stored, they are
encoded again when drawn), and after each episode makes ``td-replay`` x the episode's
length further TD updates, at step ``td-replay-rate``, on transitions drawn uniformly
from them: the older experience a tracking TD learner forgets is learnt again, as DQN's
buffer does for its network. ``td-replay-start`` episodes pass before a client replays
(their transitions are kept): its long, near-random first episodes are learnt once.
Acrobot's shared preset replays, from each client's 201st episode: paired with no
replay, +2.6 (SE 1.2) last-100 return on 20 fresh seeds at twice the CPU; replaying from
the first, one run in ten stalled on a worse policy, from the 201st one in twenty (+1.4,
SE 1.0, on 40 fresh seeds). On LunarLander and on heterogeneous Acrobot replay lost
(BENCHMARKS.md, "Online presets" and the Acrobot paragraph).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["BATCH", "ReplayRing", "replay"]

#: transitions a replay update takes together: their TD errors under the readout as the
#: batch finds it, summed into it (one matrix product, not one per transition)
BATCH = 16


class ReplayRing:
    """The latest ``size`` transitions of a TD client, raw: states, actions, rewards, next
    states and whether the episode terminated there (a time-limit truncation did not)."""

    def __init__(self, size: int, obs_dim: int) -> None:
        if size < 1:
            raise ValueError(f"a replay ring needs at least one slot, got {size}")
        self.states = np.zeros((size, obs_dim), dtype=np.float32)
        self.next_states = np.zeros((size, obs_dim), dtype=np.float32)
        self.actions = np.zeros(size, dtype=np.int64)
        self.rewards = np.zeros(size)
        self.terminal = np.zeros(size, dtype=bool)
        self.filled = 0  # slots holding a transition
        self.position = 0  # the slot the next transition overwrites

    def add(self, state: np.ndarray, action: int, reward: float, next_state: np.ndarray,
            terminated: bool) -> None:
        i = self.position
        self.states[i], self.next_states[i] = state, next_state
        self.actions[i], self.rewards[i], self.terminal[i] = action, reward, terminated
        self.position = (i + 1) % len(self.actions)
        self.filled = min(self.filled + 1, len(self.actions))

    def snapshot(self) -> dict[str, np.ndarray]:
        """The filled slots as they lie (a restored ring draws the same transitions)."""
        n = self.filled
        return {"replay-states": self.states[:n].copy(),
                "replay-next-states": self.next_states[:n].copy(),
                "replay-actions": self.actions[:n].copy(),
                "replay-rewards": self.rewards[:n].copy(),
                "replay-terminal": self.terminal[:n].copy(),
                "replay-position": np.array([self.position], dtype=np.int64)}

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        n = len(arrays["replay-actions"])
        if n > len(self.actions) or arrays["replay-states"].shape[1:] != self.states.shape[1:]:
            raise ValueError(f"a replay snapshot of {arrays['replay-states'].shape} does not "
                             f"fit a ring of {self.states.shape}")
        self.states[:n], self.next_states[:n] = (arrays["replay-states"],
                                                 arrays["replay-next-states"])
        self.actions[:n], self.rewards[:n] = arrays["replay-actions"], arrays["replay-rewards"]
        self.terminal[:n] = arrays["replay-terminal"]
        self.filled, self.position = n, int(arrays["replay-position"][0])


def replay(w: np.ndarray, ring: ReplayRing, encode: Callable[[np.ndarray], np.ndarray],
           rng: np.random.Generator, n_updates: int, rate: float, gamma: float) -> None:
    """``n_updates`` Q-learning updates of the readout rows ``w`` (``(|A|, D)``, float64,
    in place) on transitions drawn uniformly from ``ring``, :data:`BATCH` at a time:
    ``w_a += rate * (r + gamma max_b Q(s', b) - Q(s, a)) phi(s)``, no bootstrap where the
    episode terminated. ``encode`` gives a state's float32 features."""
    if n_updates <= 0 or ring.filled == 0:
        return
    drawn = rng.integers(ring.filled, size=n_updates)
    for start in range(0, n_updates, BATCH):
        rows = drawn[start:start + BATCH]
        k, pick = len(rows), np.arange(len(rows))
        features = encode(np.concatenate([ring.states[rows], ring.next_states[rows]]))
        phi, next_phi = features[:k], features[k:]
        w32 = w.astype(np.float32)
        next_q = (next_phi @ w32.T).max(axis=1).astype(np.float64)
        target = ring.rewards[rows] + gamma * np.where(ring.terminal[rows], 0.0, next_q)
        actions = ring.actions[rows]
        q = (phi @ w32.T)[pick, actions].astype(np.float64)
        errors = np.zeros((k, w.shape[0]), dtype=np.float32)
        errors[pick, actions] = rate * (target - q)
        w += errors.T @ phi
