"""The FedQHD paper's deep baselines: FedAvg-DQN and distillation FedDQN.

The Flower-free numeric core of :mod:`fedqhd.learners.dqn` (its ClientApp drives
:class:`DQNClients` with ``n_clients=1`` through :meth:`~DQNClients.get_parameters`,
:meth:`~DQNClients.set_parameters`, :meth:`~DQNClients.collect_and_train`,
:meth:`~DQNClients.q_values` and :meth:`~DQNClients.distill`, and carry it between
messages with :meth:`~DQNClients.snapshot` / :meth:`~DQNClients.restore`;
``fedqhd.learners.dqn`` does).

Protocol (the paper's online setting): every client runs epsilon-greedy
episodes of its current network in its own env copy, stores the transitions in
its own replay buffer and takes one Adam step on a random minibatch after every
env step. Every ``aggregate_every`` episodes the server

* FedAvg-DQN: averages the network parameters (uniform or by transitions) and
  sends the mean back (each client keeps its own Adam state; its target network
  is reset to the mean);
* distillation FedDQN: averages the clients' Q-values on fixed anchor states
  (the teacher) and each client takes ``distill_steps`` Adam steps of
  ``KL(softmax(teacher / tau) || softmax(Q / tau))`` on the anchors. Clients
  keep their own networks, which may differ in hidden widths.

Implementation: JAX + optax (the optional ``dqn`` extra), imported lazily. The
clients of one process are vectorised: their parameters are stacked on a
leading client axis and one jitted call per env step trains all of them and
returns their next greedy actions (``jax.vmap``), while their envs step
together. Clients with different hidden widths share one padded network whose
unused units are masked to zero: a masked unit has zero activation and zero
gradient (so Adam never moves it), which makes the padded network compute
exactly the narrower one. :meth:`DQNClients.get_parameters` returns the
unpadded arrays.

TD target: ``r + gamma * (1 - terminated) * max_a Q_target(s', a)``; a time-limit
truncation bootstraps (the paper's code stops at any ``done``). Loss: Huber.
Target network: hard copy of the online network every ``target_update``
gradient steps (default 500) and after every FedAvg aggregation.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

from fedqhd.envs import get_spec, make_env
from fedqhd.seeding import dqn_batch_rng, dqn_client_rngs, dqn_init_rng

__all__ = [
    "DQNClients",
    "DISTILL_SETTINGS",
    "DQN_SETTINGS",
    "HETERO_WIDTHS",
    "PAPER_HIDDEN",
    "distill_hidden",
    "initial_network",
    "initial_networks",
    "mlp_q",
    "network_shapes",
    "offline_train",
]

#: the paper's MLP: state-128-256-|A|
PAPER_HIDDEN: tuple[int, int] = (128, 256)
#: the paper's FedAvg-DQN protocol settings, as :class:`DQNClients` defaults to them:
#: discount, episodes between aggregations and epsilon = (start, decay per episode,
#: floor); the Flower app's ``learner = "dqn"`` takes them under ``preset =
#: "auto"``
DQN_SETTINGS: dict[str, Any] = dict(gamma=0.99, episodes_per_round=25,
                                    epsilon=(1.0, 0.995, 0.001))
#: hidden widths cycled over clients in the heterogeneous distillation setting
#: (none wider than the shared (128, 256), so padding costs no extra compute)
HETERO_WIDTHS: tuple[tuple[int, int], ...] = ((128, 256), (64, 128), (96, 192), (128, 128),
                                              (48, 96))
#: the paper's distillation settings: anchor states, softmax temperature, Adam steps per
#: round; the Flower app takes them (its ``num-anchors`` under ``preset = "auto"``)
DISTILL_SETTINGS: dict[str, Any] = dict(n_anchors=200, tau=1.0, distill_steps=10)
#: distillation settings ("shared": one architecture; "heterogeneous": widths cycled)
DISTILL_SETTINGS_KINDS: tuple[str, ...] = ("shared", "heterogeneous")


def distill_hidden(setting: str, client: int,
                   hetero_widths: Sequence[Sequence[int]] = HETERO_WIDTHS) -> tuple[int, int]:
    """Hidden widths of distillation client ``client``: the paper's (128, 256) in the
    shared setting, ``hetero_widths`` cycled over clients in the heterogeneous one."""
    if setting == "shared":
        return PAPER_HIDDEN
    if setting == "heterogeneous":
        h1, h2 = hetero_widths[client % len(hetero_widths)]
        return int(h1), int(h2)
    raise ValueError(f"setting must be one of {DISTILL_SETTINGS_KINDS}, got {setting!r}")


def _require_jax():
    try:
        import jax
        import jax.numpy as jnp
        import optax
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "fedqhd.baselines.dqn needs JAX and optax; install the optional extra: "
            "pip install 'fedqhd[dqn]'"
        ) from exc
    return jax, jnp, optax


@functools.cache
def _kernels(lr: float, gamma: float):
    """Jitted functions over stacked clients (built once per (lr, gamma))."""
    jax, jnp, optax = _require_jax()
    tx = optax.adam(lr)

    def q_one(p, m, x):
        w1, b1, w2, b2, w3, b3 = p
        m1, m2 = m
        h = jax.nn.relu(x @ w1 + b1) * m1
        h = jax.nn.relu(h @ w2 + b2) * m2
        return h @ w3 + b3

    def td_loss(p, tp, m, s, a, r, s2, term):
        q = jnp.take_along_axis(q_one(p, m, s), a[:, None], axis=1)[:, 0]
        y = r + gamma * (1.0 - term) * q_one(tp, m, s2).max(axis=1)
        return optax.huber_loss(q, jax.lax.stop_gradient(y)).mean()

    def where(c, new, old):
        return jax.tree_util.tree_map(lambda a, b: jnp.where(c, a, b), new, old)

    def td_step(p, tp, opt, m, s, a, r, s2, term):
        """THE gradient step of both protocols: one Adam step on the minibatch's Huber
        TD loss against the target network ``tp``."""
        loss, g = jax.value_and_grad(td_loss)(p, tp, m, s, a, r, s2, term)
        upd, opt_new = tx.update(g, opt, p)
        return optax.apply_updates(p, upd), opt_new, loss

    def train_one(p, tp, opt, m, s, a, r, s2, term, do_train, do_sync, obs):
        p_new, opt_new, loss = td_step(p, tp, opt, m, s, a, r, s2, term)
        p = where(do_train, p_new, p)
        opt = where(do_train, opt_new, opt)
        tp = where(do_sync, p, tp)
        greedy = jnp.argmax(q_one(p, m, obs[None, :])[0])
        return p, tp, opt, loss, greedy

    def offline_one(p, tp, opt, m, s, a, r, s2, term, target_update):
        """``len(s)`` TD steps, one per minibatch (leading axis), the target network
        hard-copied after every ``target_update``-th step (the online rule)."""
        def body(carry, batch):
            p, tp, opt, k = carry
            p, opt, loss = td_step(p, tp, opt, m, *batch)
            k = k + 1
            tp = where(k % target_update == 0, p, tp)
            return (p, tp, opt, k), loss

        (p, tp, opt, _), losses = jax.lax.scan(body, (p, tp, opt, 0), (s, a, r, s2, term))
        return p, opt, losses

    def kl_one(p, m, x, teacher, tau):
        log_q = jax.nn.log_softmax(q_one(p, m, x) / tau, axis=1)
        log_t = jax.nn.log_softmax(teacher / tau, axis=1)
        return (jnp.exp(log_t) * (log_t - log_q)).sum(axis=1).mean()

    def distill_one(p, opt, m, x, teacher, tau, steps):
        def body(carry, _):
            p, opt = carry
            kl, g = jax.value_and_grad(kl_one)(p, m, x, teacher, tau)
            upd, opt = tx.update(g, opt, p)
            return (optax.apply_updates(p, upd), opt), kl

        (p, opt), kls = jax.lax.scan(body, (p, opt), None, length=steps)
        return p, opt, kls[0], kl_one(p, m, x, teacher, tau)

    return SimpleNamespace(
        tx=tx,
        step=jax.jit(jax.vmap(train_one)),
        offline=jax.jit(offline_one),
        greedy=jax.jit(jax.vmap(lambda p, m, o: jnp.argmax(q_one(p, m, o[None, :])[0]))),
        q=jax.jit(jax.vmap(q_one, in_axes=(0, 0, None))),
        kl=jax.jit(jax.vmap(kl_one, in_axes=(0, 0, None, 0, None))),
        distill=jax.jit(jax.vmap(distill_one, in_axes=(0, 0, 0, None, 0, None, None)),
                        static_argnums=(6,)),
    )


def _init_mlp(rng: np.random.Generator, sizes: Sequence[int]) -> list[np.ndarray]:
    """PyTorch-style init: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        k = 1.0 / np.sqrt(fan_in)
        out.append(rng.uniform(-k, k, size=(fan_in, fan_out)).astype(np.float32))
        out.append(rng.uniform(-k, k, size=fan_out).astype(np.float32))
    return out


