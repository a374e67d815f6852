"""Ridge solves from sufficient statistics, with numpy alone.

This is the part of the ridge machinery that the server side needs (:class:`FedQHDExact`
sums the clients' Grams and solves here), so it imports numpy only: the strategies work
with the light install (``pip install fedqhd``, no scipy). Where scipy is installed the
Cholesky factors come from LAPACK through ``scipy.linalg`` (bit-for-bit what the
learners use); without it numpy's Cholesky factor and its inverse give the same solution
to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import numpy as np


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


def pooled_value_range(reward_extremes: list[np.ndarray] | np.ndarray, gamma: float
                       ) -> tuple[float, float]:
    """:func:`value_range` of pooled rewards, from each party's ``[min, max]``."""
    return value_range(np.asarray(reward_extremes, dtype=np.float64).reshape(-1), gamma)


class GramSystems:
    """Per-action primal ridge systems ``G_a + (ridge + proximal) I``, factored once.

    :meth:`solve` minimises ``||Phi_a w - y_a||^2 + ridge ||w||^2 + proximal ||w - prior_a||^2``
    from ``G_a = Phi_a^T Phi_a`` and ``b_a = Phi_a^T y_a`` alone: the minimiser of
    :class:`~fedqhd.readout.RidgeSystem` (primal form). Only the upper triangle of each
    Gram is read.
    """

    def __init__(self, grams: np.ndarray | list[np.ndarray], ridge: float,
                 proximal: float = 0.0) -> None:
        if ridge < 0 or proximal < 0 or ridge + proximal <= 0:
            raise ValueError(f"need ridge >= 0, proximal >= 0, ridge + proximal > 0; "
                             f"got ridge={ridge}, proximal={proximal}")
        self.ridge, self.proximal = float(ridge), float(proximal)
        c = self.ridge + self.proximal
        try:
            from scipy.linalg import cho_factor
        except ImportError:  # the light install: numpy's factor, inverted once
            self._solvers = [_numpy_solver(gram, c) for gram in grams]
            return
        solvers: list[CholeskySolver] = []
        for gram in grams:
            shifted = np.array(gram, dtype=np.float64, order="F")
            shifted[np.diag_indices_from(shifted)] += c
            factor = cho_factor(shifted, lower=False, overwrite_a=True, check_finite=False)
            solvers.append(CholeskySolver(factor=factor))
        self._solvers = solvers

    def solve(self, rhs: np.ndarray, prior: np.ndarray | None = None) -> np.ndarray:
        """The readout (D, |A|) from ``rhs = [Phi_a^T y_a]_a`` (D, |A|)."""
        b = np.array(rhs, dtype=np.float64)
        if prior is not None and self.proximal:
            b += self.proximal * np.asarray(prior, dtype=np.float64)
        return np.stack([solve(b[:, a]) for a, solve in enumerate(self._solvers)], axis=1)


class CholeskySolver:
    """``b -> M^-1 b`` for ``M = G + shift I = L L^T``, from its lower factor (scipy's
    ``cho_factor`` pair) or, numpy only, from ``L^-1``."""

    def __init__(self, factor: tuple[np.ndarray, bool] | None = None,
                 inverse: np.ndarray | None = None) -> None:
        if (factor is None) == (inverse is None):
            raise ValueError("give the scipy factor or the inverse of L, not both")
        self._solve: Callable[[np.ndarray], np.ndarray]
        if inverse is not None:
            self._solve = lambda b: inverse.T @ (inverse @ b)
        else:
            from scipy.linalg import cho_solve
            assert factor is not None
            self._solve = partial(cho_solve, factor, check_finite=False)

    def __call__(self, b: np.ndarray) -> np.ndarray:
        return self._solve(b)


#: one action's factored proximal ridge system: (mu, ridge + mu, b -> (G + (ridge + mu) I)^-1 b)
PrimalSystem = tuple[float, float, CholeskySolver]


def primal_system(gram: np.ndarray, ridge: float, mu: float) -> PrimalSystem:
    """One action's proximal ridge system ``G + (ridge + mu) I``, Cholesky-factored once:
    ``(mu, ridge + mu, solver)``, what :func:`proximal_solve` takes. The online learner
    (:meth:`fedqhd.online.OnlineClient.fit`), the bench's pooled oracle and the app's
    (:class:`~fedqhd.strategies.FedQHDPooled`) all factor here, so their readouts agree bit
    for bit where scipy is installed (its lower factor reads ``G``'s lower triangle);
    without scipy, numpy's factor gives the same solution to rounding."""
    c = float(ridge) + float(mu)
    try:
        from scipy.linalg import cho_factor
    except ImportError:  # the light install
        return float(mu), c, _numpy_solver(np.asarray(gram).T, c)  # its upper = G's lower
    g = np.array(gram, dtype=np.float64, order="F")  # LAPACK's order: factored in place
    g[np.diag_indices_from(g)] += c
    return float(mu), c, CholeskySolver(factor=cho_factor(g, lower=True, overwrite_a=True,
                                                          check_finite=False))


