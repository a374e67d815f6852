"""The POOL learner: pessimistic value iteration on privatised zone counts.

Backward over h = H..1, from a :class:`~fedqhd.pool.counts.NoisyCounts`:

1. project the noisy counts for consistency (:func:`project_counts`);
2. private kernel ``P(c | m) = x / sum x`` if ``sum x > E_rho`` else uniform (the
   paper's, ``kernel="zone"``); or, with ``kernel="shared"``, one demand law per
   stage fitted to every zone's counts (:mod:`fedqhd.pool.kernels`), with Qtilde the
   exact expectation over it (:meth:`PoolLearner._fit_shared`);
3. at each base point b_j of each zone,
   ``Qtilde = sum_c P(c|m) (r_h(b_j, s'_c) + V_{h+1}(s'_c))`` with the known
   reward scaled to [0, 1] and ``s'_c`` the cell representatives. The scale is
   one affine map for all stages (``reward_scale="common"``, the default), which
   leaves the optimal policy unchanged; ``"stage"`` (each stage by its own range,
   the earlier behaviour) maximises a stage-reweighted objective and is kept
   only to reproduce old numbers;
4. ``Qbar = min(Qtilde - Gamma, H - h + 1)^+`` with
   ``Gamma = c1 sqrt(Var_P(V_{h+1}) iota / (n - E)) + c2 S H E iota / n`` if
   ``n > E``, else ``Gamma = c_fallback * H`` (the zone is unknown);
5. Q between base points by the zone interpolator; ``V_h(s) = max_a Q_h(s, a)``
   over a fixed candidate action set.

The theory's constants (c1 = sqrt 2, c2 = 16) make Gamma dominate every
Q-value at realistic sample sizes, so the defaults here are smaller and
exposed; ``E_rho`` follows the paper's Theorem 2 unless ``threshold`` is set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from fedqhd.pool.counts import NoisyCounts
from fedqhd.pool.kernels import Transition, cell_map, demand_grid, fit_demand_and_mass
from fedqhd.pool.projection import project_counts
from fedqhd.pool.zones import PostDecisionZones, _grid_nodes, multilinear_weights

KERNELS = ("zone", "shared")  #: next-state kernel estimators; "zone" is the paper's
EM_NOISE = ("clipped", "ignore")  #: how the shared kernel's EM treats the release's noise

RewardFn = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


def e_rho(horizon: int, n_zones: int, n_dims: int, w: int, rho: float, delta: float) -> float:
    """E_rho of the paper's Theorem 2: 4 sqrt(H log(4 H M^2 (w+d) w / delta) / rho)."""
    if not math.isfinite(rho):
        return 0.0
    return 4.0 * math.sqrt(horizon * math.log(4 * horizon * n_zones**2 * n_dims * w / delta) / rho)


def candidate_actions(d: int, per_axis: int = 11, n_random: int = 128,
                      random_state: int | None = 0) -> np.ndarray:
    """Actions searched by ``max_a``: a lattice for d <= 2, else random points plus the diagonal."""
    if d <= 2:
        g = np.linspace(0.0, 1.0, per_axis)
        return np.stack(np.meshgrid(*([g] * d), indexing="ij"), -1).reshape(-1, d)
    rng = np.random.default_rng(random_state)
    diag = np.repeat(np.linspace(0.0, 1.0, per_axis)[:, None], d, axis=1)
    return np.concatenate([diag, rng.random((n_random, d))])


