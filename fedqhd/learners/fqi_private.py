"""Private FedQHD (run-config ``privacy = "zcdp"``): each client releases ONE noisy readout
under rho-zCDP (output perturbation by sample-and-aggregate); with a shared encoder the
readout itself, with heterogeneous encoders its advantages on the run's public anchor states
(FedQHDAnchor's reply). Offline shards release once; online clients release their growing
episode store once a round at a share of the rho
(:func:`fedqhd.learners.fqi_online.private_online_train`).

Unit of protection: ONE TRAJECTORY (episode) of a client's shard, add/remove-one
neighbours (two shards are neighbours when one is the other plus one episode). Why a
trajectory and not a transition: consecutive transitions of an episode are one
person's / one system's run and are strongly dependent, so protecting a transition alone
would leave its episode exposed; a trajectory is also POOL's unit. Add/remove (not
replace): the shard's size is private too, so replies claim no size
(``num-transitions = 1``; the server averages clients uniformly).

The release (client side, :class:`PrivateReadout`):

1. Every episode goes to one of ``m`` chunks (run-config ``privacy-chunks``) by a hash of
   its OWN content (:func:`episode_chunks`): adding or removing an episode changes its
   chunk and no other.
2. Each chunk fits ridge FQI alone (``local-iterations`` sweeps from a zero readout, ridge
   ``ridge``, targets kept in the env's PUBLIC value range): readout ``w_j`` (D, |A|).
3. Each ``w_j`` is centred over actions, ``u_j = w_j - mean_a w_j`` (the ADVANTAGE readout:
   ``argmax_a phi(s) . u_a = argmax_a phi(s) . w_a`` for every state, so the greedy policy is
   unchanged), and clipped to Frobenius norm ``R`` (``privacy-clip-norm``):
   ``c_j = u_j min(1, R / ||u_j||)``. Centring is what makes output perturbation usable:
   CartPole's chunk readouts have ``||w_j|| ~ 25`` but ``||u_j|| ~ 2-5`` (both actions'
   Q-values are close; the policy lives in their difference).
4. The release is ``mean_j c_j + N(0, sigma^2 I)``, once per run.

Heterogeneous encoders (``encoder = "heterogeneous"``, FedQHDAnchor): step 3 centres and
clips the chunk's advantages on the M anchor states instead, ``u_j = A(X w_j)`` with ``X``
the client's own features of the anchors, to Frobenius norm ``R sqrt(M)`` (R bounds the
root-mean-square advantage row per anchor, the scale a readout's ``R`` has per state), so
``Delta = 2 R sqrt(M) / m``. The anchors are public (drawn by the server from its own
rollouts, uniformly, or a given file), the release is post-processing of the chunk fits as
before, and so is everything after it: the server's teacher (the mean of the noisy
releases) and each client's compilation of the teacher into its own features, whose greedy
return is what the client reports (with ``num-transitions = 1``: its shard's size is
private).

Sensitivity (L2, add/remove one episode): only the episode's chunk ``j`` changes, from
``c_j`` to ``c_j'``, both of norm <= R, so the mean moves by
``||c_j' - c_j|| / m <= 2R / m``; an empty chunk's readout is the public zero. Hence
``Delta = 2 R / m`` -- whatever the chunk's data, FQI's sweeps, the episode's length or
its features (no per-transition or per-episode clipping is needed: the clip is on the
chunk's output). Tight: a chunk whose readout flips from ``+R`` to ``-R`` direction moves the
mean by exactly ``2R/m``. ``tests/test_private_fedqhd.py`` checks the bound over random
neighbouring shards.

Why not the ridge FQI fixed point's own sensitivity (no chunks): one ridge solve
``w = (G + lambda I)^-1 Phi^T y`` moves by at most ``L (Y + max|phi.w|) / lambda`` when one
episode (<= L transitions, ``||phi|| <= 1``, ``y`` in [0, Y]) is added, but the next sweep's
targets shift at EVERY transition by up to ``gamma ||Delta w||``, which moves the solve by up
to ``gamma sqrt(N / (4 lambda)) ||Delta w||`` (``||(G + lambda I)^-1 Phi^T|| <= 1 / (2 sqrt
lambda)``, N the weighted count): the sweeps contract only for ``lambda >~ N``, and at such
a ridge CartPole's noise-free return falls from 500 to under 90 (measured; BENCHMARKS.md).
Sample-and-aggregate bounds the whole local fit at once instead.

Mechanism and accounting: the Gaussian mechanism ``sigma = Delta / sqrt(2 rho)``
(:func:`fedqhd.privacy.release_real`), OpenDP's secure Gaussian on floats by default (node
config ``noise``; ``numpy`` for experiments), ``rho = min(privacy-rho, node rho)``. Before
the release the client checks it against its shard's on-disk ledger (node ``rho-budget``,
the same :class:`~fedqhd.privacy.store.LedgerStore` POOL uses, keyed by the shard's
fingerprint) and refuses (``BudgetExceededError``) before any noise is drawn; the release is
one ledger entry and is kept in the node state, so later rounds resend it (free). The
ledger reports rho and epsilon(delta) by the conversion valid for the sampler.

The server (:class:`~fedqhd.strategies.FedQHDAvg` behind a
:class:`~fedqhd.strategies.PrivacyScreen`) averages the clients' noisy advantage readouts,
uniformly: post-processing, and the noise of n clients averages down by ``sqrt n``.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, Context

from fedqhd.config import RunConfig
from fedqhd.data import Shard
from fedqhd.gram import value_range
from fedqhd.node_config import NodeSettings
from fedqhd.privacy import NumpyNoise, PrivacyLedger, make_noise_source, release_real
from fedqhd.privacy.ledger import REPORTED_DELTA
from fedqhd.privacy.store import LedgerStore, data_fingerprint, ledger_dir
from fedqhd.readout import bellman_targets
from fedqhd.seeding import pool_noise_seed
from fedqhd.strategies import contract as C

STATE_RELEASE = "fqi-private-readout"  #: context.state ArrayRecord: the released readout


class NonPrivateFQIRefusedError(RuntimeError):
    """A client whose node switched noise off (``noise = none``), in a run not marked
    non-private."""


def public_value_range(env_reward_range: tuple[float, float] | None, gamma: float
                       ) -> tuple[float, float]:
    """Where every clipped target lies: the value range of the env's (public) reward range."""
    if env_reward_range is None:
        raise ValueError("privacy = 'zcdp' needs the env's reward range (register the env "
                         "with reward_range=(lo, hi)): targets must lie in a public range")
    return value_range(np.asarray(env_reward_range, dtype=np.float64), gamma)