def proximal_solve(system: PrimalSystem, rhs: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """One action's readout ``(G + (ridge + mu) I)^-1 (rhs + mu prior)`` from its
    factored system: ridge toward zero, proximal pull ``mu`` toward ``prior``."""
    mu, c, solve = system
    return solve(rhs + c * ((mu / c) * prior))


def pooled_systems(grams: Sequence[Any], action_counts: np.ndarray, ridge: float,
                   proximal: float) -> list[PrimalSystem]:
    """The pooled oracle's per-action systems from the parties' per-action Grams (each
    party's ``[a]`` is its ``D x D`` Gram of action ``a``: an ``(|A|, D, D)`` array, or
    the server's packed copy; summed in the order given) and the pooled transitions per
    action:
    the proximal pull of action ``a`` is ``proximal * action_counts[a]`` (per pooled
    transition, as each online client counts its own)."""
    counts = np.asarray(action_counts, dtype=np.float64)
    return [primal_system(sum(g[a] for g in grams), ridge, proximal * float(counts[a]))
            for a in range(len(counts))]


def pooled_solve(systems: Sequence[PrimalSystem], rhs: np.ndarray, prior: np.ndarray
                 ) -> np.ndarray:
    """One pooled sweep's readout ``(D, |A|)`` from the summed ``rhs = [Phi_a^T y_a]_a``."""
    return np.stack([proximal_solve(system, rhs[:, a], prior[:, a])
                     for a, system in enumerate(systems)], axis=1)


def _numpy_solver(gram: np.ndarray, shift: float) -> CholeskySolver:
    """``b -> (G + shift I)^{-1} b`` from the upper triangle of ``G``, numpy only:
    ``G + shift I = L L^T``, kept as ``L^{-1}`` so each solve is two matrix products."""
    upper = np.triu(np.asarray(gram, dtype=np.float64))
    shifted = upper + np.triu(upper, 1).T
    shifted[np.diag_indices_from(shifted)] += shift
    lower = np.linalg.cholesky(shifted)
    inverse = np.linalg.solve(lower, np.eye(len(lower)))
    inverse = np.tril(inverse)  # exact zeros above the diagonal
    return CholeskySolver(inverse=inverse)


def pack_upper(grams: np.ndarray) -> np.ndarray:
    """(k, D, D) symmetric -> (k, D(D+1)/2): the upper triangles, row by row (GRAM), in
    ``grams``' dtype. One slice copy per row: a fancy-indexed gather took 6x as long at
    D = 2000, and a node's online state packs its Grams at every train message."""
    k, dim = grams.shape[0], grams.shape[-1]
    out = np.empty((k, dim * (dim + 1) // 2), dtype=grams.dtype)
    pos = 0
    for i in range(dim):
        out[:, pos:pos + dim - i] = grams[:, i, i:]
        pos += dim - i
    return out


def unpack_upper(packed: np.ndarray, dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`pack_upper`: (k, D(D+1)/2) -> (k, D, D) symmetric, float64
    (written into ``out`` when given: (k, D, D), any float dtype). The upper rows are
    copied as they are packed, the lower triangle by transposing square blocks of
    them: writing it a column at a time took 3 times as long (52 ms at D = 2000), and a
    node's online state is unpacked whenever another process serves it."""
    if packed.shape[-1] != dim * (dim + 1) // 2:
        raise ValueError(f"{packed.shape[-1]} packed entries are not the upper triangle of "
                         f"a {dim} x {dim} matrix ({dim * (dim + 1) // 2})")
    if out is None:
        out = np.empty((packed.shape[0], dim, dim))
    pos = 0
    for i in range(dim):
        out[:, i, i:] = packed[:, pos:pos + dim - i]
        pos += dim - i
    for matrix in out:
        for i0, i1, j0, j1 in _upper_blocks(dim):
            if i0 == j0:  # a diagonal block: its own lower triangle
                block = matrix[i0:i1, i0:i1]
                lower = np.tril_indices(i1 - i0, -1)
                block[lower] = block.T[lower]
            else:
                matrix[j0:j1, i0:i1] = matrix[i0:i1, j0:j1].T
    return out


def is_symmetric(matrix: np.ndarray) -> bool:
    """``matrix == matrix.T`` exactly (square), compared a square block at a time (5x
    faster than ``np.array_equal(m, m.T)`` at D = 2000: the transpose is read in
    cache-sized pieces)."""
    return all(np.array_equal(matrix[i0:i1, j0:j1], matrix[j0:j1, i0:i1].T)
               for i0, i1, j0, j1 in _upper_blocks(matrix.shape[0]))


def _upper_blocks(dim: int, size: int = 128) -> Iterator[tuple[int, int, int, int]]:
    """``(i0, i1, j0, j1)`` of the square blocks on and above the diagonal of a (dim,
    dim) matrix."""
    for i0 in range(0, dim, size):
        for j0 in range(i0, dim, size):
            yield i0, min(i0 + size, dim), j0, min(j0 + size, dim)
