"""Discretisations of the observable region: norm zones (POOL), post-decision
zones, and an axis grid.

All map a point ``b = (s, a)`` at stage h to a zone, give the base points of
each zone at which Q is estimated, and interpolate Q between them.

Zone span (a deliberate change from the paper). The paper puts ``b`` in zone m
when ``(w+d)(m-1)/M <= ||b||_2 < (w+d)m/M``; on ``[0,1]^(w+d)`` the norm is at
most ``sqrt(w+d)``, and restricted to the observable region ``b < lambda_h`` at
most ``||lambda_h||``, so most of those zones would be empty. We divide
``[0, ||lambda_h||_2]`` into M equal shells, so all M zones are used.

One-sided feedback. Lower feedback observes ``b < lambda_h``; higher feedback
observes ``b > lambda_h`` and is handled by the reflection ``b -> 1 - b``,
which maps it to lower feedback with boundary ``1 - lambda_h``. Points outside
the observable region take the value at the nearest boundary point
``min(b, lambda_h)`` (in the paper's 1-D setting this is lambda_h itself).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

_EPS = 1e-9


class _Region:
    """Observable region ``b < lam`` (after reflection for higher feedback)."""

    def __init__(self, lam: np.ndarray, feedback: str) -> None:
        if feedback not in ("lower", "higher"):
            raise ValueError("feedback must be 'lower' or 'higher'")
        self.feedback = feedback
        lam = np.asarray(lam, dtype=float)
        self.lam = 1.0 - lam if feedback == "higher" else lam  # (H, n) in lower coordinates
        if np.any(self.lam <= 0) or np.any(self.lam > 1):
            raise ValueError("observable boundary must leave a non-empty region in [0, 1]")

    def to_lower(self, b: np.ndarray) -> np.ndarray:
        return 1.0 - b if self.feedback == "higher" else b

    def observable(self, h: int, b: np.ndarray) -> np.ndarray:
        return np.all(self.to_lower(b) < self.lam[h], axis=-1)

    def to_boundary(self, h: int, b: np.ndarray) -> np.ndarray:
        """Lower-coordinate point clipped into the observable region."""
        return np.minimum(self.to_lower(b), self.lam[h] * (1 - _EPS))


class NormZones(_Region):
    """M l2-norm shells of the observable region, w+d base points each.

    Base points of zone m lie on the shell's mid radius r; point j is pushed as
    far as the region allows towards axis j (coordinate j = min(r, lambda_j),
    the rest spread proportionally to lambda), so the points are spread out and
    linearly independent. Q inside the zone is linear on the Gram-Schmidt (QR)
    basis of these points: ``b = sum_j m_j b_j``,
    ``Q(b) = sum_j m_j Qbar(b_j) / sum_j m_j``. The normalisation by
    ``sum_j m_j`` (absent in the paper) makes a constant Q reproduce itself --
    without it Q would be scaled by up to ``sqrt(w+d)`` on a shell.
    """

    kind = "zones"

    def __init__(self, n_zones: int, lam: np.ndarray, feedback: str = "lower") -> None:
        super().__init__(lam, feedback)
        self.n_zones = int(n_zones)
        self.radius = np.linalg.norm(self.lam, axis=-1)  # (H,)

    def zone_of(self, h: int, b: np.ndarray) -> np.ndarray:
        """Zone index of observable points (-1 elsewhere)."""
        z = np.floor(np.linalg.norm(self.to_lower(b), axis=-1) / self.radius[h] * self.n_zones)
        z = np.minimum(z, self.n_zones - 1).astype(np.int64)
        return np.where(self.observable(h, b), z, -1)

    def base_points(self, h: int) -> np.ndarray:
        """(M, n, n) base points in original coordinates; point j is [:, j]."""
        lam, m = self.lam[h], self.n_zones
        n = lam.size
        r = (np.arange(m) + 0.5) / m * self.radius[h]
        pts = np.empty((m, n, n))
        for j in range(n):
            pj = np.minimum(r, lam[j] * (1 - 1e-6))
            rest = np.sqrt(np.maximum(r**2 - pj**2, 0.0) / (np.sum(lam**2) - lam[j] ** 2))
            p = rest[:, None] * lam[None, :]
            p[:, j] = pj
            pts[:, j] = p
        return 1.0 - pts if self.feedback == "higher" else pts

    def interpolator(self, h: int, qbar: np.ndarray) -> dict[str, np.ndarray]:
        """Precompute per-zone coefficients: ``Q(b) = <alpha, b> / <beta, b>``."""
        pts = self.to_lower(self.base_points(h))  # (M, n pts, n dims)
        q_, r_ = np.linalg.qr(np.swapaxes(pts, 1, 2))  # B = [b_1..b_n] = Q R (Gram-Schmidt)
        # m = R^{-1} Q^T b, so sum_j m_j c_j = <Q R^{-T} c, b>
        rt = np.swapaxes(r_, 1, 2)
        sol = np.linalg.solve(rt, np.stack([qbar, np.ones_like(qbar)], -1))  # (M, n, 2)
        alpha, beta = np.einsum("zij,zjk->kzi", q_, sol)
        return {"alpha": alpha, "beta": beta, "mean": qbar.mean(-1)}

    def interpolate(self, h: int, coef: dict[str, np.ndarray], b: np.ndarray) -> np.ndarray:
        bl = self.to_boundary(h, b)
        z = np.minimum(np.floor(np.linalg.norm(bl, axis=-1) / self.radius[h] * self.n_zones),
                       self.n_zones - 1).astype(np.int64)
        num = np.einsum("...i,...i->...", coef["alpha"][z], bl)
        den = np.einsum("...i,...i->...", coef["beta"][z], bl)
        ok = den > 1e-9
        return np.where(ok, num / np.where(ok, den, 1.0), coef["mean"][z])


class GridZones(_Region):
    """Axis-aligned grid: ``q`` bins per axis of the observable box, ``q^(w+d)`` cells.

    Q is constant on a cell (its value at the cell centre). Used as the
    baseline the paper compares norm zones against.
    """

    kind = "grid"

    def __init__(self, bins: int, lam: np.ndarray, feedback: str = "lower") -> None:
        super().__init__(lam, feedback)
        self.bins = int(bins)
        n = self.lam.shape[-1]
        self.n_zones = self.bins**n
        self._mult = self.bins ** np.arange(n)

    @staticmethod
    def bins_for(n_zones: int, n_dims: int, max_cells: int) -> int:
        """Bins per axis matching the resolution of ``n_zones`` norm shells.

        Shell width is ``||lambda|| / M``, so an axis of length ``lambda_i``
        needs about ``M / sqrt(n)`` bins; capped so that ``bins^n <= max_cells``.
        """
        q = max(2, int(np.ceil(n_zones / np.sqrt(n_dims))))
        cap = max(2, int(np.floor(max_cells ** (1.0 / n_dims) + 1e-9)))
        return min(q, cap)

    def _cell(self, h: int, bl: np.ndarray) -> np.ndarray:
        idx = np.minimum(np.floor(bl / self.lam[h] * self.bins), self.bins - 1).astype(np.int64)
        return idx @ self._mult

    def zone_of(self, h: int, b: np.ndarray) -> np.ndarray:
        return np.where(self.observable(h, b), self._cell(h, self.to_lower(b)), -1)

    def base_points(self, h: int) -> np.ndarray:
        n = self.lam.shape[-1]
        idx = (np.arange(self.n_zones)[:, None] // self._mult[None, :]) % self.bins
        pts = ((idx + 0.5) / self.bins * self.lam[h])[:, None, :]  # (Z, 1, n)
        assert pts.shape[-1] == n
        return 1.0 - pts if self.feedback == "higher" else pts

    def interpolator(self, h: int, qbar: np.ndarray) -> dict[str, np.ndarray]:
        return {"value": qbar[:, 0]}

    def interpolate(self, h: int, coef: dict[str, np.ndarray], b: np.ndarray) -> np.ndarray:
        return coef["value"][self._cell(h, self.to_boundary(h, b))]


def _nodes_per_axis(n_points: int, dims: int) -> int:
    """Nodes per axis of a grid with about ``n_points`` nodes in ``dims`` dimensions (>= 2)."""
    return max(2, int(np.floor(n_points ** (1.0 / dims) + 0.5)))


def _node_index(u: np.ndarray, k: int) -> np.ndarray:
    """Nearest node of the grid ``linspace(0, 1, k)`` per coordinate."""
    return np.clip(np.rint(np.clip(u, 0.0, 1.0) * (k - 1)), 0, k - 1).astype(np.int64)


def _grid_nodes(k: int, dims: int) -> np.ndarray:
    """(k^dims, dims) nodes of ``linspace(0, 1, k)^dims``; node i has digits i in base k."""
    mult = k ** np.arange(dims)
    return ((np.arange(k**dims)[:, None] // mult[None, :]) % k) / (k - 1)


def multilinear_weights(u: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ids (..., 2^p) and weights (..., 2^p) interpolating on ``linspace(0, 1, k)^p``.

    Corner i has bit j of i as its offset along axis j; the weights are built one axis
    at a time (an outer product), which keeps evaluation of many points cheap.
    """
    u = np.clip(np.asarray(u, dtype=float), 0.0, 1.0)
    p = u.shape[-1]
    x = u * (k - 1)
    lo = np.minimum(np.floor(x), k - 2)
    f = x - lo  # (..., p) in [0, 1]
    mult = k ** np.arange(p)
    offsets = ((np.arange(2**p)[:, None] >> np.arange(p)) & 1) @ mult  # (2^p,)
    wts = np.ones(u.shape[:-1] + (1,))
    for j in range(p):
        fj = f[..., j, None]
        wts = np.concatenate([wts * (1.0 - fj), wts * fj], axis=-1)
    return (lo.astype(np.int64) @ mult)[..., None] + offsets, wts


