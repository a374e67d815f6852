"""Local learners: what a client does with its private shard between messages.

A learner holds one client's encoded shard and its readout, and offers the four
operations the federation needs: learn locally (pulled toward a global
readout, or as one ADMM consensus step), compile a teacher given on anchor
states into its own features, report Q-values on anchors, and act greedily.
It knows nothing of Flower.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import numpy as np

from fedqhd.data import Shard
from fedqhd.encoders import HDEncoder
from fedqhd.readout import RidgeFQI, RidgeSystem


class FQILearner:
    """Ridge fitted Q-iteration on one client's shard with the client's own encoder.

    Parameters
    ----------
    shard : Shard
        The client's private transitions (never leaves the learner).
    encoder : HDEncoder
        A fitted encoder; its dimension sets the readout's shape (D, |A|).
    n_actions : int
    gamma, ridge, proximal : float
        Discount, penalty toward zero, penalty toward the readout training starts from.
    compile_ridge : float or None
        Ridge penalty of the teacher compilation (default: ``ridge``).
    value_range : "data", (lo, hi) or None
        Where FQI keeps its Bellman targets (see :class:`~fedqhd.readout.RidgeFQI`):
        the range the shard's rewards allow, an explicit range, or no bound.
    """

    def __init__(self, shard: Shard, encoder: HDEncoder, n_actions: int, gamma: float = 0.99,
                 ridge: float = 1.0, proximal: float = 1.0,
                 compile_ridge: float | None = None,
                 value_range: str | tuple[float, float] | None = "data") -> None:
        self.encoder = encoder
        self.n_actions = int(n_actions)
        self.compile_ridge = float(ridge if compile_ridge is None else compile_ridge)
        self.n_transitions = int(shard.n_transitions)
        self.fqi = RidgeFQI(
            encoder.encode(shard.observations), shard.actions, shard.rewards,
            encoder.encode(shard.next_observations), shard.terminated, n_actions,
            gamma=gamma, ridge=ridge, proximal=proximal, value_range=value_range)
        self._anchor_key: str | None = None
        self._anchor_system: RidgeSystem | None = None

    @property
    def readout(self) -> np.ndarray:
        return self.fqi.readout_

    @readout.setter
    def readout(self, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.float64)
        if value.shape != self.fqi.readout_.shape:
            raise ValueError(f"readout must have shape {self.fqi.readout_.shape}, "
                             f"got {value.shape}")
        self.fqi.readout_ = value

    def train(self, iterations: int, start: np.ndarray | None = None) -> dict[str, float]:
        """``iterations`` FQI sweeps from ``start`` (default: current readout), each pulled
        toward ``start`` by the proximal term so federated knowledge is not forgotten."""
        result = self.fqi.fit(iterations, init=start)
        return {"bellman-residual": result.bellman_residuals[-1]}

    def consensus_step(self, global_readout: np.ndarray, iterations: int,
                       last_reply: np.ndarray | None = None
                       ) -> tuple[np.ndarray, dict[str, float]]:
        """One client step of consensus ADMM; returns (reply, metrics).

        Why: averaging plain local fits converges to a biased fixed point (each
        client shrinks the directions its data does not cover); ADMM's dual
        variable cancels that bias, so the fixed point of the federation is
        pooled ridge FQI. With the learner built with ``proximal = penalty * n_i``
        (``n_i``: its transitions), client ``i`` solves, per action,

            min (||Phi_i w - y_i||^2 + ridge_i ||w||^2) / n_i + penalty ||w - z + v_i||^2

        from the global readout ``z`` (``iterations`` sweeps, the first with
        targets ``y_i`` under ``z``), after the dual update ``v_i += w_i - z``, and
        replies ``w_i + v_i``; the server's weighted mean of the replies is the
        next ``z``. At a fixed point the clients' gradients sum to zero: the
        stationarity condition of FQI on the pooled data (for transition
        weights and ``ridge_i`` the client's share ``ridge / n`` of the pooled
        penalty).

        The client's whole memory is its last reply: the updated dual
        ``v_i + w_i - z`` is ``last_reply - z``.
        """
        z = np.asarray(global_readout, dtype=np.float64)
        fresh = last_reply is None or last_reply.shape != z.shape
        dual = np.zeros_like(z) if fresh else last_reply - z
        result = self.fqi.fit(iterations, init=z, prior=z - dual)
        local = self.fqi.readout_
        scale = max(np.linalg.norm(local), np.linalg.norm(z), 1e-300)
        gap = float(np.linalg.norm(local - z) / scale)  # in [0, 2]; 1 while z = 0
        return local + dual, {"bellman-residual": result.bellman_residuals[-1],
                              "consensus-gap": gap}

    def compile(self, anchors: np.ndarray, teacher: np.ndarray) -> float:
        """Replace the readout by the ridge projection of ``teacher`` (Q on ``anchors``)
        onto this client's features; returns the residual ``||X W - T||_F``.

        The anchor system is factored once per anchor set and reused every round.
        """
        key = hashlib.sha1(np.ascontiguousarray(anchors, dtype=np.float64).tobytes()).hexdigest()
        if key != self._anchor_key:
            self._anchor_system = RidgeSystem(self.encoder.encode(anchors), self.compile_ridge)
            self._anchor_key = key
        system = self._anchor_system
        self.readout = system.solve(teacher)
        return float(np.linalg.norm(system.features @ self.readout - teacher))

    def q_values(self, states: np.ndarray) -> np.ndarray:
        """Q(s, .) for each row of ``states``, shape (n, |A|)."""
        return self.encoder.encode(states) @ self.readout

    def policy(self) -> Callable[[np.ndarray], int]:
        """The greedy policy of the current readout (a frozen copy)."""
        return greedy_policy(self.encoder, self.readout.copy())


def greedy_policy(encoder: HDEncoder, readout: np.ndarray) -> Callable[[np.ndarray], int]:
    """``s -> argmax_a phi(s) . w_a`` for one observation at a time."""

    def act(observation: np.ndarray) -> int:
        return int(np.argmax(encoder.encode(observation[None, :])[0] @ readout))

    return act
