"""Multi-product inventory control with backlogged or lost-sales dynamics.

The POOL paper's test bed. ``w`` independent products; state ``s`` and action
``a`` are scaled to ``[0, 1]^w`` in units of the demand bound ``D_max``:

* lost sales: ``s = x`` (on-hand stock, ``0 <= x <= 1``), order-up-to level
  ``y = min(s + a, 1)``, next stock ``x' = (y - D)^+``. Sales ``min(y, D)`` are
  observed, demand above ``y`` is not (censored): one-sided feedback.
* backlogged: stock ``x in [-1, 1]`` stored as ``s = (x + 1) / 2``,
  ``y = min(x + a, 1)``, ``x' = max(y - D, -1)`` (backlog capped at ``D_max``).

Per-stage holding ``h_h`` and backorder/lost-sale ``b_h`` costs are drawn from
``U[0, 0.5]``; stage cost ``c_h = h^T (y - D)^+ + b^T (D - y)^+`` is positive,
so the relative gap ``(c - c*) / c*`` is meaningful.

Lost-sales reward as the learner sees it. The paper prints
``r = -(h^T (y - D)^+ - b^T min(y, D))`` (holding cost minus revenue). It is
observable from sales alone, and since ``min(y, D) = D - (D - y)^+`` it equals
``-c_h + b^T D``: the same objective up to a policy-independent constant. The
learner is given this observable reward (:meth:`InventoryModel.known_reward`),
evaluation reports the positive cost ``c``.

Reference optimum ``c*``: products and stages are independent given the order-up-to
levels, so the problem separates into ``w`` one-dimensional finite-horizon DPs,
solved by backward induction on a fine stock grid (``grid`` points, linear
interpolation between them) with the demand distribution integrated by
midpoint quadrature (uniform demand) or exactly (empirical demand).
:func:`optimal_policy` returns that DP policy; ``c*`` is its cost under the
same simulated demands as the policy being scored (common random numbers).

Real demand: the bundled UCI bike-sharing daily series (H = 7, stage h = day of
week, products = columns ``casual``, ``registered``, ``cnt``), or a Rossmann
Kaggle ``train.csv`` via :func:`load_rossmann`.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "fedqhd/Inventory-v0"
MODELS = ("lost_sales", "backlogged")
DEMANDS = ("uniform", "bike")  #: named demand distributions (or pass samples)
BIKE_COLUMNS = ("casual", "registered", "cnt")

Policy = Callable[[int, np.ndarray], np.ndarray]


@dataclass
class InventoryModel:
    """Inventory MDP parameters and vectorised dynamics.

    Parameters
    ----------
    w : int
        Number of products (state and action dimension).
    horizon : int
        Episode length H.
    model : {"lost_sales", "backlogged"}
    holding, backorder : ndarray (H, w)
        Per-stage unit costs.
    demand_samples : list of ndarray (k_h, w) or None
        Empirical scaled demand per stage; ``None`` means ``U[0, 1]^w``.
    """

    w: int
    horizon: int
    model: str
    holding: np.ndarray
    backorder: np.ndarray
    demand_samples: list[np.ndarray] | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")

    # -- conversions -----------------------------------------------------------------
    def stock(self, s: np.ndarray) -> np.ndarray:
        """Scaled state -> stock level x."""
        return s if self.model == "lost_sales" else 2.0 * s - 1.0

    def state(self, x: np.ndarray) -> np.ndarray:
        """Stock level x -> scaled state in [0, 1]."""
        return x if self.model == "lost_sales" else (x + 1.0) / 2.0

    def order_up_to(self, s: np.ndarray, a: np.ndarray) -> np.ndarray:
        return np.minimum(self.stock(s) + a, 1.0)

    # -- dynamics --------------------------------------------------------------------
    def sample_demand(self, h: int, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.demand_samples is None:
            return rng.random((n, self.w))
        pool = self.demand_samples[h]
        return pool[rng.integers(0, len(pool), size=n)]

    def step_batch(self, h: int, s: np.ndarray, a: np.ndarray, demand: np.ndarray):
        """Advance a batch: returns (next state, stage cost >= 0, observable reward)."""
        y = self.order_up_to(s, np.clip(a, 0.0, 1.0))
        over, under = np.maximum(y - demand, 0.0), np.maximum(demand - y, 0.0)
        cost = over @ self.holding[h] + under @ self.backorder[h]
        x_next = over if self.model == "lost_sales" else np.maximum(y - demand, -1.0)
        s_next = self.state(x_next)
        return s_next, cost, self.known_reward(h, np.concatenate([s, a], axis=-1), s_next)

    def known_reward(self, h: int, b: np.ndarray, s_next: np.ndarray) -> np.ndarray:
        """Reward the learner can compute from (s, a, s') -- no hidden demand needed.

        Lost sales: ``b^T sales - h^T leftover`` with ``sales = y - x'``.
        Backlogged: ``-(h^T x'^+ + b^T x'^-)``. Broadcasts over leading axes.
        """
        x_next = self.stock(s_next)
        if self.model == "lost_sales":
            y = self.order_up_to(b[..., : self.w], b[..., self.w :])
            sales = np.maximum(y - x_next, 0.0)
            return sales @ self.backorder[h] - x_next @ self.holding[h]
        return -(np.maximum(x_next, 0.0) @ self.holding[h]
                 + np.maximum(-x_next, 0.0) @ self.backorder[h])

    def reward_bounds(self, h: int) -> tuple[float, float]:
        """Range of :meth:`known_reward` at stage h alone.

        Scaling each stage by its own range reweights the stages (a stage with
        25x the costs counts as much as the cheapest one); learners should use
        :meth:`common_reward_bounds`, one range for every stage.
        """
        if self.model == "lost_sales":
            return -float(self.holding[h].sum()), float(self.backorder[h].sum())
        return -float(np.maximum(self.holding[h], self.backorder[h]).sum()), 0.0

    def common_reward_bounds(self) -> tuple[float, float]:
        """One range containing :meth:`known_reward` at every stage.

        An affine map with the same slope at every stage preserves the objective
        (sum of rewards) up to a constant, so the optimal policy is unchanged.
        """
        lows, highs = zip(*(self.reward_bounds(h) for h in range(self.horizon)), strict=True)
        return float(min(lows)), float(max(highs))

    # -- post-decision state -----------------------------------------------------------
    def post_decision(self, b: np.ndarray) -> np.ndarray:
        """Scaled order-up-to level ``u = state(y)`` in [0, 1]^w of points ``b = (s, a)``.

        Costs, observable rewards and next states depend on ``(s, a)`` only through
        ``y``, so ``Q_h(s, a) = G_h(u)``: the post-decision state is sufficient.
        """
        b = np.asarray(b, dtype=float)
        return self.state(self.order_up_to(b[..., : self.w], np.clip(b[..., self.w :], 0, 1)))

    def next_from_post(self, u: np.ndarray, demand: np.ndarray) -> np.ndarray:
        """Next scaled state from post-decision level ``u`` and scaled demand (broadcasts).

        ``s' = g(u, D)``: the structure a learner may assume (demand independent of u).
        """
        y = self.stock(np.asarray(u, dtype=float))
        x_next = np.maximum(y - demand, 0.0 if self.model == "lost_sales" else -1.0)
        return self.state(x_next)

    def decision_point(self, u: np.ndarray) -> np.ndarray:
        """A point ``b = (s, a)`` with ``post_decision(b) = u``: stock at ``y``, order 0."""
        u = np.asarray(u, dtype=float)
        return np.concatenate([u, np.zeros_like(u)], axis=-1)

    def newsvendor_levels(self) -> np.ndarray:
        """Per-stage critical-fractile stock levels y_h = F_h^-1(b / (b + h)), shape (H, w).

        The one-period (myopic) rule a retailer would run: a sensible behaviour
        policy, not the optimum of the H-stage problem.
        """
        frac = self.backorder / np.maximum(self.backorder + self.holding, 1e-12)
        if self.demand_samples is None:
            return frac.copy()
        return np.stack([[np.quantile(self.demand_samples[h][:, i], frac[h, i])
                          for i in range(self.w)] for h in range(self.horizon)])

    def initial_states(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """d_1: stock uniform on [0, 1] (lost sales) or [-1, 1] (backlogged), i.e. s ~ U[0,1]^w."""
        return rng.random((n, self.w))

    # -- evaluation ------------------------------------------------------------------
    def rollout_cost(self, policy: Policy, n_episodes: int = 2000, random_state: int = 0
                     ) -> float:
        """Mean total cost of ``policy(h, states) -> actions`` over simulated episodes.

        The same ``random_state`` gives the same initial states and demands for
        every policy (common random numbers), so cost differences are low-noise.
        """
        rng = np.random.default_rng(random_state)
        s = self.initial_states(n_episodes, rng)
        demands = [self.sample_demand(h, n_episodes, rng) for h in range(self.horizon)]
        total = np.zeros(n_episodes)
        for h in range(self.horizon):
            a = np.clip(np.asarray(policy(h, s), dtype=float), 0.0, 1.0)
            s, cost, _ = self.step_batch(h, s, a, demands[h])
            total += cost
        return float(total.mean())


def make_inventory_model(
    w: int = 2,
    horizon: int = 7,
    model: str = "lost_sales",
    demand: str | np.ndarray = "uniform",
    random_state: int | None = 0,
) -> InventoryModel:
    """Build an inventory model with costs ``U[0, 0.5]`` drawn from ``random_state``.

    ``demand`` is ``"uniform"`` (``D ~ U[0, D_max]``, scaled to ``U[0, 1]``),
    ``"bike"`` (bundled bike-sharing series, stage = day of week), or an array of
    shape (days, w) with a weekday column handled by :func:`weekly_demand_samples`
    -- pass the output of that function as a list instead.
    """
    rng = np.random.default_rng(random_state)
    holding = rng.uniform(0.0, 0.5, size=(horizon, w))
    backorder = rng.uniform(0.0, 0.5, size=(horizon, w))
    meta: dict[str, Any]
    samples, meta = None, {"demand": "uniform"}
    if isinstance(demand, str) and demand == "bike":
        series, weekday = load_bike_sharing([BIKE_COLUMNS[i % 3] for i in range(w)])
        samples = weekly_demand_samples(series, weekday, horizon)
        meta = {"demand": "bike_sharing_daily", "columns": [BIKE_COLUMNS[i % 3] for i in range(w)]}
    elif isinstance(demand, list):
        samples, meta = demand, {"demand": "custom"}
    elif not (isinstance(demand, str) and demand == "uniform"):
        raise ValueError(f"unknown demand {demand!r}")
    return InventoryModel(w, horizon, model, holding, backorder, samples, meta)


# ---------------------------------------------------------------------------- data
def _read_csv_columns(path_or_file, columns: list[str]) -> dict[str, list[str]]:
    reader = csv.DictReader(path_or_file)
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"CSV lacks column(s) {missing}; has {reader.fieldnames}")
    out: dict[str, list[str]] = {c: [] for c in columns}
    for row in reader:
        for c in columns:
            out[c].append(row[c])
    return out


def load_bike_sharing(columns: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bundled UCI bike-sharing daily counts: (values (days, k), weekday (days,), 0=Sunday)."""
    columns = list(columns or ["cnt"])
    ref = resources.files("fedqhd.envs").joinpath("data/bike_sharing_daily.csv")
    with ref.open("r", encoding="utf-8") as f:
        cols = _read_csv_columns(f, columns + ["weekday"])
    values = np.array([[float(v) for v in cols[c]] for c in columns]).T
    return values, np.array([int(v) for v in cols["weekday"]])


def load_rossmann(path: str | Path, store: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Daily sales of one store from a Rossmann Kaggle ``train.csv``.

    Returns (sales (days, 1), weekday (days,), 0 = Sunday), in date order, open
    days only. Raises ``ValueError`` on a file that is not in that format.
    """
    with open(path, encoding="utf-8", newline="") as f:
        cols = _read_csv_columns(f, ["Store", "DayOfWeek", "Date", "Sales", "Open"])
    try:
        rows = sorted(
            (d, int(dow), float(sales))
            for st, dow, d, sales, op in zip(cols["Store"], cols["DayOfWeek"], cols["Date"],
                                             cols["Sales"], cols["Open"], strict=True)
            if int(st) == store and int(op) == 1
        )
    except ValueError as exc:
        raise ValueError(f"malformed Rossmann CSV {path}: {exc}") from exc
    if not rows:
        raise ValueError(f"no open days for store {store} in {path}")
    if any(not 1 <= r[1] <= 7 or r[2] < 0 for r in rows):
        raise ValueError(f"malformed Rossmann CSV {path}: DayOfWeek must be 1..7, Sales >= 0")
    sales = np.array([[r[2]] for r in rows])
    return sales, np.array([r[1] % 7 for r in rows])  # Rossmann: 1=Monday..7=Sunday


def weekly_demand_samples(values: np.ndarray, weekday: np.ndarray, horizon: int = 7,
                          start_weekday: int = 1) -> list[np.ndarray]:
    """Per-stage empirical demand scaled by the per-column maximum (D_max) to [0, 1].

    Stage h uses the days whose weekday is ``(start_weekday + h) % 7`` (stage 0 is
    Monday by default), matching the paper's weekly replenishment cycle.
    """
    values = np.asarray(values, dtype=float)
    scale = values.max(axis=0)
    if np.any(scale <= 0):
        raise ValueError("demand series must have a positive maximum in every column")
    scaled = values / scale
    out = []
    for h in range(horizon):
        sel = scaled[weekday == (start_weekday + h) % 7]
        if len(sel) == 0:
            raise ValueError(f"no days for stage {h}")
        out.append(sel)
    return out


# ---------------------------------------------------------------- reference optimum
def _stage_demand_nodes(model: InventoryModel, h: int, i: int, nodes: int) -> np.ndarray:
    if model.demand_samples is None:
        return (np.arange(nodes) + 0.5) / nodes
    return model.demand_samples[h][:, i]


def optimal_policy(model: InventoryModel, grid: int = 401, nodes: int = 400
                   ) -> tuple[Policy, float]:
    """Near-optimal DP policy and its expected cost from d_1 (the reference c*).

    One backward DP per product on ``grid`` stock levels; order-up-to levels
    restricted to the grid, values interpolated linearly. Error is O(1/grid).
    """
    H = model.horizon
    lo = 0.0 if model.model == "lost_sales" else -1.0
    xs = np.linspace(lo, 1.0, grid)
    levels = np.empty((model.w, H, grid))  # chosen order-up-to level per stock level
    v1 = np.empty((model.w, grid))
    for i in range(model.w):
        v_next = np.zeros(grid)
        for h in reversed(range(H)):
            dem = _stage_demand_nodes(model, h, i, nodes)
            y = xs[:, None]
            over, under = np.maximum(y - dem, 0.0), np.maximum(dem - y, 0.0)
            cost = model.holding[h, i] * over + model.backorder[h, i] * under
            nxt = over if model.model == "lost_sales" else np.maximum(y - dem, -1.0)
            g = (cost + np.interp(nxt, xs, v_next)).mean(axis=1)  # G(y) on the grid
            # feasible y in [x, min(x + 1, 1)]: min over a window of the grid
            reach = xs[None, :] <= np.minimum(xs[:, None] + 1.0, 1.0) + 1e-12
            feas = (xs[None, :] >= xs[:, None] - 1e-12) & reach
            gm = np.where(feas, g[None, :], np.inf)
            best = gm.argmin(axis=1)
            levels[i, h] = xs[best]
            v_next = gm[np.arange(grid), best]
        v1[i] = v_next

    def policy(h: int, s: np.ndarray) -> np.ndarray:
        x = model.stock(s)
        target = np.stack([np.interp(x[:, i], xs, levels[i, h]) for i in range(model.w)], 1)
        return np.clip(target - x, 0.0, 1.0)

    # expected cost under d_1 (stock uniform on [lo, 1]) by quadrature
    c_star = float(sum(v1[i].mean() for i in range(model.w)))
    return policy, c_star


def relative_gap(cost: float, c_star: float) -> float:
    """Relative gap in percent, ``(c - c*) / c* * 100``."""
    return 100.0 * (cost - c_star) / c_star


# ------------------------------------------------------------------------ datasets
@dataclass(frozen=True)
class Trajectories:
    """Offline data: states (n, H+1, w), actions (n, H, w), observable rewards (n, H)."""

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray

    @property
    def n(self) -> int:
        return self.states.shape[0]


BEHAVIOURS = ("uniform", "base-stock")  #: behaviour policies of :func:`generate_dataset`


def generate_dataset(model: InventoryModel, n: int, random_state: int = 0,
                     behaviour: str = "uniform", noise: float = 0.15) -> Trajectories:
    """Behaviour-policy trajectories, deterministic in seed.

    ``behaviour="uniform"``: order quantities uniform on [0, 1] (the paper's).
    ``behaviour="base-stock"``: what a retailer's records look like -- each step
    orders up to the myopic newsvendor level (:meth:`InventoryModel.newsvendor_levels`)
    plus Gaussian noise of scale ``noise`` (in units of D_max), drawn per step and
    product: ``a = clip(level + noise * z - x, 0, 1)``.
    """
    if behaviour not in BEHAVIOURS:
        raise ValueError(f"behaviour must be one of {BEHAVIOURS}, got {behaviour!r}")
    rng = np.random.default_rng(random_state)
    s = model.initial_states(n, rng)
    states = np.empty((n, model.horizon + 1, model.w))
    if behaviour == "uniform":
        actions = rng.random((n, model.horizon, model.w))
    else:
        actions = np.empty((n, model.horizon, model.w))
        levels = model.newsvendor_levels()
    rewards = np.empty((n, model.horizon))
    states[:, 0] = s
    for h in range(model.horizon):
        if behaviour == "base-stock":
            target = levels[h] + noise * rng.standard_normal((n, model.w))
            actions[:, h] = np.clip(target - model.stock(s), 0.0, 1.0)
        s, _, rewards[:, h] = model.step_batch(h, s, actions[:, h],
                                               model.sample_demand(h, n, rng))
        states[:, h + 1] = s
    return Trajectories(states, actions, rewards)


# ----------------------------------------------------------------------- gymnasium
class InventoryEnv(gym.Env):
    """Gymnasium wrapper of :class:`InventoryModel` (reward = minus stage cost).

    Observation and action are ``Box(0, 1, (w,))``; the episode terminates after
    H steps. ``info`` carries the stage ``h``, the cost and the learner-observable
    reward.
    """

    metadata = {"render_modes": []}

    def __init__(self, w: int = 2, horizon: int = 7, model: str = "lost_sales",
                 demand: str = "uniform", cost_seed: int = 0) -> None:
        self.model = make_inventory_model(w, horizon, model, demand, cost_seed)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (w,), dtype=np.float32)
        self.action_space = gym.spaces.Box(0.0, 1.0, (w,), dtype=np.float32)
        self._s = np.zeros((1, w))
        self._h = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._s = self.model.initial_states(1, self.np_random)
        self._h = 0
        return self._s[0].astype(np.float32), {"h": 0}

    def step(self, action):
        a = np.clip(np.asarray(action, dtype=float).reshape(1, -1), 0.0, 1.0)
        d = self.model.sample_demand(self._h, 1, self.np_random)
        s_next, cost, obs_r = self.model.step_batch(self._h, self._s, a, d)
        info = {"h": self._h, "cost": float(cost[0]), "observed_reward": float(obs_r[0])}
        self._s, self._h = s_next, self._h + 1
        terminated = self._h >= self.model.horizon
        obs = np.clip(s_next[0], 0.0, 1.0).astype(np.float32)
        return obs, -float(cost[0]), terminated, False, info


if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="fedqhd.envs.inventory:InventoryEnv")

# an entry of the fedqhd env registry (kind "pool": no discrete actions, no EnvSpec)
from fedqhd.envs import registry as _registry  # noqa: E402 (after the gymnasium registration)

_registry._register_task(ENV_ID, "pool", "the POOL learner's inventory MDP (learner='pool')")