class PoolLearner:
    """POOL (Private Offline One-sided-feedback Learner) on released counts.

    Parameters
    ----------
    reward_fn : callable (h, b (..., w+d), s_next (..., w)) -> (...)
        The known reward (paper's assumption), e.g. ``InventoryModel.known_reward``.
    reward_bounds : callable h -> (lo, hi)
        Range of ``reward_fn`` at stage h, used to scale rewards to [0, 1].
    reward_scale : {"common", "stage"}
        ``"common"``: one range ``[min_h lo_h, max_h hi_h]`` for every stage (keeps
        the objective); ``"stage"``: each stage by its own range (biased; old
        behaviour).
    action_dim : int
    c1, c2, c_fallback : float
        Pessimism constants of Gamma (see module docstring).
    delta : float
        Failure probability in E_rho and iota.
    threshold : float or None
        Override of E_rho (None: the paper's formula; 0: no threshold).
    threshold_sigmas : float or None
        If set (and ``threshold`` is None), the threshold is this many noise
        standard deviations of the release, ``k * sigma`` (data-independent,
        so still post-processing); E_rho's union bound over every zone is far
        larger at realistic sizes (53 vs 11 at H = 7, rho = 1, k = 3).
    slack : float or None
        Slack of the consistency projection, ``|sum_s' x - n'(s, a)| <= slack / 2``
        (None: the threshold, as in the paper). A small slack removes more of the
        noise mass that clipping at zero adds to empty next-state cells.
    actions : ndarray (K, d) or None
        Candidate actions for ``max_a``; default :func:`candidate_actions`.
    random_state : int or None
        Seeds the candidate actions when d > 2.
    kernel : {"zone", "shared"}
        ``"zone"`` (the paper's): each zone's kernel from its own counts.
        ``"shared"``: one demand distribution per stage fitted to every zone's counts
        (:mod:`fedqhd.pool.kernels`; assumes ``s' = transition(u, D)`` with D
        independent of the post-decision level u; needs post-decision zones). A zone
        is then known when the stage's total count passes the threshold, and Gamma
        uses that total.
    transition : callable (u, D) -> s' or None
        Needed by ``kernel="shared"``, e.g. ``InventoryModel.next_from_post``.
    em_noise : {"clipped", "ignore"}
        ``kernel="shared"`` only. ``"clipped"`` (default): the EM reads the released
        counts unprojected and models the mass that clipping the Gaussian noise at zero
        adds to each cell (sigma is public; :func:`~fedqhd.pool.kernels.fit_demand_and_mass`),
        and Gamma uses the fitted real mass. ``"ignore"``: projected counts taken at face
        value (round 2 of issue 9; its phantom counts grow with the number of zones).

    Attributes
    ----------
    e_rho_ : float
    coef_ : list of dict
        Per-stage interpolation coefficients.
    qbar_ : list of ndarray (Z, P)
        Pessimistic Q at the base points.
    v_cells_ : ndarray (H + 1, C)
        Value at next-state cell representatives.
    demand_ : list of ndarray or None
        Fitted demand weights per stage (``kernel="shared"`` only).
    mass_ : list of float or None
        Real transitions per stage as the EM estimates them, the n of Gamma
        (``kernel="shared"`` only).
    """

    def __init__(self, reward_fn: RewardFn, reward_bounds: Callable[[int], tuple[float, float]],
                 action_dim: int, c1: float = 0.05, c2: float = 0.0, c_fallback: float = 1.0,
                 delta: float = 1e-5, threshold: float | None = None,
                 actions: np.ndarray | None = None, random_state: int | None = 0,
                 reward_scale: str = "common", slack: float | None = None,
                 threshold_sigmas: float | None = None, kernel: str = "zone",
                 transition: Transition | None = None, em_noise: str = "clipped") -> None:
        if reward_scale not in ("common", "stage"):
            raise ValueError(f"reward_scale must be 'common' or 'stage', got {reward_scale!r}")
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
        if kernel == "shared" and transition is None:
            raise ValueError("kernel='shared' needs the transition s' = g(u, D)")
        if em_noise not in EM_NOISE:
            raise ValueError(f"em_noise must be one of {EM_NOISE}, got {em_noise!r}")
        self.kernel, self.transition, self.em_noise = kernel, transition, em_noise
        self.reward_fn = reward_fn
        self.reward_bounds = reward_bounds
        self.reward_scale = reward_scale
        self.action_dim = action_dim
        self.c1, self.c2, self.c_fallback = c1, c2, c_fallback
        self.delta = delta
        self.threshold = threshold
        self.slack = slack
        self.threshold_sigmas = threshold_sigmas
        self.actions = actions
        self.random_state = random_state

    # ------------------------------------------------------------------ fit
    def fit(self, counts: NoisyCounts) -> PoolLearner:
        """Learn from released counts (post-processing only; raw data is never seen)."""
        if not isinstance(counts, NoisyCounts):
            raise TypeError("PoolLearner.fit takes a NoisyCounts release, not raw data")
        H, Z, C = counts.n_sas.shape
        self.zones_, self.cells_ = counts.zones, counts.cells
        if self.kernel == "shared" and not isinstance(self.zones_, PostDecisionZones):
            raise ValueError("kernel='shared' needs post-decision zones "
                             f"(zoning='post-decision'), got {self.zones_.kind!r}")
        w = self.cells_.w
        n_dims = w + self.action_dim
        if self.threshold is not None:
            self.e_rho_ = float(self.threshold)
        elif self.threshold_sigmas is not None:
            self.e_rho_ = float(self.threshold_sigmas * counts.sigma)
        else:
            self.e_rho_ = e_rho(H, Z, n_dims, w, counts.rho, self.delta)
        self.slack_ = self.e_rho_ if self.slack is None else self.slack
        self.actions_ = (self.actions if self.actions is not None
                         else candidate_actions(self.action_dim, random_state=self.random_state))
        iota = math.log(H * C * Z / self.delta)
        reps = self.cells_.representatives()  # (C, w)
        self.horizon_ = H
        self.coef_: list = [None] * H
        self.qbar_: list = [None] * H
        self.v_cells_ = np.zeros((H + 1, C))
        self.demand_: list = [None] * H
        self.mass_: list = [None] * H
        bounds = [self.reward_bounds(h) for h in range(H)]
        if self.reward_scale == "common":
            common = (min(b[0] for b in bounds), max(b[1] for b in bounds))
            bounds = [common] * H
        self.reward_range_ = bounds
        if self.kernel == "shared":
            self._fit_shared(counts, iota)
            return self
        for h in reversed(range(H)):
            x = project_counts(counts.n_sas[h], counts.n_sa[h], self.slack_)
            n_t = x.sum(-1)
            known = n_t > self.e_rho_
            p = np.where(known[:, None], x / np.where(n_t > 0, n_t, 1.0)[:, None], 1.0 / C)
            v_next = self.v_cells_[h + 1]
            pts = self.zones_.base_points(h)  # (Z, P, n)
            lo, hi = bounds[h]
            r = (self.reward_fn(h, pts[:, :, None, :], reps[None, None]) - lo) / (hi - lo)
            r = np.broadcast_to(r, pts.shape[:2] + (C,))
            q_t = np.einsum("zc,zpc->zp", p, np.clip(r, 0, 1)) + (p @ v_next)[:, None]
            var = np.maximum(p @ v_next**2 - (p @ v_next) ** 2, 0.0)
            self._pessimise(h, q_t, var, n_t, known, iota, C)
            self.v_cells_[h] = self._q_grid(h, reps).max(-1)
        return self

    def _pessimise(self, h: int, q_t: np.ndarray, var: np.ndarray, n_t: np.ndarray,
                   known: np.ndarray, iota: float, n_cells: int) -> None:
        """Qbar = min(Qtilde - Gamma, H - h)^+ at the base points; store it and its interpolator."""
        H = self.horizon_
        with np.errstate(divide="ignore", invalid="ignore"):
            gamma = (self.c1 * np.sqrt(var * iota / (n_t - self.e_rho_))
                     + self.c2 * n_cells * H * self.e_rho_ * iota / n_t)
        gamma = np.where(known, gamma, self.c_fallback * H)
        qbar = np.clip(q_t - gamma[:, None], 0.0, H - h)
        self.qbar_[h] = qbar
        self.coef_[h] = self.zones_.interpolator(h, qbar)

    def _fit_shared(self, counts: NoisyCounts, iota: float) -> None:
        """Backward pass with one fitted demand law per stage (``kernel="shared"``).

        With the demand law known on a grid, Qtilde at a zone's level u is the exact
        expectation over demand, ``sum_g q_g (r(u, g(u, D_g)) + V_{h+1}(g(u, D_g)))``,
        with V_{h+1} interpolated multilinearly on a state grid, instead of the
        expectation over next-state cells at their representatives (whose rounding
        grows into a jagged Q as zones get finer). Counts enter only through q and the
        fitted mass (``em_noise``).
        """
        assert self.transition is not None and isinstance(self.zones_, PostDecisionZones)
        H, Z, C = counts.n_sas.shape
        w = self.cells_.w
        u = self.zones_.post_points(0)  # the same levels at every stage
        self.demand_grid_ = demand_grid(w)
        cmap = cell_map(u, self.demand_grid_, self.transition, self.cells_)
        nxt = self.transition(u[:, None, :], self.demand_grid_[None])  # (Z, G, w)
        k_v = max(2, min(11, int(np.floor(512 ** (1.0 / w) + 1e-9))))  # V's state grid
        self.v_states_ = _grid_nodes(k_v, w)
        self.v_grid_ = np.zeros((H + 1, k_v**w))
        ids, wts = multilinear_weights(nxt, k_v)
        pts = self.zones_.base_points(0)[:, 0]  # (Z, w+d)
        cell_ids, cell_wts = multilinear_weights(self.cells_.representatives(), k_v)
        for h in reversed(range(H)):
            if self.em_noise == "clipped":
                q, mass = fit_demand_and_mass(counts.n_sas[h], cmap, C, sigma=counts.sigma)
            else:
                x = project_counts(counts.n_sas[h], counts.n_sa[h], self.slack_)
                q, mass = fit_demand_and_mass(x, cmap, C)
            self.demand_[h], self.mass_[h] = q, mass
            n_t = np.full(Z, mass)
            lo, hi = self.reward_range_[h]
            r = np.clip((self.reward_fn(h, pts[:, None, :], nxt) - lo) / (hi - lo), 0.0, 1.0)
            v = np.einsum("zgk,zgk->zg", self.v_grid_[h + 1][ids], wts)
            q_t = (r + v) @ q
            var = np.maximum(v**2 @ q - (v @ q) ** 2, 0.0)
            self._pessimise(h, q_t[:, None], var, n_t, n_t > self.e_rho_, iota, C)
            self.v_grid_[h] = self._q_grid(h, self.v_states_).max(-1)
            self.v_cells_[h] = np.einsum("ck,ck->c", self.v_grid_[h][cell_ids], cell_wts)

    # -------------------------------------------------------------- predict
    def q_values(self, h: int, points: np.ndarray) -> np.ndarray:
        """Pessimistic Q_h at state-action points (..., w+d) (scaled reward units)."""
        return np.clip(self.zones_.interpolate(h, self.coef_[h], np.asarray(points, float)),
                       0.0, self.horizon_ - h)

    def _q_grid(self, h: int, states: np.ndarray) -> np.ndarray:
        """Q_h(s, a) for every state (n, w) and candidate action: (n, K)."""
        n, k = states.shape[0], self.actions_.shape[0]
        b = np.concatenate([np.repeat(states[:, None], k, 1),
                            np.broadcast_to(self.actions_, (n, k, self.action_dim))], -1)
        return self.q_values(h, b)

    def act(self, h: int, states: np.ndarray) -> np.ndarray:
        """Greedy action ``argmax_a Q_h(s, a)`` over the candidate set, for states (n, w)."""
        return self.actions_[self._q_grid(h, np.asarray(states, float)).argmax(-1)]

    def values(self, h: int, states: np.ndarray) -> np.ndarray:
        """V_h(s) = max_a Q_h(s, a)."""
        return self._q_grid(h, np.asarray(states, float)).max(-1)