def episode_chunks(shard: Shard, chunks: int) -> np.ndarray:
    """Per transition, its episode's chunk in ``[0, chunks)``: a hash of the episode's own
    transitions (states, actions, rewards), so no other episode moves it."""
    ids = np.asarray(shard.episode_ids)
    out = np.zeros(len(ids), dtype=np.int64)
    for eid in np.unique(ids):
        rows = ids == eid
        digest = hashlib.blake2b(digest_size=8)
        for part in (shard.observations[rows], shard.next_observations[rows],
                     shard.actions[rows], shard.rewards[rows]):
            digest.update(np.ascontiguousarray(part, dtype=np.float64).tobytes())
        out[rows] = int.from_bytes(digest.digest(), "little") % chunks
    return out


def clip_norm(matrix: np.ndarray, bound: float) -> np.ndarray:
    """``matrix`` scaled down to Frobenius norm ``bound`` where it is longer."""
    norm = float(np.linalg.norm(matrix))
    out: np.ndarray = matrix * min(1.0, bound / max(norm, 1e-300))
    return out


def advantage(readout: np.ndarray) -> np.ndarray:
    """``readout`` centred over actions (same greedy policy at every state)."""
    out: np.ndarray = readout - readout.mean(axis=1, keepdims=True)
    return out