def network_shapes(obs_dim: int, n_actions: int, hidden: Sequence[int] = PAPER_HIDDEN
                   ) -> list[tuple[int, ...]]:
    """Shapes of the MLP's arrays W1, b1, W2, b2, W3, b3."""
    h1, h2 = (int(h) for h in hidden)
    return [(obs_dim, h1), (h1,), (h1, h2), (h2,), (h2, n_actions), (n_actions,)]


def initial_networks(env_id: str, seed: int, hidden: Sequence[Sequence[int]],
                     same_init: bool = False) -> list[list[np.ndarray]]:
    """The initial networks of clients 0, 1, ... of widths ``hidden`` (one pair each), as
    :class:`DQNClients` draws them without JAX: one after the other from
    :func:`fedqhd.seeding.dqn_init_rng` (a node holding client ``i`` alone draws the ``i``
    before it and keeps the last), or all the first one (``same_init``)."""
    spec = get_spec(env_id)
    shared = dqn_init_rng(seed)
    return [_init_mlp(dqn_init_rng(seed) if same_init else shared,
                      (spec.obs_dim, *(int(h) for h in pair), spec.n_actions))
            for pair in hidden]


def initial_network(env_id: str, seed: int, hidden: Sequence[int] = PAPER_HIDDEN
                    ) -> list[np.ndarray]:
    """The network every FedAvg-DQN client starts from (``same_init``): drawn from
    :func:`fedqhd.seeding.dqn_init_rng`, without JAX."""
    return initial_networks(env_id, seed, [hidden])[0]


