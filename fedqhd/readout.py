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

Over 600 lines on purpose: the in-memory (:class:`RidgeFQI`) and streamed
(:class:`StreamingRidgeFQI`) fits share the systems, targets and Gram helpers above them,
and read best side by side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.linalg.blas import dsymv, dsyrk

from fedqhd.memory import UPCAST_ROWS

# the numpy-only parts, which the strategies share (fedqhd.gram), re-exported here
from .gram import GramSystems as GramSystems
from .gram import pooled_value_range as pooled_value_range
from .gram import value_range as value_range

#: where Bellman targets are kept: "fitted" (the learner's own ``q_range_``), (lo, hi), None
RangeArg = str | tuple[float, float] | None


def features_times(features: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``features @ x`` in float64 arithmetic. float64 features: the plain product;
    float32 ones (``feature-dtype``) are turned into float64 ``UPCAST_ROWS`` rows at a time,
    so the stored features are the only thing rounded and no float64 copy of the whole
    table is ever made (numpy's own promotion would make one per product)."""
    if features.dtype == np.float64:
        return features @ x
    parts = [features[i:i + UPCAST_ROWS].astype(np.float64) @ x
             for i in range(0, len(features), UPCAST_ROWS)]
    return np.concatenate(parts) if parts else np.zeros((0,) + x.shape[1:])


def features_t_times(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``features.T @ y`` in float64 arithmetic (as :func:`features_times`)."""
    if features.dtype == np.float64:
        return features.T @ y
    out = np.zeros((features.shape[1],) + y.shape[1:])
    for i in range(0, len(features), UPCAST_ROWS):
        out += features[i:i + UPCAST_ROWS].astype(np.float64).T @ y[i:i + UPCAST_ROWS]
    return out


def _as_features(features: np.ndarray) -> np.ndarray:
    """A feature table kept as it is when float32 (``feature-dtype``), else float64."""
    features = np.asarray(features)
    return features if features.dtype == np.float32 else features.astype(np.float64, copy=False)


class RidgeSystem:
    """A factored ridge system for one design matrix ``Phi`` (n x D).

    Parameters
    ----------
    features : ndarray of shape (n, D)
        float64, or float32 (kept as it is; the Gram, factor and products are float64).
    ridge : float
        L2 penalty toward zero (> 0 unless ``proximal`` > 0).
    proximal : float
        L2 penalty toward a prior passed to :meth:`solve` (0 disables it).
    """

    def __init__(self, features: np.ndarray, ridge: float, proximal: float = 0.0) -> None:
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        self.features = _as_features(features)
        self.ridge = float(ridge)
        self.proximal = float(proximal)
        n, dim = self.features.shape
        self.dim = dim
        self.dual = n < dim
        c = self.ridge + self.proximal
        if n == 0:
            self._factor = None
        elif self.features.dtype == np.float32:
            gram = _gram32(self.features, self.dual)
        elif self.dual:
            gram = self.features @ self.features.T
        else:
            gram = self.features.T @ self.features
        if n:
            gram[np.diag_indices_from(gram)] += c
            self._factor = cho_factor(gram, lower=True, check_finite=False)

    def effective_dimension(self) -> float:
        """``sum_k mu_k / (mu_k + c)`` over the eigenvalues ``mu_k`` of ``Phi^T Phi``
        (``c`` = ridge + proximal): how many directions the system actually fits, at most
        min(n, D). From the factor: ``size - c ||L^-1||_F^2`` (no eigendecomposition)."""
        if self._factor is None:
            return 0.0
        lower = self._factor[0]
        size = len(lower)
        inverse = solve_triangular(lower, np.eye(size), lower=True, check_finite=False)
        return float(size - (self.ridge + self.proximal) * np.sum(inverse * inverse))

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
            residual = y - features_times(self.features, shrunk_prior)
            return shrunk_prior + features_t_times(
                self.features, cho_solve(self._factor, residual, check_finite=False))
        rhs = features_t_times(self.features, y) + c * shrunk_prior
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
        Encoded states and next states of the transitions (stored as one table,
        ``2 n x D``; :meth:`from_states` encodes each distinct state once instead).
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
    next_rows : ndarray of shape (n,), int, optional
        Internal (:meth:`from_states`): ``features`` is the table of
        :func:`state_table_rows` and ``next_features`` is ``None``.
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
        next_features: np.ndarray | None,
        terminated: np.ndarray,
        n_actions: int,
        gamma: float = 0.99,
        ridge: float = 1.0,
        proximal: float = 0.0,
        value_range: str | tuple[float, float] | None = "data",
        next_rows: np.ndarray | None = None,
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
        self.continues = 1.0 - np.asarray(terminated, dtype=np.float64)
        self.value_range = value_range
        self.q_range_ = _resolve_range(value_range, self.rewards, self.gamma)
        self._rows = [np.flatnonzero(actions == a) for a in range(self.n_actions)]
        if next_rows is None:  # two matrices: states (grouped by action), then next states
            n = len(actions)
            self._table = np.concatenate([np.asarray(features, dtype=np.float64)[
                np.concatenate(self._rows)], np.asarray(next_features, dtype=np.float64)])
            self._next_start, self._next_rows = n, np.arange(n)
        else:  # one table (see from_states): next states are rows of it
            self._table = _as_features(features)
            self._next_start, self._next_rows = 0, np.asarray(next_rows, dtype=np.int64)
        self.dim = self._table.shape[1]
        # each action's states are a contiguous block of the table: views, not copies
        bounds = np.cumsum([0] + [len(rows) for rows in self._rows])
        self._systems = [RidgeSystem(self._table[lo:hi], ridge, proximal)
                         for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        self.readout_ = np.zeros((self.dim, self.n_actions))

    @classmethod
    def from_states(cls, encode: Callable[[np.ndarray], np.ndarray], observations: np.ndarray,
                    actions: np.ndarray, rewards: np.ndarray, next_observations: np.ndarray,
                    terminated: np.ndarray, n_actions: int, **kwargs: Any) -> RidgeFQI:
        """The fit of ``(observations, actions, rewards, next_observations, terminated)``
        with each distinct state encoded once.

        Why: within an episode a transition's next state is the next transition's state,
        so encoding states and next states separately stores (and computes) every
        feature row twice. Here the states (grouped by action) and the next states that
        do not start the following transition (:func:`chained_next_states`) are encoded
        as one table, ``n + (episodes)`` rows instead of ``2 n``; next-state features are
        rows of it. The readouts equal the two-matrix fit's to rounding (1e-12).
        ``kwargs``: as for the constructor (``gamma``, ``ridge``, ...).
        """
        actions = np.asarray(actions)
        if actions.size and (actions.min() < 0 or actions.max() >= n_actions):
            raise ValueError(f"actions must lie in [0, {n_actions}), got "
                             f"[{actions.min()}, {actions.max()}]")
        order, next_rows, extra = state_table_rows(observations, actions, next_observations)
        table = encode(np.concatenate([observations[order], next_observations[extra]]))
        return cls(table, actions, rewards, None, terminated, n_actions,
                   next_rows=next_rows, **kwargs)

    def targets(self, readout: np.ndarray, q_range: RangeArg = "fitted") -> np.ndarray:
        """Bellman targets of every transition under ``readout``, kept in ``q_range``
        (default ``"fitted"``: this fit's ``q_range_``; a pair or ``None`` overrides it)."""
        q_next = features_times(self._table[self._next_start:], readout)
        best_next = q_next.max(axis=1)[self._next_rows]
        q = self.q_range_ if isinstance(q_range, str) else q_range
        return bellman_targets(self.rewards, self.continues, best_next, self.gamma, q)

    def grams(self) -> np.ndarray:
        """Per-action Grams ``Phi_a^T Phi_a`` (|A|, D, D)."""
        return np.stack([_gram(system.features) if len(rows) else np.zeros((self.dim,) * 2)
                         for rows, system in zip(self._rows, self._systems, strict=True)])

    def rhs(self, readout: np.ndarray, q_range: RangeArg = "fitted") -> np.ndarray:
        """``[Phi_a^T y_a]_a`` (D, |A|) for the Bellman targets under ``readout``."""
        y = self.targets(readout, q_range)
        return np.stack([features_t_times(system.features, y[rows]) if len(rows)
                         else np.zeros(self.dim)
                         for rows, system in zip(self._rows, self._systems, strict=True)],
                        axis=1)

    @property
    def action_counts(self) -> np.ndarray:
        """Transitions per action (|A|,)."""
        return np.array([len(rows) for rows in self._rows], dtype=np.int64)

    @property
    def reward_extremes(self) -> np.ndarray:
        """``[min, max]`` of the rewards (``[0, 0]`` for none)."""
        return _extremes(self.rewards)

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
            features_times(system.features, readout[:, a]) - targets[rows]
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


def chained_next_states(observations: np.ndarray, next_observations: np.ndarray) -> np.ndarray:
    """``chained[i]``: transition ``i``'s next state is transition ``i + 1``'s state (equal
    numbers), so its features need not be encoded again. False at episode ends and for
    shards whose rows are not in episode order (then nothing is shared, nothing is wrong)."""
    obs = np.asarray(observations)
    chained = np.zeros(len(obs), dtype=bool)
    if len(obs) > 1:
        nxt = np.asarray(next_observations)
        chained[:-1] = (nxt[:-1] == obs[1:]).reshape(len(obs) - 1, -1).all(axis=1)
    return chained


def state_table_rows(observations: np.ndarray, actions: np.ndarray,
                     next_observations: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of the one feature table :meth:`RidgeFQI.from_states` encodes.

    Returns ``(order, next_rows, extra)``: the table is the states in ``order`` (grouped
    by action, stable, so each action's states are one contiguous block) followed by the
    next states of the transitions ``extra`` (those not chained, see
    :func:`chained_next_states`); ``next_rows[i]`` is the table row of transition
    ``i``'s next state."""
    actions = np.asarray(actions)
    n = len(actions)
    order = np.argsort(actions, kind="stable")
    position = np.empty(n, dtype=np.int64)
    position[order] = np.arange(n)
    chained = chained_next_states(observations, next_observations)
    extra = np.flatnonzero(~chained)
    next_rows = np.empty(n, dtype=np.int64)
    chained_rows = np.flatnonzero(chained)
    next_rows[chained_rows] = position[chained_rows + 1]
    next_rows[extra] = n + np.arange(len(extra))
    return order, next_rows, extra


def distinct_state_count(observations: np.ndarray, next_observations: np.ndarray) -> int:
    """Rows of the :meth:`RidgeFQI.from_states` table: ``n`` plus the unchained next
    states (``n`` + episodes for shards in episode order, at most ``2 n``)."""
    return len(observations) + int((~chained_next_states(observations,
                                                          next_observations)).sum())


def greedy_actions(features: np.ndarray, readout: np.ndarray) -> np.ndarray:
    """``argmax_a phi(s) . w_a`` for each row of ``features``."""
    return np.argmax(features @ readout, axis=1)


# ------------------------------------------------------------ sufficient statistics
def _gram(features: np.ndarray) -> np.ndarray:
    if features.dtype == np.float32:
        return _gram32(features, dual=False)
    return features.T @ features


def _gram32(features: np.ndarray, dual: bool) -> np.ndarray:
    """The float64 Gram of float32 features: ``F F^T`` (dual: fewer rows than columns, one
    float64 copy of at most D x D numbers) or ``F^T F``, summed over ``UPCAST_ROWS``-row
    blocks (no float64 copy of the table)."""
    if dual:
        wide = features.astype(np.float64)
        return wide @ wide.T
    gram = np.zeros((features.shape[1],) * 2)
    work = np.empty((min(len(features), UPCAST_ROWS), features.shape[1]))  # one block, reused
    for i in range(0, len(features), UPCAST_ROWS):
        block = work[:len(features[i:i + UPCAST_ROWS])]
        block[...] = features[i:i + UPCAST_ROWS]
        gram += block.T @ block
    return gram


def _extremes(rewards: np.ndarray) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    return np.array([r.min(), r.max()]) if r.size else np.zeros(2)


def _rank_update(upper: np.ndarray, phi: np.ndarray) -> None:
    """``upper += phi^T phi`` in place, on the upper triangle of ``upper.T`` (a C-ordered
    D x D array whose F-ordered view BLAS updates: one ``dsyrk``, no temporary)."""
    gram_f = upper.T
    out = dsyrk(1.0, phi.T, beta=1.0, c=gram_f, trans=0, lower=0, overwrite_c=1)
    if not np.shares_memory(out, gram_f):  # pragma: no cover (the wrapper copied)
        gram_f[...] = out


def _symmetric(upper: np.ndarray) -> np.ndarray:
    """Full symmetric matrices from arrays filled by :func:`_rank_update` (..., D, D)."""
    return np.tril(upper) + np.swapaxes(np.tril(upper, -1), -1, -2)


def chunked_grams(encode: Callable[[np.ndarray], np.ndarray], observations: np.ndarray,
                  actions: np.ndarray, n_actions: int, dim: int, chunk_size: int = 4096
                  ) -> np.ndarray:
    """Per-action Grams (|A|, D, D) of ``encode(observations)``, ``chunk_size`` rows at a
    time (memory O(|A| D^2 + chunk_size x D))."""
    upper = np.zeros((n_actions, dim, dim))
    actions = np.asarray(actions)
    for a in range(n_actions):
        rows = np.flatnonzero(actions == a)
        for start in range(0, len(rows), chunk_size):
            _rank_update(upper[a], encode(observations[rows[start:start + chunk_size]]))
    return _symmetric(upper)


class StreamingRidgeFQI:
    """:class:`RidgeFQI` from per-action sufficient statistics, features recomputed in
    chunks: memory O(|A| D^2 + chunk_size x D) plus the raw transitions, not O(n x D).

    Transitions are kept raw (states, not features), grouped by action. :meth:`add`
    encodes them ``chunk_size`` rows at a time and adds each chunk to its action's
    Gram ``G_a = Phi_a^T Phi_a`` (a BLAS rank-k update in place); data can be added at
    any time (the next :meth:`fit` refactors). Each FQI sweep makes one chunked pass
    that encodes next states (targets) and states (``b_a = Phi_a^T y_a``), then solves
    ``(G_a + (ridge + proximal) I) w_a = b_a + proximal prior_a``. Minimiser, value-range
    bound and proximal term are those of :class:`RidgeFQI`.

    Parameters
    ----------
    encode : callable
        States (m, obs_dim) -> features (m, D) float64 (e.g. ``HDEncoder.encode``).
    dim, n_actions : int
    gamma, ridge, proximal, value_range
        As in :class:`RidgeFQI` (``"data"``: the range of every reward added so far).
    chunk_size : int
        Rows encoded at a time.
    cache : None or "float32"
        ``None`` (default): re-encode every sweep (exact). ``"float32"``: keep the
        features of states and next states in float32 (n x D x 8 bytes: O(n x D)
        again, half the float64 size) and skip re-encoding; sweeps then agree with the
        in-memory fit to about 1e-7 relative, not 1e-8 (the Grams stay float64).
    """

    def __init__(self, encode: Callable[[np.ndarray], np.ndarray], dim: int, n_actions: int,
                 gamma: float = 0.99, ridge: float = 1.0, proximal: float = 0.0,
                 value_range: str | tuple[float, float] | None = "data",
                 chunk_size: int = 4096, cache: str | None = None) -> None:
        if not 0.0 <= gamma < 1.0:
            raise ValueError(f"gamma must lie in [0, 1), got {gamma}")
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        if cache not in (None, "float32"):
            raise ValueError(f"cache must be None or 'float32', got {cache!r}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.encode, self.dim, self.n_actions = encode, int(dim), int(n_actions)
        self.gamma, self.ridge, self.proximal = float(gamma), float(ridge), float(proximal)
        self.value_range, self.chunk_size, self.cache = value_range, int(chunk_size), cache
        k = self.n_actions
        # per action, one entry per add(): states, next states, rewards, continues, indices
        self._obs: list[list[np.ndarray]] = [[] for _ in range(k)]
        self._next: list[list[np.ndarray]] = [[] for _ in range(k)]
        self._rew: list[list[np.ndarray]] = [[] for _ in range(k)]
        self._cont: list[list[np.ndarray]] = [[] for _ in range(k)]
        self._index: list[list[np.ndarray]] = [[] for _ in range(k)]
        self._cached: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(k)]
        self._upper = np.zeros((k, self.dim, self.dim))  # see _rank_update
        self._counts = np.zeros(k, dtype=np.int64)
        self._extremes = np.zeros(2)
        self._n = 0
        self._systems: GramSystems | None = None
        self.q_range_ = _resolve_range(value_range, np.zeros(0), self.gamma)
        self.readout_ = np.zeros((self.dim, self.n_actions))

    @property
    def n_transitions(self) -> int:
        return self._n

    def add(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            next_observations: np.ndarray, terminated: np.ndarray) -> None:
        """Append transitions; their Gram contributions are added chunk by chunk."""
        actions = np.asarray(actions)
        if actions.size and (actions.min() < 0 or actions.max() >= self.n_actions):
            raise ValueError(f"actions must lie in [0, {self.n_actions}), got "
                             f"[{actions.min()}, {actions.max()}]")
        rewards = np.asarray(rewards, dtype=np.float64)
        continues = 1.0 - np.asarray(terminated, dtype=np.float64)
        index = np.arange(self._n, self._n + len(actions))
        for a in range(self.n_actions):
            rows = np.flatnonzero(actions == a)
            if not rows.size:
                continue
            obs, nxt = observations[rows], next_observations[rows]
            self._obs[a].append(obs)
            self._next[a].append(nxt)
            self._rew[a].append(rewards[rows])
            self._cont[a].append(continues[rows])
            self._index[a].append(index[rows])
            for start in range(0, len(rows), self.chunk_size):
                phi = self.encode(obs[start:start + self.chunk_size])
                _rank_update(self._upper[a], phi)
                if self.cache == "float32":
                    nphi = self.encode(nxt[start:start + self.chunk_size])
                    self._cached[a].append((phi.astype(np.float32), nphi.astype(np.float32)))
            self._counts[a] += rows.size
        if rewards.size:
            seen = _extremes(rewards)
            self._extremes = seen if self._n == 0 else np.array(
                [min(self._extremes[0], seen[0]), max(self._extremes[1], seen[1])])
        self._n += len(actions)
        self._systems = None
        if isinstance(self.value_range, str):
            self.q_range_ = _resolve_range(self.value_range, self._extremes, self.gamma)

    def grams(self) -> np.ndarray:
        """Per-action Grams ``Phi_a^T Phi_a`` (|A|, D, D), full symmetric copies."""
        return _symmetric(self._upper)

    @property
    def action_counts(self) -> np.ndarray:
        """Transitions per action (|A|,)."""
        return self._counts.copy()

    @property
    def reward_extremes(self) -> np.ndarray:
        """``[min, max]`` of the rewards added (``[0, 0]`` for none)."""
        return self._extremes.copy()

    def _chunks(self, a: int) -> Iterator[tuple[np.ndarray, ...]]:
        """Action ``a``'s (features, next features, rewards, continues, indices) by chunk."""
        k = 0
        for obs, nxt, rew, cont, idx in zip(self._obs[a], self._next[a], self._rew[a],
                                            self._cont[a], self._index[a], strict=True):
            for start in range(0, len(rew), self.chunk_size):
                sl = slice(start, start + self.chunk_size)
                if self.cache == "float32":
                    phi32, nphi32 = self._cached[a][k]
                    k += 1
                    phi, nphi = phi32.astype(np.float64), nphi32.astype(np.float64)
                else:
                    phi, nphi = self.encode(obs[sl]), self.encode(nxt[sl])
                yield phi, nphi, rew[sl], cont[sl], idx[sl]

    def _pass(self, readout: np.ndarray, q: tuple[float, float] | None
              ) -> tuple[np.ndarray, float]:
        """One chunked pass: ``[Phi_a^T y_a]_a`` and ``||y||^2`` under ``readout``."""
        rhs = np.zeros((self.dim, self.n_actions))
        yy = 0.0
        for a in range(self.n_actions):
            for phi, nphi, rew, cont, _ in self._chunks(a):
                y = bellman_targets(rew, cont, (nphi @ readout).max(axis=1), self.gamma, q)
                rhs[:, a] += phi.T @ y
                yy += float(y @ y)
        return rhs, yy

    def targets(self, readout: np.ndarray, q_range: RangeArg = "fitted") -> np.ndarray:
        """Bellman targets of every transition (in the order added) under ``readout``."""
        q = self.q_range_ if isinstance(q_range, str) else q_range
        out = np.empty(self._n)
        for a in range(self.n_actions):
            for _, nphi, rew, cont, idx in self._chunks(a):
                out[idx] = bellman_targets(rew, cont, (nphi @ readout).max(axis=1),
                                           self.gamma, q)
        return out

    def rhs(self, readout: np.ndarray, q_range: RangeArg = "fitted") -> np.ndarray:
        """``[Phi_a^T y_a]_a`` (D, |A|) for the Bellman targets under ``readout``."""
        q = self.q_range_ if isinstance(q_range, str) else q_range
        return self._pass(np.asarray(readout, dtype=np.float64), q)[0]

    def fit(self, n_iterations: int, init: np.ndarray | None = None,
            prior: np.ndarray | None = None) -> FQIResult:
        """As :meth:`RidgeFQI.fit`. Each sweep's Bellman residual comes from the
        statistics, ``sum_a (w_a^T G_a w_a - 2 w_a^T b_a) + ||y||^2`` (no extra pass)."""
        readout = self.readout_ if init is None else np.array(init, dtype=np.float64)
        if readout.shape != (self.dim, self.n_actions):
            raise ValueError(f"readout must have shape {(self.dim, self.n_actions)}, "
                             f"got {readout.shape}")
        prior = readout.copy() if prior is None else np.asarray(prior, dtype=np.float64)
        if self._systems is None:  # the factor reads the upper triangle of the F views
            self._systems = GramSystems([g.T for g in self._upper], self.ridge, self.proximal)
        result = FQIResult(n_iterations=n_iterations)
        for _ in range(n_iterations):
            rhs, sq = self._pass(readout, self.q_range_)
            new = self._systems.solve(rhs, prior)
            for a in range(self.n_actions):
                w = new[:, a]
                sq += float(w @ dsymv(1.0, self._upper[a].T, w, lower=0) - 2.0 * w @ rhs[:, a])
            result.bellman_residuals.append(float(np.sqrt(max(sq, 0.0) / self._n))
                                            if self._n else 0.0)
            readout = new
        self.readout_ = readout
        return result
