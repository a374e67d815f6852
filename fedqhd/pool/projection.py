"""Consistency projection of noisy counts (Qiao & Wang 2023), in closed form.

For each (s, a) with noisy ``n'(s, a)`` = N and noisy next-state counts ``v``
(clipped at zero), solve::

    min_x max_s' |x_s' - v_s'|   s.t.  x >= 0,  |sum x - N| <= E / 2.

If ``sum v`` is above ``N + E/2`` every entry must come down by at most t:
the smallest such t gives ``x = (v - t)^+`` (a soft threshold, found by a
sort as in simplex projection). If it is below ``N - E/2`` every entry goes up
by the deficit over S. Otherwise ``x = v``. The LP optimum is not unique; the
tests compare the objective value with ``scipy.optimize.linprog``.
"""

from __future__ import annotations

import numpy as np


def project_counts(n_sas: np.ndarray, n_sa: np.ndarray, e_rho: float) -> np.ndarray:
    """Closed-form projection, vectorised over leading axes.

    Parameters
    ----------
    n_sas : ndarray (..., S)
        Noisy next-state counts, non-negative.
    n_sa : ndarray (...)
        Noisy visit counts.
    e_rho : float
        Privacy slack E_rho (0 for exact counts).

    Returns
    -------
    ndarray (..., S)
        Projected counts x.
    """
    v = np.asarray(n_sas, dtype=float)
    if np.any(v < 0):
        raise ValueError("clip the noisy counts at zero before projecting")
    s = v.shape[-1]
    total = v.sum(-1)
    upper = n_sa + e_rho / 2.0
    lower = n_sa - e_rho / 2.0
    # t1: smallest t >= 0 with sum (v - t)^+ <= upper (only where total > upper)
    srt = -np.sort(-v, axis=-1)
    k = np.arange(1, s + 1)
    tk = (np.cumsum(srt, -1) - upper[..., None]) / k
    valid = srt > tk
    kstar = s - 1 - np.argmax(valid[..., ::-1], axis=-1)  # largest valid k (0-based)
    t1 = np.take_along_axis(tk, kstar[..., None], -1)[..., 0]
    t1 = np.where(total > upper, np.maximum(t1, 0.0), 0.0)
    t2 = np.maximum(0.0, (lower - total) / s)
    x = np.where((t1 > 0)[..., None], np.maximum(v - t1[..., None], 0.0), v)
    return np.where((t2 > 0)[..., None], v + t2[..., None], x)