def mlp_q(params: Sequence[np.ndarray], states: np.ndarray) -> np.ndarray:
    """Q of the MLP ``params`` (W1, b1, W2, b2, W3, b3) at ``states`` (one state or a
    batch), in float64 numpy: evaluation without JAX."""
    w1, b1, w2, b2, w3, b3 = (np.asarray(a, np.float64) for a in params)
    h = np.maximum(np.asarray(states, np.float64) @ w1 + b1, 0.0)
    h = np.maximum(h @ w2 + b2, 0.0)
    return h @ w3 + b3


def offline_train(params: Sequence[np.ndarray], data: Sequence[np.ndarray], steps: int,
                  rng: np.random.Generator, gamma: float = 0.99, lr: float = 1e-3,
                  batch_size: int = 64, target_update: int = 500
                  ) -> tuple[list[np.ndarray], np.ndarray]:
    """``steps`` DQN steps on a fixed set of transitions: offline FedAvg-DQN's client update.

    The transitions ``data`` = (states, actions, rewards, next states, terminated) are the
    replay buffer; each step is the online protocol's gradient step (the same jitted
    ``td_step``: Huber loss of ``r + gamma (1 - terminated) max_a Q_target(s', a)``, one
    Adam step, learning rate ``lr``) on ``batch_size`` transitions drawn uniformly with
    replacement by ``rng``. The target network starts as ``params`` and is copied from the
    online network every ``target_update`` steps. Adam starts fresh (a FedAvg client keeps
    no optimiser state between rounds). Returns the new network (float32 arrays of
    ``params``' shapes) and the TD loss of every step (before it).
    """
    jax, jnp, _ = _require_jax()
    k = _kernels(float(lr), float(gamma))
    s, a, r, s2, term = (np.asarray(x) for x in data)
    n = len(a)
    if n == 0 or steps < 1:
        raise ValueError(f"offline_train needs transitions and steps >= 1, got {n} "
                         f"transitions and {steps} steps")
    idx = rng.integers(n, size=(int(steps), int(batch_size)))
    p = tuple(jnp.asarray(np.asarray(x, np.float32)) for x in params)
    masks = (jnp.ones(p[1].shape, jnp.float32), jnp.ones(p[3].shape, jnp.float32))
    p, _, losses = k.offline(p, p, k.tx.init(p), masks, s[idx].astype(np.float32),
                             a[idx].astype(np.int32), r[idx].astype(np.float32),
                             s2[idx].astype(np.float32), term[idx].astype(np.float32),
                             int(target_update))
    return [np.asarray(x) for x in p], np.asarray(losses)


