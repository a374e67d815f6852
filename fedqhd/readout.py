"""Ridge readouts on fixed features: fitted Q-iteration and ridge projection.

Features do not change while a readout is learned, so every ridge system is
factored once (Cholesky) and each solve afterwards is a pair of triangular
solves plus matrix products. Each system picks its cheaper form: the dual
``(Phi Phi^T + c I)^{-1}`` when it has fewer rows than features, the primal
``(Phi^T Phi + c I)^{-1}`` otherwise; both give the same minimiser of

    ||Phi w - y||^2 + ridge ||w||^2 + proximal ||w - w0||^2,

where the proximal term pulls the solution toward a prior readout ``w0`` (the
last global readout in federated training).

Fitted Q-iteration with a ridge fit is not a contraction (the ridge projection
can expand the sup norm), so its Q-values can grow without bound. By default
the Bellman targets are therefore kept inside the range the rewards allow
(:func:`value_range`, :func:`bellman_targets`).
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


def value_range(rewards: np.ndarray, gamma: float) -> tuple[float, float]:
    """The interval every discounted return (with or without termination) lies in.

    With rewards in ``[r_min, r_max]`` a return ``sum_t gamma^t r_t`` over any
    number of steps (0 after termination) lies in
    ``[min(0, r_min) / (1 - gamma), max(0, r_max) / (1 - gamma)]``; the 0 is
    there because an episode may end at once. ``rewards`` are the rewards seen
    (an empty array gives ``(0, 0)``).
    """
    if not 0.0 <= gamma < 1.0:
        raise ValueError(f"gamma must lie in [0, 1), got {gamma}")
    r = np.asarray(rewards, dtype=np.float64)
    r_min, r_max = (float(r.min()), float(r.max())) if r.size else (0.0, 0.0)
    return min(0.0, r_min) / (1.0 - gamma), max(0.0, r_max) / (1.0 - gamma)


def bellman_targets(
    rewards: np.ndarray,
    continues: np.ndarray,
    next_q_max: np.ndarray,
    gamma: float,
    q_range: tuple[float, float] | None = None,
) -> np.ndarray:
    """``r + gamma * continues * max_a' Q(s', a')``, kept inside ``q_range``.

    ``continues`` is 0 for terminated transitions and 1 otherwise (truncated
    ones bootstrap). With ``q_range = (lo, hi)`` the next state's value is
    clipped to ``[lo, hi]`` before discounting (a value outside the range is
    known to be wrong) and the target is clipped to ``[lo, hi]`` again (a
    no-op when ``q_range`` contains :func:`value_range` of the rewards). Each
    FQI sweep then regresses on bounded targets, so Q-values cannot grow
    without bound. ``None``: no clipping (plain FQI).
    """
    if q_range is None:
        return rewards + gamma * continues * next_q_max
    lo, hi = q_range
    targets = rewards + gamma * continues * np.clip(next_q_max, lo, hi)
    return np.clip(targets, lo, hi)


@dataclass
class FQIResult:
    """What one call of :meth:`RidgeFQI.fit` did, for logs and metrics."""

    n_iterations: int
    bellman_residuals: list[float] = field(default_factory=list)


class RidgeFQI:
    """Ridge fitted Q-iteration on fixed features, one readout column per action.

    Each iteration regresses ``r + gamma * (1 - terminated) * max_a' Q(s', a')``
    on ``phi(s)`` separately for every action, with the next value and the
    target clipped to ``value_range`` (:func:`bellman_targets`). Truncated
    transitions bootstrap (truncation is not termination). The per-action systems are factored at
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
    value_range : "data", (lo, hi) or None
        Where the Bellman targets are kept: ``"data"`` (default) the range the
        rewards of these transitions allow (:func:`value_range`), a pair an
        explicit range (give the same one to every client of a federation whose
        clients see different rewards), ``None`` no bound (the old behaviour:
        Q can diverge).

    Attributes
    ----------
    readout_ : ndarray of shape (D, n_actions)
        The readout after the last :meth:`fit`.
    q_range_ : (lo, hi) or None
        The resolved ``value_range``.
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
        value_range: str | tuple[float, float] | None = "data",
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
        self.value_range = value_range
        self.q_range_ = _resolve_range(value_range, self.rewards, self.gamma)
        self.dim = features.shape[1]
        self._rows = [np.flatnonzero(actions == a) for a in range(self.n_actions)]
        self._systems = [RidgeSystem(features[rows], ridge, proximal) for rows in self._rows]
        self.readout_ = np.zeros((self.dim, self.n_actions))

    def targets(self, readout: np.ndarray) -> np.ndarray:
        """Bellman targets of every transition under ``readout``."""
        best_next = (self.next_features @ readout).max(axis=1)
        return bellman_targets(self.rewards, self.continues, best_next, self.gamma,
                               self.q_range_)

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


def _resolve_range(spec: str | tuple[float, float] | None, rewards: np.ndarray,
                   gamma: float) -> tuple[float, float] | None:
    """``value_range`` parameter -> (lo, hi) or None."""
    if spec is None:
        return None
    if isinstance(spec, str):
        if spec != "data":
            raise ValueError(f"value_range must be 'data', (lo, hi) or None, got {spec!r}")
        return value_range(rewards, gamma)
    lo, hi = (float(v) for v in spec)
    if not lo <= hi:
        raise ValueError(f"value_range needs lo <= hi, got ({lo}, {hi})")
    return lo, hi


def greedy_actions(features: np.ndarray, readout: np.ndarray) -> np.ndarray:
    """``argmax_a phi(s) . w_a`` for each row of ``features``."""
    return np.argmax(features @ readout, axis=1)