class PostDecisionZones(_Region):
    """Zones over a post-decision state ``u = post(b)`` in ``[0, 1]^p``.

    In inventory control ``u`` is the (scaled) order-up-to level ``y = s + a``:
    costs, rewards and transitions depend on ``(s, a)`` only through it, so
    pairs that merge here are equivalent, unlike norm shells, which merge
    ``(s, a)`` of equal norm but different ``y``. The zones are the cells of the
    nearest-node partition of the grid ``linspace(0, 1, k)^p``,
    ``k = max(2, round(M^(1/p)))`` (so ``n_zones = k^p``, about M). Each point
    falls in exactly one zone, so the counts have POOL's sensitivity unchanged
    (one count per stage per family per trajectory). Q is estimated at the
    nodes and interpolated multilinearly between them.

    Parameters
    ----------
    n_zones : int
        Target number of zones M.
    lam : ndarray (H, w+d)
        Observable boundary in ``b`` (one-sided feedback is unchanged).
    post : callable b (..., w+d) -> u (..., p)
        The post-decision map (e.g. ``InventoryModel.post_decision``).
    point : callable u (..., p) -> b (..., w+d)
        A state-action point with ``post(point(u)) = u`` (for the known reward
        at a node, e.g. ``InventoryModel.decision_point``).
    post_dim : int
        p.
    """

    kind = "post-decision"

    def __init__(self, n_zones: int, lam: np.ndarray, post: Callable[[np.ndarray], np.ndarray],
                 point: Callable[[np.ndarray], np.ndarray], post_dim: int,
                 feedback: str = "lower") -> None:
        super().__init__(lam, feedback)
        self.post, self.point, self.post_dim = post, point, int(post_dim)
        self.nodes = _nodes_per_axis(n_zones, self.post_dim)
        self.n_zones = self.nodes**self.post_dim
        self._mult = self.nodes ** np.arange(self.post_dim)

    def zone_of(self, h: int, b: np.ndarray) -> np.ndarray:
        z = _node_index(self.post(b), self.nodes) @ self._mult
        return np.where(self.observable(h, b), z, -1)

    def post_points(self, h: int) -> np.ndarray:
        """(Z, p) post-decision level of each zone's node (where Q is estimated)."""
        return _grid_nodes(self.nodes, self.post_dim)

    def base_points(self, h: int) -> np.ndarray:
        return self.point(self.post_points(h))[:, None, :]  # (Z, 1, n)

    def interpolator(self, h: int, qbar: np.ndarray) -> dict[str, np.ndarray]:
        return {"value": qbar[:, 0]}

    def weights(self, h: int, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Multilinear weights: (zone ids (..., 2^p), weights (..., 2^p)) of points b."""
        bl = self.to_boundary(h, np.asarray(b, dtype=float))
        return multilinear_weights(self.post(1.0 - bl if self.feedback == "higher" else bl),
                                   self.nodes)

    def interpolate(self, h: int, coef: dict[str, np.ndarray], b: np.ndarray) -> np.ndarray:
        ids, wts = self.weights(h, b)
        return np.einsum("...k,...k->...", coef["value"][ids], wts)


class StateCells:
    """Next-state cells: C l2-norm shells of ``[0, 1]^w`` (``kind="norm"``, the paper's,
    represented on the diagonal) or a node grid (``kind="grid"``).

    Transition counts ``n(s, a, s')`` are kept per (zone, cell); the value of a
    cell is V at its representative state. Norm shells: ``(r / sqrt(w)) * 1``
    with r the shell's mid radius (states of equal norm but different stock mix
    are merged). Grid: the nodes of ``linspace(0, 1, k)^w`` with
    ``k = max(2, ceil(C^(1/w)))``; a state falls in the cell of its nearest node.
    The nodes include the edges, where lost-sales stock piles up (s' = 0).
    """

    def __init__(self, n_cells: int, w: int, kind: str = "norm") -> None:
        if kind not in ("norm", "grid"):
            raise ValueError(f"cells kind must be 'norm' or 'grid', got {kind!r}")
        self.kind, self.w = kind, int(w)
        if kind == "grid":
            self.nodes = max(2, int(np.ceil(n_cells ** (1.0 / w) - 1e-9)))
            self.n_cells = self.nodes**self.w
            self._mult = self.nodes ** np.arange(self.w)
        else:
            self.n_cells = int(n_cells)

    def cell_of(self, s: np.ndarray) -> np.ndarray:
        if self.kind == "grid":
            return _node_index(s, self.nodes) @ self._mult
        z = np.floor(np.linalg.norm(s, axis=-1) / np.sqrt(self.w) * self.n_cells)
        return np.clip(z, 0, self.n_cells - 1).astype(np.int64)

    def representatives(self) -> np.ndarray:
        if self.kind == "grid":
            return _grid_nodes(self.nodes, self.w)
        r = (np.arange(self.n_cells) + 0.5) / self.n_cells
        return np.repeat(r[:, None], self.w, axis=1)