class _Replay:
    """Per-client ring buffers in numpy, shape (n_clients, capacity, ...)."""

    def __init__(self, n: int, capacity: int, obs_dim: int):
        self.capacity = capacity
        self.s = np.zeros((n, capacity, obs_dim), np.float32)
        self.s2 = np.zeros((n, capacity, obs_dim), np.float32)
        self.a = np.zeros((n, capacity), np.int32)
        self.r = np.zeros((n, capacity), np.float32)
        self.term = np.zeros((n, capacity), np.float32)
        self.ptr = np.zeros(n, np.int64)
        self.size = np.zeros(n, np.int64)

    def add(self, i: int, s, a, r, s2, term) -> None:
        k = self.ptr[i]
        self.s[i, k], self.a[i, k], self.r[i, k], self.s2[i, k], self.term[i, k] = s, a, r, s2, term
        self.ptr[i] = (k + 1) % self.capacity
        self.size[i] = min(self.size[i] + 1, self.capacity)

    def sample(self, rng: np.random.Generator | Sequence[np.random.Generator], batch: int,
               active: np.ndarray):
        """A minibatch per client: from one stream for all (``rng``), or from client
        ``i``'s own stream ``rng[i]``, drawn only while it is ``active`` (as a node alone
        draws); an inactive client's rows are unused."""
        n = len(self.size)
        span = np.maximum(self.size, 1)
        if isinstance(rng, np.random.Generator):
            idx = (rng.random((n, batch)) * span[:, None]).astype(np.int64)
        else:
            idx = np.zeros((n, batch), np.int64)
            for i in np.flatnonzero(active).tolist():
                idx[i] = (rng[i].random(batch) * span[i]).astype(np.int64)
        rows = np.arange(n)[:, None]
        return self.s[rows, idx], self.a[rows, idx], self.r[rows, idx], self.s2[rows, idx], \
            self.term[rows, idx]


