"""The online learner's numeric core (no Flower): a client that collects episodes with
its current epsilon-greedy policy (:mod:`fedqhd.acting`) and learns by ridge fitted
Q-iteration on a growing private buffer (this module). The federation around it
(rounds, aggregation, the paper's baselines) is the Flower app's:
:mod:`fedqhd.learners.fqi_online`, run by ``flwr run`` and, in process, by the paper
suite and the bench.

Speed comes from three choices, all measured (see ``BENCHMARKS.md``):

* Acting is batched: every client runs its round's episodes in parallel, the
  states of all of them are encoded at once in float32 (``cos`` in float32 is ~20x
  cheaper than in float64), and CartPole / MountainCar / Acrobot are stepped by numpy
  batch steppers that reproduce gymnasium's dynamics (LunarLander, Box2D, falls back
  to a list of gymnasium envs).
* The regression set is a subsample: each episode contributes at most
  ``per_episode`` of its transitions (the last ``tail`` of an episode that
  terminated first, the rest uniformly drawn; short episodes contribute all of
  theirs), into a buffer of at most ``capacity`` slots with
  reservoir replacement. Features of the admitted states and next states are
  cached (float32).
* Per-action sufficient statistics are updated incrementally, in float64: the
  primal Gram ``Phi_a^T Phi_a`` (rank updates for new rows, downdates for evicted
  ones) when ``D <= capacity``, else the kernel matrix ``Phi Phi^T`` of the buffer
  (rows/columns of changed slots recomputed). Each round factors them once
  (Cholesky) and runs a few FQI sweeps from a warm start.

Bellman targets are clipped to the reward-implied value range (see
:func:`fedqhd.readout.value_range`); truncation bootstraps, termination does not.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from fedqhd.encoders import (
    HDEncoder,
)
from fedqhd.envs import get_spec
from fedqhd.envs.batch import make_batch_env
from fedqhd.gram import (
    PrimalSystem,
    is_symmetric,
    pack_upper,
    primal_system,
    proximal_solve,
    unpack_upper,
)
from fedqhd.readout import bellman_targets, value_range
from fedqhd.replay import ReplayRing
from fedqhd.seeding import online_client_rng

__all__ = [
    "UPDATES",
    "OnlineClient",
    "Timer",
    "default_capacity",
]


# --------------------------------------------------------------------------- timing


class Timer:
    """Accumulated wall seconds per named section (a profile of a run)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start


NO_TIMER = Timer()  #: a timer nobody reads


# --------------------------------------------------------------------------- learning


#: how an online client learns (:class:`OnlineClient`'s ``update``)
UPDATES = ("fqi", "td")
#: what a teacher's ridge projection pulls toward (:meth:`OnlineClient.compile`)
COMPILE_TOWARD = ("own", "zero")

def _row_products(rows: np.ndarray, features: np.ndarray) -> np.ndarray:
    """``rows @ features.T`` in float32: the dual kernel's new rows."""
    return rows @ features.T




def pack_statistics(mats: np.ndarray, narrow: bool = False) -> dict[str, np.ndarray]:
    """``mats`` (k, m, m) in an exact smaller form: their upper triangles
    (``statistics-upper``, :func:`~fedqhd.strategies.contract.pack_upper`) when every
    matrix is exactly symmetric, as the Grams (numpy's ``x.T @ x`` is a symmetric rank-k
    update) and the kernel (every write sets both halves) are; with ``narrow``, in
    float32 when that loses nothing (the dual kernel holds float32 products). Otherwise
    the full matrices (``statistics``). :func:`unpack_statistics` restores them bitwise."""
    if not all(is_symmetric(m) for m in mats):
        return {"statistics": np.array(mats)}
    packed = pack_upper(mats)
    if narrow:
        small = packed.astype(np.float32)
        if np.array_equal(small, packed):
            packed = small
    return {"statistics-upper": packed}


def unpack_statistics(arrays: dict[str, np.ndarray], out: np.ndarray) -> None:
    """Write the statistics :func:`pack_statistics` packed into ``out`` (k, m, m)."""
    if "statistics-upper" in arrays:
        packed = arrays["statistics-upper"]
        if packed.shape[0] != out.shape[0]:
            raise ValueError(f"snapshot statistics of {packed.shape[0]} matrices do not "
                             f"fit {out.shape[0]}")
        unpack_upper(packed, out.shape[-1], out=out)
        return
    full = arrays["statistics"]
    if full.shape != out.shape:
        raise ValueError(f"snapshot statistics {full.shape} do not fit {out.shape}")
    out[:] = full


