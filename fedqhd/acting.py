"""How online clients act: epsilon-greedy episodes of many clients in one vectorised loop
(:func:`collect_many`), and what an episode gives a client's buffer: its transitions
subsampled per episode and their returns-to-go. The client that learns
from them is :class:`fedqhd.online.OnlineClient`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedqhd.envs.batch import GymBatch
from fedqhd.online import NO_TIMER, OnlineClient, Timer
from fedqhd.replay import replay

__all__ = ["collect", "collect_many", "collect_td", "epsilon_schedule", "returns_to_go"]


def epsilon_schedule(start: float = 1.0, decay: float = 0.97, floor: float = 0.01
                     ) -> Callable[[np.ndarray], np.ndarray]:
    """``episode -> max(floor, start * decay**episode)`` (episodes counted per client)."""

    def schedule(episode: np.ndarray) -> np.ndarray:
        return np.maximum(floor, start * decay ** np.asarray(episode, dtype=float))
    return schedule


def collect(client: OnlineClient, n_episodes: int, epsilon: float | np.ndarray,
            append: bool = True) -> np.ndarray:
    """Run ``n_episodes`` episodes of ``client``'s epsilon-greedy policy (``n_parallel``
    side by side); returns their returns and (``append``) offers their transitions to its
    buffer."""
    return collect_many([client], [n_episodes], [epsilon], append=append)[0]


def collect_many(clients: Sequence[OnlineClient], n_episodes: Sequence[int],
                 epsilons: Sequence[float | np.ndarray], append: bool = True,
                 timer: Timer = NO_TIMER) -> list[np.ndarray]:
    """Run every client's episodes in one vectorised loop (clients sharing an encoder
    object are encoded together). ``epsilons[c]`` is one value or one per episode.

    Each client keeps ``n_parallel`` episodes running; a finished slot starts the
    client's next pending episode. Episodes end at termination or at the time limit
    (truncation: its transitions keep bootstrapping). Returns each client's episode
    returns in episode order and, with ``append``, records them in
    ``client.episode_returns`` and offers the transitions to the buffers.
    """
    n_cl = len(clients)
    eps = [np.broadcast_to(np.asarray(e, dtype=float), (int(n),)).copy()
           for e, n in zip(epsilons, n_episodes, strict=True)]
    if any(cl.update == "td" for cl in clients):
        if not append:
            raise ValueError("a td client learns while it collects: append=False would "
                             "have it act without learning, which no caller needs")
        return [collect_td(cl, int(n), e, timer)
                for cl, n, e in zip(clients, n_episodes, eps, strict=True)]
    returns = [np.zeros(int(n)) for n in n_episodes]
    st: list[dict[str, Any]] = []
    for c, cl in enumerate(clients):
        b = min(cl.n_parallel, int(n_episodes[c]))
        idx = np.arange(b)
        st.append({
            "b": b, "episode": idx.copy(), "next": b, "t": np.zeros(b, dtype=np.int64),
            "active": np.ones(b, dtype=bool),
            "obs": cl.env.reset(idx) if b else np.zeros((0, 1), np.float32),
            "rec": [],
        })
    groups: dict[int, list[int]] = defaultdict(list)
    for c, cl in enumerate(clients):
        groups[id(cl.encoder)].append(c)
    readouts = [cl.readout.astype(np.float32) for cl in clients]  # fixed while they act
    while any(s["active"].any() for s in st):
        with timer("act"):
            actions: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * n_cl
            for members in groups.values():
                live = [c for c in members if st[c]["active"].any()]
                if not live:
                    continue
                feats = clients[live[0]].encoder.encode32(
                                  np.concatenate([st[c]["obs"] for c in live]))
                off = 0
                for c in live:
                    s, cl = st[c], clients[c]
                    b = s["b"]
                    q = feats[off:off + b] @ readouts[c]
                    off += b
                    act = q.argmax(axis=1)
                    explore = cl.rng.random(b) < eps[c][np.minimum(s["episode"],
                                                                   len(eps[c]) - 1)]
                    act[explore] = cl.rng.integers(cl.n_actions, size=int(explore.sum()))
                    actions[c] = act
        for c, cl in enumerate(clients):
            s = st[c]
            if not s["active"].any():
                continue
            with timer("env"):
                b = s["b"]
                padded = np.zeros(cl.n_parallel, dtype=np.int64)
                padded[:b] = actions[c]
                if isinstance(cl.env, GymBatch):
                    mask = np.zeros(cl.n_parallel, dtype=bool)
                    mask[:b] = s["active"]
                    nobs, rew, term = cl.env.step(padded, mask)
                else:
                    nobs, rew, term = cl.env.step(padded)
                nobs, rew, term = nobs[:b], rew[:b], term[:b]
            with timer("bookkeeping"):
                s["t"] += 1
                act_mask = s["active"]
                ep = s["episode"]
                np.add.at(returns[c], ep[act_mask], rew[act_mask])
                if append:
                    s["rec"].append((ep[act_mask], s["obs"][act_mask], actions[c][act_mask],
                                     rew[act_mask], nobs[act_mask], term[act_mask]))
                done = act_mask & (term | (s["t"] >= cl.max_steps))
                s["obs"] = nobs
                if done.any():
                    ended = np.flatnonzero(done)
                    n_new = min(len(ended), int(n_episodes[c]) - s["next"])
                    restart = ended[:n_new]
                    s["active"][ended[n_new:]] = False
                    if n_new < len(ended) and not isinstance(cl.env, GymBatch):
                        cl.env.reset(ended[n_new:])  # idle slots: keep their state bounded
                    if n_new:
                        s["episode"][restart] = s["next"] + np.arange(n_new)
                        s["next"] += n_new
                        s["t"][restart] = 0
                        s["obs"] = nobs.copy()
                        s["obs"][restart] = cl.env.reset(restart)
    if append:
        for c, cl in enumerate(clients):
            _offer(cl, st[c]["rec"], returns[c], int(n_episodes[c]), timer)
    return returns


def collect_td(cl: OnlineClient, n_episodes: int, epsilon: np.ndarray,
               timer: Timer = NO_TIMER) -> np.ndarray:
    """Run ``n_episodes`` episodes one after another, learning at every step (``update =
    "td"``, the FedQHD paper's learner): semi-gradient Q-learning on the client's features,
    ``w_a += td_rate * (r + gamma max_b Q(s', b) - Q(s, a)) phi(s)`` after each step, with
    ``epsilon[e]`` of episode ``e``. Truncation bootstraps, termination does not. The
    readout changes (the buffer stays empty; a client with ``replay`` keeps its latest
    transitions raw and, from its ``replay_start``-th episode on, replays some after each
    episode, :func:`fedqhd.replay.replay`).
    Returns the episode returns and records them, their start values and realised
    discounted returns (:meth:`~fedqhd.online.OnlineClient.value_bias`) and the
    transitions' count.

    The readout is worked on as rows per action, in float64, and the float32 features
    are widened once per step (a float32-by-float64 product widens on every call)."""
    if cl.n_parallel != 1:
        raise ValueError(f"a td client runs one episode at a time, got n_parallel "
                         f"{cl.n_parallel}")
    rate, gamma, ring = cl.td_rate, cl.gamma, cl.replay_ring
    w = np.ascontiguousarray(cl.readout.T)  # (|A|, D): one contiguous row per action
    step = _one_env_step(cl.env)
    slot = np.zeros(1, dtype=np.int64)
    returns, starts, realised = np.zeros(n_episodes), np.zeros(n_episodes), np.zeros(n_episodes)
    steps = 0
    with timer("act-and-learn"):  # one section: a timer per step would cost 5 % of it
        for e in range(n_episodes):
            state = cl.env.reset(slot)
            phi = cl.encode(state)[0].astype(np.float64)
            state, first = np.array(state[0]), steps
            q = w @ phi
            starts[e] = q.max()
            discount = 1.0
            for _ in range(cl.max_steps):
                a = (int(cl.rng.integers(cl.n_actions)) if cl.rng.random() < epsilon[e]
                     else int(q.argmax()))
                obs, r, terminated = step(a)
                returns[e] += r
                realised[e] += discount * r
                discount *= gamma
                steps += 1
                if ring is not None:
                    ring.add(state, a, r, obs, terminated)
                next_phi = cl.encode(obs[None])[0].astype(np.float64)
                next_q = w @ next_phi
                target = r if terminated else r + gamma * float(next_q.max())
                change = rate * (target - q[a])
                w[a] += change * phi
                next_q[a] += change * float(phi @ next_phi)  # Q(s', a) under the new w
                if terminated:
                    break
                phi, q = next_phi, next_q
                if ring is not None:  # a batch env may step its observation in place
                    state = np.array(obs)
            if ring is not None and len(cl.episode_returns) + e >= cl.replay_start:
                replay(w, ring, cl.encode, cl.rng, int(cl.replay * (steps - first)),
                       cl.replay_rate, gamma)
    cl.readout = np.ascontiguousarray(w.T)
    cl.episode_returns.extend(returns.tolist())
    cl.start_values, cl.start_returns = starts, realised
    cl.n_transitions += steps
    return returns


def _one_env_step(env: Any) -> Callable[[int], tuple[np.ndarray, float, bool]]:
    """``action -> (next observation, reward, terminated)`` of a one-slot batch env: a
    gymnasium env is stepped directly (its batch wrapper's bookkeeping costs as much as
    Box2D's step), a numpy stepper by its scalar ``step_one`` where it has one."""
    if hasattr(env, "step_one"):
        return env.step_one
    if isinstance(env, GymBatch):
        inner = env.envs[0]

        def gym_step(action: int) -> tuple[np.ndarray, float, bool]:
            obs, r, terminated, _, _ = inner.step(action)
            return np.asarray(obs, dtype=np.float32).reshape(-1), float(r), bool(terminated)
        return gym_step

    def batch_step(action: int) -> tuple[np.ndarray, float, bool]:
        obs, r, terminated = env.step(np.array([action]))
        return obs[0], float(r[0]), bool(terminated[0])
    return batch_step


def _offer(cl: OnlineClient, records: list[tuple[np.ndarray, ...]], returns: np.ndarray,
           n_episodes: int, timer: Timer) -> None:
    """Record a client's collected episodes: their returns, the start values they began
    from, and their transitions offered to its buffer (per-episode quota)."""
    cl.episode_returns.extend(returns.tolist())
    if not records:
        return
    with timer("bookkeeping"):
        ep, s0, a, r, s1, te = (np.concatenate(z) for z in zip(*records, strict=True))
        keep = _per_episode_subsample(ep, cl.per_episode, cl.rng, te, cl.tail)
        cl.n_transitions += len(ep)
        r_range = (float(r.min()), float(r.max()))
        to_go = returns_to_go(ep, r, cl.gamma)
        first = len(cl.episode_returns) - n_episodes  # its first episode
        # each episode's first transition is its start (records are in time order)
        _, start = np.unique(ep, return_index=True)
        cl.start_values = cl.q_values(s0[start]).max(axis=1)
        cl.start_returns = to_go[start]
    prev, cl.timer = cl.timer, timer
    try:
        cl.append(s0[keep], a[keep], r[keep], s1[keep], te[keep], reward_range=r_range,
                  returns_to_go=to_go[keep], episodes=first + ep[keep])
    finally:
        cl.timer = prev


def returns_to_go(episode: np.ndarray, rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``sum_{j >= 0} gamma^j r_{t+j}`` to the end of its episode, for every transition of
    time-ordered ``episode`` labels (each episode's transitions in time order).

    The recursion ``G_t = r_t + gamma G_{t+1}`` from each episode's end, every episode at
    once (one step of all of them per pass): the same bits as filtering each reversed
    episode with ``scipy.signal.lfilter([1], [1, -gamma])``, without importing
    ``scipy.signal`` (0.3 s in every ClientApp process)."""
    order = np.argsort(episode, kind="stable")
    ep, r = episode[order], np.asarray(rewards, dtype=np.float64)[order]
    ends = np.r_[np.flatnonzero(np.diff(ep)), len(ep) - 1]
    to_end = np.repeat(ends, np.diff(np.r_[-1, ends])) - np.arange(len(ep))
    by_step = np.argsort(to_end, kind="stable")  # rows 0 steps from their end, then 1, ...
    counts = np.bincount(to_end) if len(ep) else np.zeros(0, dtype=np.int64)
    out = np.empty(len(ep))
    lo = 0
    for k, n in enumerate(counts.tolist()):
        rows = by_step[lo:lo + n]
        out[rows] = r[rows] if k == 0 else r[rows] + gamma * out[rows + 1]
        lo += n
    result = np.empty_like(out)
    result[order] = out
    return result


def _per_episode_subsample(episode: np.ndarray, quota: int, rng: np.random.Generator,
                           terminated: np.ndarray | None = None, tail: int = 0
                           ) -> np.ndarray:
    """Indices keeping at most ``quota`` transitions of each episode (``episode``: labels,
    each episode's transitions in time order): the last ``tail`` transitions of every
    episode that terminated (``terminated`` marks its last transition), the rest drawn
    uniformly. Failures are rare once the policy is good; a uniform draw of 20 of a
    300-step episode keeps its terminal transition with probability 0.07."""
    key = rng.random(len(episode))
    if tail > 0 and terminated is not None and terminated.any():
        order = np.argsort(episode, kind="stable")
        ep_sorted = episode[order]
        ends = np.r_[np.flatnonzero(np.diff(ep_sorted)), len(order) - 1]
        length = np.diff(np.r_[-1, ends])
        to_end = np.repeat(ends, length) - np.arange(len(order))
        failed = np.repeat(terminated[order][ends], length)
        key[order[failed & (to_end < tail)]] -= 1.0  # drawn first
    order = np.lexsort((key, episode))
    ep_sorted = episode[order]
    starts = np.r_[0, np.flatnonzero(np.diff(ep_sorted)) + 1]
    rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    return np.sort(order[rank < quota])