class DQNClients:
    """``n_clients`` DQN learners, each with its own env copy, replay and epsilon.

    Parameters
    ----------
    env_id : str
        One of :data:`fedqhd.envs.ENV_IDS`.
    n_clients : int
        Number of clients held (vectorised); a Flower client holds 1.
    seed : int
        Seeds network init, env resets, exploration and minibatches; client ``i``
        of ``DQNClients(seed=s)`` draws from :func:`fedqhd.seeding.dqn_client_rngs`.
    hidden : (int, int) or sequence of (int, int)
        Hidden widths, one pair for all clients or one per client
        (default: the paper's (128, 256)).
    same_init : bool
        Give every client the same initial network (FedAvg starts from one model).
    lr, gamma : float
        Adam learning rate (1e-3) and discount (0.99).
    eps_start, eps_decay, eps_min : float
        Epsilon-greedy: 1.0, multiplied by 0.995 after each episode, floor 0.001.
    replay_size, batch_size : int
        Replay capacity per client (10,000) and minibatch (64).
    learning_starts : int
        Transitions a client must hold before it trains (default: one batch).
    target_update : int
        Gradient steps between hard target-network copies (500).
    dynamics : dict or sequence of dicts or None
        Physical parameters of the clients' envs (see :func:`fedqhd.envs.make_env`).
    first_client : int
        Index of the first client held: its exploration stream is client
        ``first_client``'s of an in-process run (a Flower node holds its partition alone).
    networks : sequence of lists of arrays, optional
        The clients' initial networks (unpadded, one per client); default: drawn as
        :func:`initial_networks` draws them.
    pad_to : (int, int), optional
        Hidden widths to pad the network to (at least the clients' own): a node padded
        to the widest client of its run computes with the in-process run's shapes (XLA
        rounds a narrower network's products differently).
    as_nodes : bool
        Every client is drawn and computed as a Flower node holding it alone: its
        minibatches from its own stream, only while it acts
        (:func:`fedqhd.seeding.dqn_batch_rng` of that client), and its distillation
        computed apart (XLA's vectorised distillation over several clients rounds
        differently from one client's, by ~1e-5 of the KL after ten steps; the vectorised
        TD step gives one client's numbers bit for bit on this code's CPU builds, checked
        by ``tests/test_online_app_baselines.py``). So an in-process run is the app's run
        number for number. Default: one minibatch stream and one vectorised distillation
        for all clients (the layout the rows of BENCHMARKS.md were measured with). One
        client alone is the same either way.
    """

    def __init__(
        self,
        env_id: str,
        n_clients: int = 1,
        seed: int = 0,
        hidden: Sequence[int] | Sequence[Sequence[int]] = PAPER_HIDDEN,
        same_init: bool = False,
        lr: float = 1e-3,
        gamma: float = 0.99,
        eps_start: float = 1.0,
        eps_decay: float = 0.995,
        eps_min: float = 0.001,
        replay_size: int = 10_000,
        batch_size: int = 64,
        learning_starts: int | None = None,
        target_update: int = 500,
        dynamics: dict | Sequence[dict | None] | None = None,
        first_client: int = 0,
        networks: Sequence[Sequence[np.ndarray]] | None = None,
        pad_to: Sequence[int] | None = None,
        as_nodes: bool = False,
    ):
        jax, jnp, _ = _require_jax()
        self._jnp = jnp
        spec = get_spec(env_id)
        self.env_id, self.n_clients = env_id, int(n_clients)
        self.obs_dim, self.n_actions = spec.obs_dim, spec.n_actions
        n = self.n_clients
        pairs: list[Any] = ([tuple(hidden)] * n if isinstance(hidden[0], int | np.integer)
                            else list(hidden))
        self.hidden = [tuple(int(h) for h in pair) for pair in pairs]
        if len(self.hidden) != n or any(len(h) != 2 for h in self.hidden):
            raise ValueError(f"hidden must be one (h1, h2) pair or {n} of them")
        self.batch_size, self.target_update = int(batch_size), int(target_update)
        self.learning_starts = self.batch_size if learning_starts is None else int(learning_starts)
        self.eps_decay, self.eps_min = float(eps_decay), float(eps_min)
        self._k = _kernels(float(lr), float(gamma))

        self._rngs = dqn_client_rngs(seed, n, first_client)
        self._as_nodes = bool(as_nodes)
        self._batch_rng: np.random.Generator | list[np.random.Generator] = (
            [dqn_batch_rng(seed, 1, first_client + i) for i in range(n)] if as_nodes
            else dqn_batch_rng(seed, n, first_client))
        pad = (0, 0) if pad_to is None else tuple(int(h) for h in pad_to)
        h1m = max(pad[0], *(h[0] for h in self.hidden))
        h2m = max(pad[1], *(h[1] for h in self.hidden))
        self._h_max = (h1m, h2m)
        stacked = [np.zeros((n, *shape), np.float32) for shape in self._shapes(h1m, h2m)]
        if networks is None:
            networks = initial_networks(env_id, seed, self.hidden, same_init)
        if len(networks) != n:
            raise ValueError(f"networks must hold {n} initial networks, got {len(networks)}")
        for i, (h1, h2) in enumerate(self.hidden):
            arrays = [np.asarray(a, np.float32) for a in networks[i]]
            if [a.shape for a in arrays] != self._shapes(h1, h2):
                raise ValueError(f"client {i}'s initial network must have shapes "
                                 f"{self._shapes(h1, h2)}")
            self._pad_into(stacked, i, arrays)
        masks = (np.zeros((n, h1m), np.float32), np.zeros((n, h2m), np.float32))
        for i, (h1, h2) in enumerate(self.hidden):
            masks[0][i, :h1] = 1.0
            masks[1][i, :h2] = 1.0
        self._masks = tuple(jnp.asarray(m) for m in masks)
        self._params = tuple(jnp.asarray(a) for a in stacked)
        self._target = self._params
        self._opt = jax.vmap(self._k.tx.init)(self._params)
        self._distill_opt = jax.vmap(self._k.tx.init)(self._params)

        if dynamics is None or isinstance(dynamics, dict):
            dynamics = [dynamics] * n
        self.envs = [make_env(env_id, d) for d in dynamics]
        self.replay = _Replay(n, int(replay_size), self.obs_dim)
        self.epsilon = np.full(n, float(eps_start))
        self.episodes_done = np.zeros(n, np.int64)
        self.transitions = np.zeros(n, np.int64)  #: env steps collected so far
        self.grad_steps = np.zeros(n, np.int64)
        self.step_calls = 0  #: fused train-and-act calls (one per lockstep env step)
        self.step_seconds = 0.0  #: wall time inside those calls
        self.env_seconds = 0.0  #: wall time in env.step / env.reset

    # ---- parameters ---------------------------------------------------------------
    def _shapes(self, h1: int, h2: int):
        return network_shapes(self.obs_dim, self.n_actions, (h1, h2))

    @staticmethod
    def _pad_into(stacked, i, arrays):
        for dst, src in zip(stacked, arrays, strict=True):
            dst[(i, *(slice(0, s) for s in src.shape))] = src

    def get_parameters(self, i: int = 0) -> list[np.ndarray]:
        """Client ``i``'s network as 6 float32 arrays: W1, b1, W2, b2, W3, b3 (unpadded)."""
        h1, h2 = self.hidden[i]
        return [np.asarray(p[(i, *(slice(0, s) for s in shape))])
                for p, shape in zip(self._params, self._shapes(h1, h2), strict=True)]

    def set_parameters(self, arrays: Sequence[np.ndarray], i: int = 0,
                       reset_target: bool = True) -> None:
        """Load client ``i``'s network (shapes as :meth:`get_parameters`); by default
        its target network is set to the same values."""
        h1, h2 = self.hidden[i]
        shapes = self._shapes(h1, h2)
        if len(arrays) != len(shapes) or any(np.shape(a) != s for a, s in zip(arrays, shapes,
                                                                               strict=True)):
            raise ValueError(f"client {i} expects arrays of shapes {shapes}")
        self._params = tuple(
            p.at[(i, *(slice(0, s) for s in shape))].set(np.asarray(a, np.float32))
            for p, a, shape in zip(self._params, arrays, shapes, strict=True))
        if reset_target:
            self._target = tuple(
                t.at[i].set(p[i]) for t, p in zip(self._target, self._params, strict=True))

    # ---- acting and learning ------------------------------------------------------
    def collect_and_train(self, n_episodes: int) -> np.ndarray:
        """Every client runs ``n_episodes`` epsilon-greedy episodes, training after
        each env step. Returns the episode returns, shape (n_clients, n_episodes)."""
        n, jnp = self.n_clients, self._jnp
        returns = np.zeros((n, n_episodes))
        ep = np.zeros(n, np.int64)  # episodes finished in this call
        ep_ret = np.zeros(n)
        obs = np.zeros((n, self.obs_dim), np.float32)
        t0 = time.perf_counter()
        for i in range(n):
            obs[i] = self.envs[i].reset(seed=int(self._rngs[i].integers(2**31 - 1)))[0]
        self.env_seconds += time.perf_counter() - t0
        greedy = np.asarray(self._k.greedy(self._params, self._masks, jnp.asarray(obs)))
        while np.any(ep < n_episodes):
            active = ep < n_episodes
            t0 = time.perf_counter()
            for i in np.flatnonzero(active).tolist():
                rng = self._rngs[i]
                a = int(rng.integers(self.n_actions)) if rng.random() < self.epsilon[i] \
                    else int(greedy[i])
                s2, r, term, trunc, _ = self.envs[i].step(a)
                self.replay.add(i, obs[i], a, r, s2, float(term))
                ep_ret[i] += r
                self.transitions[i] += 1
                if term or trunc:
                    returns[i, ep[i]] = ep_ret[i]
                    ep[i] += 1
                    ep_ret[i] = 0.0
                    self.episodes_done[i] += 1
                    self.epsilon[i] = max(self.eps_min, self.epsilon[i] * self.eps_decay)
                    if ep[i] < n_episodes:
                        s2 = self.envs[i].reset(seed=int(rng.integers(2**31 - 1)))[0]
                obs[i] = s2
            t1 = time.perf_counter()
            do_train = active & (self.replay.size >= self.learning_starts)
            self.grad_steps += do_train
            do_sync = do_train & (self.grad_steps % self.target_update == 0)
            batch = self.replay.sample(self._batch_rng, self.batch_size, active)
            self._params, self._target, self._opt, _, g = self._k.step(
                self._params, self._target, self._opt, self._masks, *batch,
                do_train, do_sync, obs)
            greedy = np.asarray(g)
            self.step_calls += 1
            self.env_seconds += t1 - t0
            self.step_seconds += time.perf_counter() - t1
        return returns

    # ---- function-space interface (distillation) ----------------------------------
    def q_values(self, states: np.ndarray) -> np.ndarray:
        """Every client's Q on ``states`` (m, obs_dim): shape (n_clients, m, n_actions)."""
        x = self._jnp.asarray(np.asarray(states, np.float32))
        return np.asarray(self._k.q(self._params, self._masks, x))

    def kl_to_teacher(self, states: np.ndarray, teacher: np.ndarray, tau: float = 1.0
                      ) -> np.ndarray:
        """Mean over states of KL(softmax(teacher/tau) || softmax(Q_i/tau)), per client."""
        t = np.broadcast_to(np.asarray(teacher, np.float32),
                            (self.n_clients, len(states), self.n_actions))
        return np.asarray(self._k.kl(self._params, self._masks,
                                     np.asarray(states, np.float32), t, float(tau)))

    def distill(self, states: np.ndarray, teacher: np.ndarray, tau: float = 1.0,
                steps: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """``steps`` Adam steps per client on the KL to ``teacher`` at ``states``.

        ``teacher`` is (m, n_actions) for all clients or (n_clients, m, n_actions).
        The distillation Adam state is kept apart from the TD one. Returns the KL
        before and after, per client.
        """
        jax = _require_jax()[0]
        t = np.broadcast_to(np.asarray(teacher, np.float32),
                            (self.n_clients, len(states), self.n_actions))
        x = np.asarray(states, np.float32)
        args = (self._params, self._distill_opt, self._masks)
        if self._as_nodes and self.n_clients > 1:  # one client at a time, as nodes compute
            parts = [self._k.distill(*jax.tree_util.tree_map(lambda a, i=i: a[i:i + 1], args),
                                     x, t[i:i + 1], float(tau), int(steps))
                     for i in range(self.n_clients)]
            out = jax.tree_util.tree_map(lambda *a: self._jnp.concatenate(a), *parts)
        else:
            out = self._k.distill(*args, x, t, float(tau), int(steps))
        self._params, self._distill_opt, before, after = out
        return np.asarray(before), np.asarray(after)

    def greedy_policy(self, i: int = 0):
        """Client ``i``'s greedy policy as a numpy function obs -> action (for evaluation)."""
        params = [a.astype(np.float64) for a in self.get_parameters(i)]

        def policy(obs: np.ndarray) -> int:
            return int(np.argmax(mlp_q(params, obs)))

        return policy

    # ---- state between rounds (a Flower node's context.state) ----------------------
    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Everything that carries over between calls, as arrays and scalars: the
        (padded) online and target networks, both Adam states, the replay rows held and
        their pointer, the RNG states (exploration and env resets; minibatches), epsilon
        and the counters. :meth:`restore` on a client built with the same settings makes
        it this client, bit for bit. The envs are not in it: every call resets them from
        the exploration stream."""
        jax = _require_jax()[0]
        rows = int(self.replay.size.max())
        arrays: dict[str, np.ndarray] = {}
        for name, tree in (("params", self._params), ("target", self._target),
                           ("adam", self._opt), ("distill-adam", self._distill_opt)):
            for k, leaf in enumerate(jax.tree_util.tree_leaves(tree)):
                arrays[f"{name}-{k}"] = np.array(leaf)
        r = self.replay
        arrays.update({"replay-s": r.s[:, :rows], "replay-s2": r.s2[:, :rows],
                       "replay-a": r.a[:, :rows], "replay-r": r.r[:, :rows],
                       "replay-term": r.term[:, :rows], "replay-ptr": r.ptr,
                       "replay-size": r.size, "epsilon": self.epsilon,
                       "episodes-done": self.episodes_done, "transitions": self.transitions,
                       "grad-steps": self.grad_steps})
        batch = (self._batch_rng if isinstance(self._batch_rng, list) else [self._batch_rng])
        scalars = {"rngs": json.dumps([g.bit_generator.state for g in self._rngs]),
                   "batch-rngs": json.dumps([g.bit_generator.state for g in batch]),
                   "step-calls": self.step_calls}
        return {k: np.array(v) for k, v in arrays.items()}, scalars

    def restore(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        """Become the client :meth:`snapshot` described (this one built with the same
        settings)."""
        jax, jnp, _ = _require_jax()
        trees = {}
        for name, tree in (("params", self._params), ("target", self._target),
                           ("adam", self._opt), ("distill-adam", self._distill_opt)):
            leaves, treedef = jax.tree_util.tree_flatten(tree)
            saved = [arrays.get(f"{name}-{k}") for k in range(len(leaves))]
            if any(a is None or a.shape != leaf.shape or a.dtype != leaf.dtype
                   for a, leaf in zip(saved, leaves, strict=True)):
                raise ValueError(f"snapshot {name!r} does not fit this client (built with "
                                 "other widths, clients or settings)")
            trees[name] = jax.tree_util.tree_unflatten(treedef,
                                                       [jnp.asarray(a) for a in saved])
        self._params, self._target = trees["params"], trees["target"]
        self._opt, self._distill_opt = trees["adam"], trees["distill-adam"]
        r = self.replay
        rows = arrays["replay-s"].shape[1]
        if rows > r.capacity:
            raise ValueError(f"snapshot replay of {rows} rows does not fit {r.capacity}")
        for name in ("s", "s2", "a", "r", "term"):
            buf = getattr(r, name)
            buf[...] = 0
            buf[:, :rows] = arrays[f"replay-{name}"]
        r.ptr[:], r.size[:] = arrays["replay-ptr"], arrays["replay-size"]
        self.epsilon[:] = arrays["epsilon"]
        self.episodes_done[:] = arrays["episodes-done"]
        self.transitions[:] = arrays["transitions"]
        self.grad_steps[:] = arrays["grad-steps"]
        batch = (self._batch_rng if isinstance(self._batch_rng, list) else [self._batch_rng])
        for g, state in zip([*self._rngs, *batch], [*json.loads(str(scalars["rngs"])),
                                                     *json.loads(str(scalars["batch-rngs"]))],
                            strict=True):
            g.bit_generator.state = state
        self.step_calls = int(scalars["step-calls"])

    def close(self) -> None:
        for env in self.envs:
            env.close()