class OnlineClient:
    """One client of the online protocol: env copy, encoder, buffer, statistics, readout.

    Parameters
    ----------
    env_id : str
    encoder : HDEncoder
        Fitted; its dimension ``D`` sets the readout's shape (D, |A|).
    gamma, ridge : float
        Discount and penalty toward zero.
    proximal : float
        Pull toward the prior readout of :meth:`fit`, per admitted transition of the
        action (so its weight relative to the data stays fixed as the buffer grows).
    tail : int
        Of each episode that terminated, its last ``tail`` transitions enter the buffer
        first (within ``per_episode``): the failures of a good policy stay in the data.
    capacity : int
        Slots of the regression buffer (reservoir replacement once full).
    mc_mix, mc_window : float, int
        Mixed Monte-Carlo targets (Bellemare et al. 2016; Ostrovski et al. 2017): the
        target of every buffered transition from this client's last ``mc_window``
        episodes is ``(1 - mc_mix)`` times its Bellman target plus ``mc_mix`` times the
        discounted return the episode actually collected from it (its return-to-go,
        kept at collection; an episode cut by the time limit counts only the rewards it
        had). FQI's max over a fitted Q overestimates, and on a long task the error feeds
        itself round after round (LunarLander: Q of the start states 20-45 above the
        realised discounted return while the landings decline); the realised returns of
        the recent, nearly greedy episodes pull the values back to what the policy earns,
        where older episodes' returns would pull toward what older policies earned.
        0: plain Bellman targets.
    per_episode : int
        At most this many transitions of each episode enter the buffer.
    n_parallel : int
        Episodes run side by side by :func:`fedqhd.acting.collect_many`.
    seed : int
    dynamics : dict or None
        Physical parameters of this client's env copy (:func:`fedqhd.envs.make_env`).
    form : {"auto", "primal", "dual"}
        Sufficient statistics: primal Gram (D x D per action) or buffer kernel
        matrix (capacity x capacity); "auto" takes the smaller.
    update : {"fqi", "td"}
        How the client learns: "fqi" keeps a buffer and runs ridge FQI sweeps
        (:meth:`fit`); "td" learns at every step while it collects, by semi-gradient
        Q-learning with step ``td_rate`` (:func:`fedqhd.acting.collect_td`, the FedQHD
        paper's learner): no buffer (build it with ``capacity=0``), one episode at a time.
    td_rate : float
        The step of ``update="td"`` (features have norm about 1, so it is the fraction of
        the TD error corrected at the visited state).
    replay, replay_rate, replay_size : float, float, int
        ``update="td"``: after each episode, ``replay`` x its length further updates at
        step ``replay_rate`` on transitions drawn from the latest ``replay_size``
        (:mod:`fedqhd.replay`); 0: none.
    replay_start : int
        Replay begins after the client's first ``replay_start`` episodes (they are kept,
        and learnt from once as they happen).
    """

    def __init__(self, env_id: str, encoder: HDEncoder, *, gamma: float = 0.99,
                 ridge: float = 1.0, proximal: float = 0.01, tail: int = 0,
                 capacity: int = 20000,
                 mc_mix: float = 0.0, mc_window: int = 100,
                 per_episode: int = 50, n_parallel: int = 50, seed: int = 0,
                 dynamics: dict[str, float] | None = None, form: str = "auto",
                 update: str = "fqi", td_rate: float = 0.1, replay: float = 0.0,
                 replay_rate: float = 0.05, replay_size: int = 20000,
                 replay_start: int = 0) -> None:
        spec = get_spec(env_id)
        if update not in UPDATES:
            raise ValueError(f"update must be one of {', '.join(UPDATES)}, got {update!r}")
        if not (math.isfinite(td_rate) and 0 < td_rate <= 2):
            raise ValueError(f"td_rate must be in (0, 2], got {td_rate}")
        self.update, self.td_rate = update, float(td_rate)
        if not (math.isfinite(replay) and replay >= 0 and math.isfinite(replay_rate)
                and 0 < replay_rate <= 2):  # replay_size: checked by the ring it sizes
            raise ValueError(f"replay must be >= 0 and replay_rate in (0, 2]; got {replay}, "
                             f"{replay_rate}")
        if replay_start < 0:
            raise ValueError(f"replay_start must be >= 0 episodes, got {replay_start}")
        if replay and update != "td":
            raise ValueError("replay is a td client's (update='td'): an fqi client refits "
                             "on its whole buffer")
        self.replay, self.replay_rate = float(replay), float(replay_rate)
        self.replay_start = int(replay_start)
        self.env_id, self.encoder = env_id, encoder
        self.n_actions = spec.n_actions
        self.max_steps = spec.max_episode_steps
        self.gamma, self.ridge, self.proximal = float(gamma), float(ridge), float(proximal)
        self.mc_mix, self.mc_window = float(mc_mix), int(mc_window)
        if not 0.0 <= self.mc_mix <= 1.0 or self.mc_window < 1:
            raise ValueError(f"mc_mix must be in [0, 1] and mc_window >= 1; got "
                             f"mc_mix={mc_mix}, mc_window={mc_window}")
        self.tail = int(tail)
        self.dim = int(encoder.omega_.shape[1])
        self.capacity, self.per_episode = int(capacity), int(per_episode)
        if form == "auto":
            form = "primal" if self.dim <= self.capacity else "dual"
        if form not in ("primal", "dual"):
            raise ValueError(f"form must be auto, primal or dual, got {form!r}")
        self.form = form
        self.rng = online_client_rng(seed)
        self.env = make_batch_env(env_id, int(n_parallel), self.rng, dynamics)
        self.n_parallel = int(n_parallel)
        cap, dim = self.capacity, self.dim
        self.features = np.zeros((cap, dim), dtype=np.float32)
        self.next_features = np.zeros((cap, dim), dtype=np.float32)
        # the raw rows the features encode: what a rebuilt client re-encodes (snapshot())
        obs_dim = int(encoder.omega_.shape[0])
        self.states = np.zeros((cap, obs_dim), dtype=np.float32)
        self.next_states = np.zeros((cap, obs_dim), dtype=np.float32)
        self.actions = np.zeros(cap, dtype=np.int64)
        self.rewards = np.zeros(cap)
        self.continues = np.zeros(cap)
        # each row's discounted return-to-go in its episode, and that episode's number
        # (0-based over the client's episodes): the mixed Monte-Carlo targets (mc_mix)
        self.returns_to_go = np.zeros(cap)
        self.row_episode = np.zeros(cap, dtype=np.int64)
        self.size = 0          # filled slots
        self.seen = 0          # transitions offered to the buffer (reservoir counter)
        self.n_transitions = 0  # all transitions collected
        self.r_min, self.r_max = math.inf, -math.inf
        if form == "primal":
            self.gram = np.zeros((self.n_actions, dim, dim))
        else:
            self.kernel = np.zeros((cap, cap))
        self.readout = np.zeros((dim, self.n_actions))
        self.episode_returns: list[float] = []
        #: of the episodes of the last collection (:mod:`fedqhd.acting`) that appended:
        #: the value the collecting readout gave each start state (``max_a Q(s_0, a)``)
        #: and the discounted return the episode then realised from it (:meth:`value_bias`)
        self.start_values = np.zeros(0)
        self.start_returns = np.zeros(0)
        self.timer = NO_TIMER
        #: a td client's latest transitions, replayed after each episode (None: no replay)
        self.replay_ring = (ReplayRing(int(replay_size), obs_dim) if self.replay else None)

    # ----------------------------------------------------------------- buffer

    def append(self, states: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
               next_states: np.ndarray, terminated: np.ndarray,
               continues: np.ndarray | None = None,
               reward_range: tuple[float, float] | None = None, *,
               returns_to_go: np.ndarray | None = None,
               episodes: np.ndarray | None = None) -> None:
        """Offer transitions to the buffer (reservoir once full) and update the statistics.

        ``continues`` (default ``1 - terminated``) multiplies ``gamma * max Q(next)`` in
        the targets; ``reward_range`` (default: these ``rewards``' [min, max]) is that of
        the collection the transitions were drawn from (the buffer keeps a subsample).
        ``returns_to_go`` (each transition's discounted return in its episode) and
        ``episodes`` (the client's number of each one's episode)
        feed the mixed Monte-Carlo targets (``mc_mix``); without them the rows take
        their ``rewards`` and the latest episode's number."""
        actions = np.asarray(actions, dtype=np.int64)
        rewards = np.asarray(rewards, dtype=np.float64)
        n = len(actions)
        if n == 0:
            return
        lo, hi = ((float(rewards.min()), float(rewards.max())) if reward_range is None
                  else reward_range)
        self.r_min = min(self.r_min, lo)
        self.r_max = max(self.r_max, hi)
        if continues is None:
            continues = 1.0 - np.asarray(terminated, dtype=np.float64)
        # slot of each offered transition: fill free slots, then reservoir (-1: dropped)
        slots = np.full(n, -1)
        free = min(n, self.capacity - self.size)
        slots[:free] = np.arange(self.size, self.size + free)
        if free < n:
            counts = self.seen + free + 1 + np.arange(n - free)  # 1-based stream position
            draw = (self.rng.random(n - free) * counts).astype(np.int64)
            keep = draw < self.capacity
            slots[free:][keep] = draw[keep]
        self.seen += n
        # several offers to one slot in a batch: the last one wins
        order = np.flatnonzero(slots >= 0)[::-1]
        uniq, first = np.unique(slots[order], return_index=True)
        src = order[first]
        replaced = uniq[uniq < self.size]
        with self.timer("encode-buffer"):
            new_f = self.encoder.encode32(np.asarray(states)[src])
            new_nf = self.encoder.encode32(np.asarray(next_states)[src])
        with self.timer("statistics"):
            if self.form == "primal" and len(replaced):
                self._gram_add(self.features[replaced], self.actions[replaced], -1.0)
            self.features[uniq], self.next_features[uniq] = new_f, new_nf
            self.states[uniq] = np.asarray(states, dtype=np.float32)[src]
            self.next_states[uniq] = np.asarray(next_states, dtype=np.float32)[src]
            self.actions[uniq] = actions[src]
            self.rewards[uniq] = rewards[src]
            self.continues[uniq] = np.asarray(continues, dtype=np.float64)[src]
            self.returns_to_go[uniq] = (rewards if returns_to_go is None
                                        else np.asarray(returns_to_go, dtype=np.float64))[src]
            self.row_episode[uniq] = (max(len(self.episode_returns) - 1, 0) if episodes is None
                                      else np.asarray(episodes, dtype=np.int64)[src])
            self.size = max(self.size, int(uniq.max()) + 1) if len(uniq) else self.size
            if self.form == "primal":
                self._gram_add(new_f, actions[src], 1.0)
            else:
                rows = _row_products(self.features[uniq], self.features[:self.size])
                self.kernel[uniq, :self.size] = rows
                self.kernel[:self.size, uniq] = rows.T
                # the new rows' block among themselves: gemm need not give f_i.f_j and
                # f_j.f_i the same bits (it did not on CI's BLAS), so mirror one triangle
                block = rows[:, uniq]
                upper = np.triu(np.ones(block.shape, dtype=bool))
                self.kernel[np.ix_(uniq, uniq)] = np.where(upper, block, block.T)

    # ----------------------------------------------------------------- snapshot

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """What this client carries between rounds, as arrays and scalars: the buffer's raw
        rows, its counters, its statistics (the per-action Grams, or the buffer's kernel
        matrix), the readout, the episode returns and the RNG's bit-generator state
        (exploration, reservoir draws and env resets share it). The features are not in
        it: :meth:`restore` re-encodes the rows (bitwise the same float32 features).
        The statistics are kept rather than recomputed: the running ones were built by
        float32 rank updates and downdates, so a one-pass recomputation differs at ~1e-6
        relative (and costs seconds at D = 2000), where the copy is exact. They are
        packed exactly (:func:`pack_statistics`: upper triangles, the kernel in float32),
        less than half the bytes. Under Flower this lives in the node's ``context.state``
        (a node's messages may be served by different processes, and every message
        carries it there and back)."""
        n = self.size
        views = {"states": self.states[:n], "next-states": self.next_states[:n],
                 "actions": self.actions[:n], "rewards": self.rewards[:n],
                 "continues": self.continues[:n], "readout": self.readout,
                 "returns-to-go": self.returns_to_go[:n], "row-episode": self.row_episode[:n],
                 "episode-returns": np.asarray(self.episode_returns, dtype=np.float64)}
        arrays = {k: np.array(v) for k, v in views.items()}
        if self.replay_ring is not None:
            arrays.update(self.replay_ring.snapshot())
        arrays.update(pack_statistics(self.gram if self.form == "primal"
                                      else self.kernel[None, :n, :n],
                                      narrow=self.form == "dual"))
        scalars = {"size": n, "seen": self.seen, "n-transitions": self.n_transitions,
                   "r-min": self.r_min, "r-max": self.r_max, "gamma": self.gamma,
                   "rng": json.dumps(self.rng.bit_generator.state)}
        return arrays, scalars

    def restore(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any],
                buffer: bool = True, reuse: OnlineClient | None = None) -> None:
        """Become the client :meth:`snapshot` described (this one built with the same
        settings): rows re-encoded, statistics copied; the same numbers bit for bit.
        ``buffer=False``: counters, readout, returns and RNG only (``arrays`` needs only
        ``readout`` and ``episode-returns``), for a client that only acts and evaluates;
        its buffer stays empty, so it must not fit. ``reuse``: an earlier copy of this
        client (same encoder), whose features are taken for every slot whose raw row is
        bitwise the one restored (a stale copy differs by the rows appended or replaced
        since), so only those rows are encoded again. ``reuse=self``: this client is that
        earlier copy (not ahead of the snapshot), brought forward in place: no buffer is
        allocated or copied (a fresh client's 150 MB at D = 2000 cost more to allocate
        than to fill)."""
        n = int(scalars["size"])
        if arrays["readout"].shape != self.readout.shape:
            raise ValueError(f"snapshot readout {arrays['readout'].shape}, client readout "
                             f"{self.readout.shape}: built with other settings")
        if buffer and (arrays["states"].shape != (n, self.states.shape[1])
                       or n > self.capacity):
            raise ValueError(f"a snapshot of {arrays['states'].shape} rows does not fit a "
                             f"client of {self.capacity} slots and {self.states.shape[1]} "
                             f"observation dimensions (size {n})")
        self.seen = int(scalars["seen"])
        self.n_transitions = int(scalars["n-transitions"])
        self.r_min, self.r_max = float(scalars["r-min"]), float(scalars["r-max"])
        self.gamma = float(scalars["gamma"])
        self.rng.bit_generator.state = json.loads(str(scalars["rng"]))
        self.readout = np.array(arrays["readout"], dtype=np.float64)
        self.episode_returns = [float(r) for r in arrays["episode-returns"]]
        if not buffer:
            return
        if reuse is self and self.size > n:
            raise ValueError(f"an in-place restore goes forward: this copy holds {self.size} "
                             f"rows, the snapshot {n}")
        if self.replay_ring is not None:
            self.replay_ring.restore(arrays)
        # its filled slots (the rest was never encoded), if its features are ours to take
        k = 0 if reuse is None or reuse.features.shape[1] != self.dim else min(reuse.size, n)
        old = ((reuse.states[:k], reuse.next_states[:k]) if reuse is not None and k
               else (None, None))
        todo = _changed_rows(old[0], arrays["states"][:n])
        todo_next = _changed_rows(old[1], arrays["next-states"][:n])
        if reuse is not None and reuse is not self and k:
            self.features[:k], self.next_features[:k] = reuse.features[:k], reuse.next_features[:k]
        self.size = n
        self.states[:n], self.next_states[:n] = arrays["states"], arrays["next-states"]
        self.actions[:n] = arrays["actions"]
        self.rewards[:n], self.continues[:n] = arrays["rewards"], arrays["continues"]
        # a snapshot from before mixed Monte-Carlo targets: its rows count as old episodes
        self.returns_to_go[:n] = arrays.get("returns-to-go", arrays["rewards"])
        self.row_episode[:n] = arrays.get("row-episode", -(2**62))
        for rows, out, idx in ((self.states, self.features, todo),
                               (self.next_states, self.next_features, todo_next)):
            if len(idx) == n:
                out[:n] = self.encoder.encode32(rows[:n])
            elif len(idx):
                out[idx] = self.encoder.encode32(rows[idx])
        if self.form == "primal":
            unpack_statistics(arrays, self.gram)
        else:
            self.kernel[:] = 0.0
            unpack_statistics(arrays, self.kernel[None, :n, :n])

    def share_anchor_factor(self, other: OnlineClient) -> None:
        """Take ``other``'s cached factor of the anchor kernel (:meth:`compile`): ``other``
        is an earlier client of the same node (same encoder, hence the same factor bit
        for bit), so a client rebuilt from a snapshot need not factor it again."""
        key = getattr(other, "_anchor_key", None)
        if key is not None and other.dim == self.dim:
            self._anchor_factor: tuple[np.ndarray, bool] = other._anchor_factor
            self._anchor_key = key

    def _gram_add(self, feats: np.ndarray, actions: np.ndarray, sign: float) -> None:
        # float32 products (half the cost of float64), accumulated in float64
        for a in range(self.n_actions):
            x = np.ascontiguousarray(feats[actions == a], dtype=np.float32)
            if len(x):
                self.gram[a] += sign * (x.T @ x)

    # ----------------------------------------------------------------- fitting

    def targets(self, readout: np.ndarray,
                reward_range: tuple[float, float] | None = None) -> np.ndarray:
        """Bellman targets of the buffer under ``readout``, clipped to the value range of
        ``reward_range`` (default: this buffer's rewards' [min, max])."""
        n = self.size
        best = (self.next_features[:n] @ readout.astype(np.float32)).max(axis=1)
        lo, hi = (self.r_min, self.r_max) if reward_range is None else reward_range
        q_range = value_range(np.array([lo, hi]), self.gamma)
        y = bellman_targets(self.rewards[:n], self.continues[:n], best, self.gamma, q_range)
        if self.mc_mix > 0:
            recent = self.row_episode[:n] >= len(self.episode_returns) - self.mc_window
            g = np.clip(self.returns_to_go[:n][recent], *q_range)
            y[recent] = (1 - self.mc_mix) * y[recent] + self.mc_mix * g
        return y

    def value_bias(self) -> float:
        """Mean over the last collected episodes of the value the acting readout gave
        each start state minus the discounted return the episode realised from it: how
        far the policy's values are above (> 0) what it earns. A bias that grows round
        after round while returns do not is FQI's overestimation feeding itself (the
        max over a fitted Q); NaN before any appended collection. Episodes cut by the
        time limit count only the rewards they had, so on tasks that truncate (MountainCar,
        a hovering LunarLander) part of the bias is the missing tail."""
        if not len(self.start_values):
            return math.nan
        return float(np.mean(self.start_values - self.start_returns))

    def action_counts(self) -> np.ndarray:
        """Transitions per action in the buffer (the pooled oracle's proximal weights)."""
        return np.bincount(self.actions[:self.size], minlength=self.n_actions)

    def _onehot(self) -> np.ndarray:
        """``(size, |A|)`` float32 indicator of each buffered transition's action."""
        onehot = np.zeros((self.size, self.n_actions), dtype=np.float32)
        onehot[np.arange(self.size), self.actions[:self.size]] = 1.0
        return onehot

    def pooled_rhs(self, readout: np.ndarray, reward_range: tuple[float, float]
                   ) -> np.ndarray:
        """``Phi_a^T y_a`` per action ``(D, |A|)`` of this buffer for the targets of
        ``readout`` kept in the value range of the pooled rewards' ``reward_range``: this
        client's share of one pooled sweep (the app's ``strategy = "pooled"``, which
        sends only this and the Gram, never the rows)."""
        return primal_rhs(self.features[:self.size], self._onehot(),
                          self.targets(readout, reward_range))

    def fit(self, sweeps: int, init: np.ndarray | None = None,
            prior: np.ndarray | None = None) -> np.ndarray:
        """``sweeps`` FQI sweeps from ``init`` (default: current readout), each pulled
        toward ``prior`` (default: ``init``) by the proximal term. Sets and returns
        the readout."""
        readout = self.readout if init is None else np.array(init, dtype=np.float64)
        prior = readout.copy() if prior is None else np.asarray(prior, dtype=np.float64)
        if self.size == 0 or sweeps <= 0:
            self.readout = readout
            return readout
        n = self.size
        acts = self.actions[:n]
        rows = [np.flatnonzero(acts == a) for a in range(self.n_actions)]
        with self.timer("factor"):
            systems: list[tuple[float, float, Any]] = []
            if self.form == "primal":
                systems.extend(self.primal_systems())
            else:
                for a in range(self.n_actions):
                    mu = self.proximal * len(rows[a])
                    c = self.ridge + mu
                    g = self.kernel[np.ix_(rows[a], rows[a])]
                    g[np.diag_indices_from(g)] += c
                    systems.append((mu, c, cho_factor(g, lower=True, check_finite=False)
                                    if len(g) else None))
        with self.timer("sweeps"):
            onehot = self._onehot()
            feats = self.features[:n]
            # dual: each action's rows gathered once, not once a sweep (40 MB at D = 5000)
            by_action = [feats[r] for r in rows] if self.form != "primal" else []
            for _ in range(sweeps):
                y = self.targets(readout)
                new = np.empty_like(readout)
                if self.form == "primal":
                    rhs = primal_rhs(feats, onehot, y)
                for a, (mu, c, fac) in enumerate(systems):
                    shrunk = (mu / c) * prior[:, a]
                    if fac is None:
                        new[:, a] = shrunk
                    elif self.form == "primal":
                        new[:, a] = proximal_solve((mu, c, fac), rhs[:, a], prior[:, a])
                    else:
                        fa = by_action[a]
                        resid = y[rows[a]] - fa @ shrunk.astype(np.float32)
                        alpha = cho_solve(fac, resid, check_finite=False)
                        new[:, a] = shrunk + fa.T @ alpha.astype(np.float32)
                readout = new
        self.readout = readout
        return readout

    def primal_systems(self) -> list[PrimalSystem]:
        """Each action's factored system ``G_a + (ridge + proximal n_a) I`` (primal form)."""
        counts = self.action_counts()
        return [primal_system(self.gram[a], self.ridge, self.proximal * int(counts[a]))
                for a in range(self.n_actions)]

    # ----------------------------------------------------------------- acting and federation

    def encode(self, states: np.ndarray) -> np.ndarray:
        """``states`` in this client's float32 features, as it fits and acts with them
        (anchor features must be these, or a compiled teacher differs from the bench's)."""
        return self.encoder.encode32(states)

    def q_values(self, states: np.ndarray) -> np.ndarray:
        return self.encode(states).astype(np.float64) @ self.readout

    def compile(self, anchor_features: np.ndarray, teacher: np.ndarray, ridge: float,
                toward_own: bool = True) -> float:
        """Ridge projection of ``teacher`` (Q on anchors) onto this client's features:
        ``argmin ||X W - T||^2 + ridge ||W - W0||^2`` with ``W0`` the current readout
        (``toward_own``) or zero. Returns the residual ``||X W - T||_F``."""
        x = anchor_features.astype(np.float64)
        w0 = self.readout if toward_own else np.zeros_like(self.readout)
        # factor once per anchor set: the key holds the array itself, not its id(), which
        # a new array may reuse once the old one is freed
        key = getattr(self, "_anchor_key", None)
        if key is None or key[0] is not anchor_features or key[1] != float(ridge):
            k = x @ x.T
            k[np.diag_indices_from(k)] += ridge
            self._anchor_factor = cho_factor(k, lower=True)
            self._anchor_key = (anchor_features, float(ridge))
        resid = teacher - x @ w0
        self.readout = w0 + x.T @ cho_solve(self._anchor_factor, resid)
        return float(np.linalg.norm(x @ self.readout - teacher))


# --------------------------------------------------------------------------- federation


def _changed_rows(old: np.ndarray | None, new: np.ndarray) -> np.ndarray:
    """Indices of the rows of ``new`` that are not bitwise the row of ``old`` at the same
    slot (all of them past ``old``'s length; ``old`` None: every row)."""
    m = 0 if old is None else min(len(old), len(new))
    if old is None or m == 0:
        return np.arange(len(new))
    same = np.all(old[:m].view(np.uint32) == new[:m].view(np.uint32), axis=1)
    return np.concatenate([np.flatnonzero(~same), np.arange(m, len(new))])


def primal_rhs(features: np.ndarray, onehot: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``Phi^T y`` per action (float32 products accumulated as float64). Computed as
    ``((onehot y)^T Phi)^T``: the same bits as ``Phi^T (onehot y)`` and ~20 % faster
    (the long axis of ``Phi`` is read in order; BENCHMARKS.md, "Thirteenth round")."""
    return ((onehot * y[:, None].astype(np.float32)).T @ features).T.astype(np.float64)


def default_capacity(dim: int) -> int:
    """Buffer slots of a client with ``dim`` features: ``min(20000, 1e7 // dim)``."""
    return int(min(20000, 1e7 // dim))