class PrivateReadout:
    """One shard's clipped sample-and-aggregate readout (nothing here is noisy).

    Parameters
    ----------
    shard : Shard
    encode : callable
        States -> features (the shared encoder).
    n_actions : int
    gamma, ridge : float
        Discount and each chunk's ridge penalty.
    reward_range : (lo, hi)
        The env's public reward range: rewards are clipped into it, targets into its
        value range.
    chunks : int
        m, the number of chunks (run-config ``privacy-chunks``).
    clip : float
        R, the Frobenius norm each chunk's advantage readout is clipped to.
    sweeps : int
        FQI sweeps of each chunk's fit.
    anchor_features : ndarray of shape (M, D), optional
        The client's features of the public anchor states: release the chunks' advantages
        there (heterogeneous encoders), clipped to ``R sqrt(M)``, instead of the readout.
    """

    def __init__(self, shard: Shard, encode: Any, n_actions: int, gamma: float, ridge: float,
                 reward_range: tuple[float, float], chunks: int, clip: float,
                 sweeps: int, anchor_features: np.ndarray | None = None) -> None:
        if chunks < 1 or clip <= 0 or ridge <= 0 or sweeps < 1:
            raise ValueError(f"need chunks >= 1, clip > 0, ridge > 0, sweeps >= 1; got "
                             f"{chunks}, {clip}, {ridge}, {sweeps}")
        self.n_actions, self.gamma, self.ridge = int(n_actions), float(gamma), float(ridge)
        self.chunks, self.clip, self.sweeps = int(chunks), float(clip), int(sweeps)
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.value_range = public_value_range(self.reward_range, gamma)
        self.chunk = episode_chunks(shard, self.chunks)
        self.features = encode(shard.observations)
        self.next_features = encode(shard.next_observations)
        self.actions = np.asarray(shard.actions, dtype=np.int64)
        self.rewards = np.clip(np.asarray(shard.rewards, dtype=np.float64), *self.reward_range)
        self.continues = 1.0 - np.asarray(shard.terminated, dtype=np.float64)
        self.dim = self.features.shape[1]
        self.anchor_features = anchor_features
        if anchor_features is not None and anchor_features.shape[1] != self.dim:
            raise ValueError(f"anchor features have {anchor_features.shape[1]} columns, the "
                             f"encoder {self.dim}")
        self.fingerprint = data_fingerprint(shard.observations, shard.actions, shard.rewards,
                                            shard.episode_ids)
        self._readout: np.ndarray | None = None

    @property
    def bound(self) -> float:
        """The Frobenius norm each chunk's contribution is clipped to: ``R``, or ``R sqrt(M)``
        on M anchors."""
        anchors = 1 if self.anchor_features is None else len(self.anchor_features)
        return self.clip * math.sqrt(anchors)

    @property
    def sensitivity(self) -> float:
        """Delta = 2 R / m, or 2 R sqrt(M) / m on M anchors (module docstring)."""
        return 2.0 * self.bound / self.chunks

    def chunk_fit(self, j: int) -> np.ndarray:
        """Chunk ``j``'s ridge FQI readout (D, |A|), before centring and clipping."""
        rows = np.flatnonzero(self.chunk == j)
        x, xn, acts = self.features[rows], self.next_features[rows], self.actions[rows]
        solves = []
        for a in range(self.n_actions):
            xa = x[acts == a]
            # the smaller of the two equal ridge solves: (X'X + lam I)^-1 X' y (D x D) or,
            # when the chunk has fewer rows than features, X' (X X' + lam I)^-1 y
            dual = len(xa) < self.dim
            gram = xa @ xa.T if dual else xa.T @ xa
            solves.append((xa, dual, np.linalg.cholesky(gram + self.ridge * np.eye(len(gram)))))
        readout = np.zeros((self.dim, self.n_actions))
        for _ in range(self.sweeps):
            y = bellman_targets(self.rewards[rows], self.continues[rows],
                                (xn @ readout).max(axis=1), self.gamma, self.value_range)
            for a, (xa, dual, chol) in enumerate(solves):
                ya = y[acts == a]
                rhs = ya if dual else xa.T @ ya
                solved = np.linalg.solve(chol.T, np.linalg.solve(chol, rhs))
                readout[:, a] = xa.T @ solved if dual else solved
        return readout

    def chunk_readout(self, j: int) -> np.ndarray:
        """Chunk ``j``'s contribution ``c_j``: its advantage readout (or its advantages on the
        anchors) clipped to :attr:`bound`."""
        fit = self.chunk_fit(j)
        if self.anchor_features is not None:
            fit = self.anchor_features @ fit
        return clip_norm(advantage(fit), self.bound)

    def readout(self) -> np.ndarray:
        """``mean_j c_j`` ((D, |A|), or (M, |A|) on anchors): what is released, before
        noise."""
        if self._readout is None:
            self._readout = np.mean([self.chunk_readout(j) for j in range(self.chunks)], axis=0)
        return self._readout


