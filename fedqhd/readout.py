"""Ridge readouts on fixed features: fitted Q-iteration and ridge projection.

Features do not change while a readout is learned, so every ridge system is
factored once (Cholesky) and each solve afterwards is a pair of triangular
solves plus matrix products. Each system picks its cheaper form: the dual
``(Phi Phi^T + c I)^{-1}`` when it has fewer rows than features, the primal
``(Phi^T Phi + c I)^{-1}`` otherwise; both give the same minimiser of

    ||Phi w - y||^2 + ridge ||w||^2 + proximal ||w - w0||^2,

where the proximal term pulls the solution toward a prior readout ``w0`` (the
last global readout in federated training).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import cho_factor, cho_solve


class RidgeSystem:
    """A factored ridge system for one design matrix ``Phi`` (n x D).

    Parameters
    ----------
    features : ndarray of shape (n, D)
    ridge : float
        L2 penalty toward zero (> 0 unless ``proximal`` > 0).
    proximal : float
        L2 penalty toward a prior passed to :meth:`solve` (0 disables it).
    """

    def __init__(self, features: np.ndarray, ridge: float, proximal: float = 0.0) -> None:
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        self.features = np.asarray(features, dtype=np.float64)
        self.ridge = float(ridge)
        self.proximal = float(proximal)
        n, dim = self.features.shape
        self.dim = dim
        self.dual = n < dim
        c = self.ridge + self.proximal
        if n == 0:
            self._factor = None
        elif self.dual:
            gram = self.features @ self.features.T
        else:
            gram = self.features.T @ self.features
        if n:
            gram[np.diag_indices_from(gram)] += c
            self._factor = cho_factor(gram, lower=True, check_finite=False)

    def solve(self, targets: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
        """Minimise ``||Phi W - Y||^2 + ridge ||W||^2 + proximal ||W - prior||^2``.

        ``targets`` has shape (n,) or (n, k); ``prior`` matches the result's
        shape (D,) or (D, k) and is ignored when ``proximal`` is 0.
        """
        y = np.asarray(targets, dtype=np.float64)
        c = self.ridge + self.proximal
        shape = (self.dim,) + y.shape[1:]
        if prior is None or self.proximal == 0.0:
            shrunk_prior = np.zeros(shape)
        else:
            shrunk_prior = (self.proximal / c) * np.asarray(prior, dtype=np.float64)
        if self._factor is None:
            return shrunk_prior
        if self.dual:
            residual = y - self.features @ shrunk_prior
            return shrunk_prior + self.features.T @ cho_solve(self._factor, residual,
                                                              check_finite=False)
        rhs = self.features.T @ y + c * shrunk_prior
        return cho_solve(self._factor, rhs, check_finite=False)


def ridge_project(
    features: np.ndarray, targets: np.ndarray, ridge: float
) -> tuple[np.ndarray, float]:
    """Compile target values into a readout: ``argmin ||X W - T||_F^2 + ridge ||W||_F^2``.

    Used to turn a federated teacher (Q-values on anchor states) into a client's
    own features. Returns the readout (D, k) and the residual ``||X W - T||_F``.
    """
    system = RidgeSystem(features, ridge)
    readout = system.solve(targets)
    residual = float(np.linalg.norm(system.features @ readout - targets))
    return readout, residual


@dataclass
class FQIResult:
    """What one call of :meth:`RidgeFQI.fit` did, for logs and metrics."""

    n_iterations: int
    bellman_residuals: list[float] = field(default_factory=list)


class RidgeFQI:
    """Ridge fitted Q-iteration on fixed features, one readout column per action.

    Each iteration regresses ``r + gamma * (1 - terminated) * max_a' Q(s', a')``
    on ``phi(s)`` separately for every action. Truncated transitions bootstrap
    (truncation is not termination). The per-action systems are factored at
    construction and reused by every iteration and every later call of ``fit``.

    Parameters
    ----------
    features, next_features : ndarray of shape (n, D)
        Encoded states and next states of the transitions.
    actions : ndarray of shape (n,), int
    rewards : ndarray of shape (n,)
    terminated : ndarray of shape (n,), bool
    n_actions : int
    gamma : float
        Discount factor.
    ridge : float
        Penalty toward zero.
    proximal : float
        Penalty toward the prior readout given to :meth:`fit` (0: plain FQI).

    Attributes
    ----------
    readout_ : ndarray of shape (D, n_actions)
        The readout after the last :meth:`fit`.
    """

    def __init__(
        self,
        features: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_features: np.ndarray,
        terminated: np.ndarray,
        n_actions: int,
        gamma: float = 0.99,
        ridge: float = 1.0,
        proximal: float = 0.0,
    ) -> None:
        actions = np.asarray(actions)
        if actions.size and (actions.min() < 0 or actions.max() >= n_actions):
            raise ValueError(f"actions must lie in [0, {n_actions}), got "
                             f"[{actions.min()}, {actions.max()}]")
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must lie in [0, 1), got {gamma}")
        self.n_actions = int(n_actions)
        self.gamma = float(gamma)
        self.rewards = np.asarray(rewards, dtype=np.float64)
        self.next_features = np.asarray(next_features, dtype=np.float64)
        self.continues = 1.0 - np.asarray(terminated, dtype=np.float64)
        self.dim = features.shape[1]
        self._rows = [np.flatnonzero(actions == a) for a in range(self.n_actions)]
        self._systems = [RidgeSystem(features[rows], ridge, proximal) for rows in self._rows]
        self.readout_ = np.zeros((self.dim, self.n_actions))

    def targets(self, readout: np.ndarray) -> np.ndarray:
        """Bellman targets of every transition under ``readout``."""
        best_next = (self.next_features @ readout).max(axis=1)
        return self.rewards + self.gamma * self.continues * best_next

    def fit(
        self,
        n_iterations: int,
        init: np.ndarray | None = None,
        prior: np.ndarray | None = None,
    ) -> FQIResult:
        """Run ``n_iterations`` FQI sweeps from ``init`` (default: the current readout).

        ``prior`` is the readout the proximal term pulls toward (default: ``init``).
        """
        readout = self.readout_ if init is None else np.array(init, dtype=np.float64)
        if readout.shape != (self.dim, self.n_actions):
            raise ValueError(f"readout must have shape {(self.dim, self.n_actions)}, "
                             f"got {readout.shape}")
        prior = readout.copy() if prior is None else np.asarray(prior, dtype=np.float64)
        result = FQIResult(n_iterations=n_iterations)
        for _ in range(n_iterations):
            y = self.targets(readout)
            new = np.empty_like(readout)
            for a, (rows, system) in enumerate(zip(self._rows, self._systems, strict=True)):
                new[:, a] = system.solve(y[rows], prior[:, a])
            result.bellman_residuals.append(self.bellman_residual(new, y))
            readout = new
        self.readout_ = readout
        return result

    def bellman_residual(self, readout: np.ndarray, targets: np.ndarray) -> float:
        """Root-mean-square of ``Q(s, a) - target`` over the transitions."""
        err = np.concatenate([
            system.features @ readout[:, a] - targets[rows]
            for a, (rows, system) in enumerate(zip(self._rows, self._systems, strict=True))
        ])
        return float(np.sqrt(np.mean(err**2))) if err.size else 0.0


def greedy_actions(features: np.ndarray, readout: np.ndarray) -> np.ndarray:
    """``argmax_a phi(s) . w_a`` for each row of ``features``."""
    return np.argmax(features @ readout, axis=1)