def sigma_of(sensitivity: float, rho: float) -> float:
    """Noise scale of a release (Gaussian mechanism, rho-zCDP)."""
    return sensitivity / math.sqrt(2.0 * rho)


class Releasable(Protocol):
    """What :func:`release_readout` reads of a model: the readout and its sensitivity
    (:class:`PrivateReadout`; the privacy audit passes a batch of copies of a readout, to
    draw many releases through this same code)."""

    @property
    def sensitivity(self) -> float: ...

    def readout(self) -> np.ndarray: ...


def release_readout(model: Releasable, rho: float, source: Any,
                    ledger: PrivacyLedger | None) -> np.ndarray:
    """The noisy readout (one ledger entry)."""
    out: np.ndarray = release_real(model.readout(), model.sensitivity, rho, source, ledger,
                                   label="fqi-readout")
    return out


def ledger_metrics(ledger: PrivacyLedger, sigma: float) -> dict[str, float]:
    """A reply's privacy numbers (an infinite epsilon is left out: strategies refuse
    non-finite metrics; ``noise-reproducible = 1`` says why)."""
    out = {C.PRIVATE: 1, C.RHO_SPENT: ledger.rho_spent, C.RHO_BUDGET: ledger.budget_rho,
           C.DELTA: ledger.delta, C.NOISE_SIGMA: sigma,
           C.NOISE_SECURE: int(all(e.get("secure", False) for e in ledger.entries)),
           C.NOISE_REPRODUCIBLE: int(ledger.regenerable)}
    for key, value in ((C.EPSILON_CKS, ledger.epsilon_cks()),
                       (C.EPSILON_EXACT, ledger.epsilon_exact()), (C.EPSILON, ledger.epsilon())):
        if math.isfinite(value):
            out[key] = value
    return out


def private_readout(context: Context, cfg: RunConfig, model: PrivateReadout, pid: int,
                    rounds: int = 1, round_index: int = 0, ledger_key: str | None = None
                    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A private client's reply: its noisy readout (``"readout"``, or ``"q-anchors"`` on
    anchors), checked against the shard's on-disk ledger first (one ledger entry).
    Offline (``rounds = 1``) it is released once and resent from the node state in later
    rounds (no new spend); online every round releases its growing buffer anew at
    ``1 / rounds`` of the rho, so an episode's releases add up to at most the rho.
    ``ledger_key``: the ledger charged (default: the shard's fingerprint)."""
    key = C.READOUT if model.anchor_features is None else C.Q_ANCHORS
    node = NodeSettings.of(context.node_config)
    metrics: dict[str, float] = {C.NUM_TRANSITIONS: 1, C.PARTITION_ID: pid}
    if node.noise == "none":  # the exact clipped readout: the node's consent, a marked run
        if not cfg.non_private:
            raise NonPrivateFQIRefusedError(
                f"client partition {pid}: noise is switched off (node config noise='none'), "
                "which would release an exact readout of private trajectories; refused "
                "because the run is not marked non-private (run-config non-private=true)")
        return {key: model.readout()}, {**metrics, C.PRIVATE: 0}
    rho = min(cfg.privacy_rho, node.rho) / rounds
    entropy = [pool_noise_seed(cfg.seed, pid), 1] + ([round_index] if round_index else [])
    source = (NumpyNoise(np.random.default_rng(entropy)) if node.reproducible_noise
              else make_noise_source(node.noise))
    with LedgerStore(ledger_dir(context.node_config)).open(
            ledger_key or model.fingerprint, node.rho_budget, REPORTED_DELTA,
            f"partition-{pid}") as ledger:
        if STATE_RELEASE not in context.state or rounds > 1:
            # release_real charges the ledger (refusing beyond the budget) before any
            # noise is drawn
            noisy = release_readout(model, rho, source, ledger)
            context.state[STATE_RELEASE] = C.to_array_record({key: noisy})
        record = context.state[STATE_RELEASE]
        assert isinstance(record, ArrayRecord)
        metrics.update(ledger_metrics(ledger, sigma_of(model.sensitivity, rho)))
    return {key: record[key].numpy()}, metrics
