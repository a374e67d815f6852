"""Private FedQHD (run-config ``privacy = "zcdp"``): FedQHDExact's sufficient statistics
released under rho-zCDP, with a shared encoder on offline shards.

Unit of protection: ONE TRAJECTORY (episode) of a client's shard, add/remove-one
neighbours (two shards are neighbours when one is the other plus one episode). Why a
trajectory and not a transition: consecutive transitions of an episode are one
person's / one system's run and are strongly dependent (each next state is the following
state), so protecting a transition alone would leave the episode it belongs to exposed;
a trajectory is also POOL's unit (its audit replaces one trajectory). Add/remove (not
replace) because every released quantity below is a sum of per-trajectory terms that
each depend on that trajectory alone: one added episode moves the release by its own
term, which we bound; the size of the shard is then private too, so replies claim no
size (``num-transitions = 1``; the server weights clients uniformly).

Clipping (client side, before anything is summed):

* per transition, the feature vector: ``phi_c(s) = phi(s) min(1, B / ||phi(s)||)`` with
  ``B = 1`` (:data:`FEATURE_NORM`). fedqhd's encoders give ``||phi||^2 = (2/D) sum_j
  cos^2(.) <= 2``, so without clipping ``B`` would be ``sqrt 2``; ``||phi||^2`` averages 1
  (it concentrates there as D grows), so clipping to 1 changes about half the rows by a
  few percent and halves the Gram's sensitivity. The greedy policy is invariant to a
  positive per-state rescaling of the features (``argmax_a phi(s) . w_a``), so the server
  evaluates with the plain encoder; the targets use ``phi_c`` throughout (FQI is run in
  the clipped feature map).
* per trajectory, its length: every transition of an episode of length ``n_tau`` gets
  weight ``w_tau = min(1, L / n_tau)`` (``L`` = run-config ``privacy-clip-length``), so an
  episode counts as at most ``L`` transitions. The same weight enters the Gram and
  ``phi-y``, so the server's solve is weighted ridge FQI (long episodes down-weighted).
* targets: ``y = clip(r + gamma max_a' phi_c(s') . w_a', lo, hi)`` with ``[lo, hi] =
  value_range(env reward range, gamma)``, a PUBLIC range from the env's spec (rewards are
  clipped to the spec's reward range first); the client never uses a range the server
  sends (a server could otherwise widen it). ``Y = max(|lo|, |hi|)``.

Sensitivity (L2, add/remove one trajectory ``tau``; it adds
``M_a = w_tau sum_{t in tau, a_t = a} phi_c(s_t) phi_c(s_t)^T`` to each Gram and
``v_a = w_tau sum_{t in tau, a_t = a} phi_c(s_t) y_t`` to each ``phi-y`` column):

* Gram. It is released as the per-action upper triangles with the off-diagonal entries
  multiplied by ``sqrt 2`` (:func:`iso_pack`; an isometry: the packed vector's norm is the
  Frobenius norm), noised, then scaled back (post-processing; ``gram`` on the wire is the
  plain packed upper triangle). So the moved vector's norm is
  ``sqrt(sum_a ||M_a||_F^2) <= sum_a ||M_a||_F <= sum_a w_tau sum_{t: a_t=a} ||phi_c||^2
  = w_tau n_tau B^2 <= L B^2``. Hence ``Delta_G = L B^2 = L``. Tight: an episode of L
  transitions at one state (``||phi_c|| = 1``) with one action moves it by exactly L.
  (Replace-one would give ``sqrt 2 L``: the difference of two PSD matrices has
  ``||M - M'||_F^2 <= ||M||_F^2 + ||M'||_F^2``.)
* ``phi-y`` of one sweep: ``||(v_a)_a||_F <= sum_a ||v_a|| <= w_tau sum_t ||phi_c|| |y_t|
  <= L B Y``. Hence ``Delta_y = L B Y = L Y``; tight for an episode of L transitions at
  one state with ``y = hi``.

Both bounds are checked over many random episodes by ``tests/test_private_fedqhd.py``.

Mechanism and accounting: the Gaussian mechanism ``sigma = Delta / sqrt(2 rho)``
(:func:`fedqhd.privacy.release_real`), OpenDP's secure Gaussian on floats by default (node
config ``noise``; ``numpy`` for experiments). The Gram does not depend on the readout: it
is released ONCE (``rho_G = privacy-gram-share x privacy-rho``) and kept in the node state
(a server that asks again gets the same noisy Gram: free). ``phi-y`` depends on the readout,
so every sweep (one per round, ``num-server-rounds`` of them) is a release of
``rho_y = (1 - share) x privacy-rho / rounds``. zCDP composes by adding rho: the run costs
``rho_G + rounds x rho_y = privacy-rho`` (less where the node caps a release: its ``rho``
is the most one release may spend, as for POOL). Before the first release the client
checks the WHOLE run's rho against its shard's on-disk ledger (node ``rho-budget``, the
same :class:`~fedqhd.privacy.store.LedgerStore` POOL uses, keyed by the shard's
fingerprint) and refuses (``BudgetExceededError``) before any noise is drawn; every
release is then one ledger entry, and a sweep beyond the run's rounds is refused. The
ledger reports the total rho and epsilon(delta) by the conversion valid for the sampler.

The server (:class:`~fedqhd.strategies.FedQHDPrivateExact`) only post-processes: it sums
the noisy Grams, projects each action's sum onto the PSD cone (eigenvalues clipped at 0:
the nearest PSD matrix in Frobenius norm) and solves ridge FQI with the ridge raised by
``privacy-ridge`` (a public number) so that the noise directions the projection keeps are
damped; ``G_psd + ridge I`` is positive definite, so every solve is well-posed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context

from fedqhd.config import RunConfig
from fedqhd.data import Shard
from fedqhd.gram import pack_upper, value_range
from fedqhd.node_config import NodeSettings
from fedqhd.privacy import (
    BudgetExceededError,
    NumpyNoise,
    PrivacyLedger,
    make_noise_source,
    release_real,
)
from fedqhd.privacy.store import LedgerStore, data_fingerprint, ledger_dir
from fedqhd.readout import bellman_targets
from fedqhd.seeding import pool_noise_seed
from fedqhd.strategies import contract as C

FEATURE_NORM = 1.0  #: B: every feature row is clipped to this L2 norm
STATE_GRAM = "fqi-private-gram"     #: context.state ArrayRecord: the released noisy Gram
STATE_META = "fqi-private-release"  #: context.state ConfigRecord: sweeps released so far


class NonPrivateFQIRefusedError(RuntimeError):
    """A client whose node switched noise off (``noise = none``), in a run not marked
    non-private."""


def clip_rows(features: np.ndarray, bound: float = FEATURE_NORM) -> np.ndarray:
    """Each row scaled down to L2 norm ``bound`` where it is longer (per-transition clip)."""
    norms = np.linalg.norm(features, axis=1, keepdims=True)
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    out: np.ndarray = features * scale
    return out


def trajectory_weights(episode_ids: np.ndarray, clip_length: float) -> np.ndarray:
    """Per transition, ``min(1, L / n_tau)`` for its episode of ``n_tau`` transitions: an
    episode counts as at most ``L`` transitions."""
    _, inverse, lengths = np.unique(episode_ids, return_inverse=True, return_counts=True)
    out: np.ndarray = np.minimum(1.0, clip_length / lengths)[inverse]
    return out


def _off_diagonal(dim: int) -> np.ndarray:
    """Mask of the off-diagonal entries in :func:`~fedqhd.gram.pack_upper`'s layout."""
    mask = np.ones(dim * (dim + 1) // 2, dtype=bool)
    i = np.arange(dim)
    mask[i * dim - i * (i - 1) // 2] = False
    return mask


def iso_pack(grams: np.ndarray) -> np.ndarray:
    """(k, D, D) symmetric -> packed upper triangles with off-diagonals times sqrt 2: the
    vector's L2 norm is the matrices' Frobenius norm (what the sensitivity bounds)."""
    packed = pack_upper(np.asarray(grams, dtype=np.float64))
    packed[:, _off_diagonal(grams.shape[-1])] *= math.sqrt(2.0)
    return packed


def iso_to_plain(packed: np.ndarray, dim: int) -> np.ndarray:
    """Inverse scaling of :func:`iso_pack`: the plain ``pack_upper`` layout (``gram``)."""
    out = np.array(packed, dtype=np.float64)
    out[:, _off_diagonal(dim)] /= math.sqrt(2.0)
    return out


def public_value_range(env_reward_range: tuple[float, float] | None, gamma: float
                       ) -> tuple[float, float]:
    """Where every clipped target lies: the value range of the env's (public) reward range."""
    if env_reward_range is None:
        raise ValueError("privacy = 'zcdp' needs the env's reward range (register the env "
                         "with reward_range=(lo, hi)): targets must lie in a public range")
    return value_range(np.asarray(env_reward_range, dtype=np.float64), gamma)


class PrivateStatistics:
    """One shard's clipped, trajectory-weighted statistics (nothing here is noisy).

    Parameters
    ----------
    shard : Shard
    encode : callable
        States -> features (the shared encoder); rows are clipped to :data:`FEATURE_NORM`.
    n_actions : int
    gamma : float
    reward_range : (lo, hi)
        The env's public reward range: rewards are clipped into it, targets into its
        value range.
    clip_length : float
        L: most transitions an episode counts as.
    """

    def __init__(self, shard: Shard, encode: Any, n_actions: int, gamma: float,
                 reward_range: tuple[float, float], clip_length: float) -> None:
        if clip_length <= 0:
            raise ValueError(f"clip_length must be > 0, got {clip_length}")
        self.n_actions, self.gamma, self.clip_length = int(n_actions), float(gamma), clip_length
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        self.value_range = public_value_range(self.reward_range, gamma)
        self.weights = trajectory_weights(shard.episode_ids, clip_length)
        self.features = clip_rows(encode(shard.observations))
        self.next_features = clip_rows(encode(shard.next_observations))
        self.actions = np.asarray(shard.actions, dtype=np.int64)
        self.rewards = np.clip(np.asarray(shard.rewards, dtype=np.float64), *self.reward_range)
        self.continues = 1.0 - np.asarray(shard.terminated, dtype=np.float64)
        self.dim = self.features.shape[1]
        self.fingerprint = data_fingerprint(shard.observations, shard.actions, shard.rewards,
                                            shard.episode_ids)

    @property
    def target_bound(self) -> float:
        """Y = max |y| of every clipped target."""
        return max(abs(self.value_range[0]), abs(self.value_range[1]))

    @property
    def gram_sensitivity(self) -> float:
        """Delta_G = L B^2 (module docstring)."""
        return float(self.clip_length * FEATURE_NORM ** 2)

    @property
    def rhs_sensitivity(self) -> float:
        """Delta_y = L B Y (module docstring)."""
        return float(self.clip_length * FEATURE_NORM * self.target_bound)

    def grams(self) -> np.ndarray:
        """Weighted per-action Grams ``sum_t w_t phi_c phi_c^T`` (|A|, D, D)."""
        out = np.zeros((self.n_actions, self.dim, self.dim))
        for a in range(self.n_actions):
            rows = self.actions == a
            x = self.features[rows] * np.sqrt(self.weights[rows])[:, None]
            out[a] = x.T @ x
        return out

    def targets(self, readout: np.ndarray) -> np.ndarray:
        """Bellman targets under ``readout``, kept in the public value range."""
        best_next = (self.next_features @ readout).max(axis=1)
        out: np.ndarray = bellman_targets(self.rewards, self.continues, best_next, self.gamma,
                                          self.value_range)
        return out

    def rhs(self, readout: np.ndarray) -> np.ndarray:
        """Weighted ``[sum_t w_t phi_c(s_t) y_t]_a`` (D, |A|) for ``readout``'s targets."""
        wy = self.weights * self.targets(readout)
        out = np.zeros((self.dim, self.n_actions))
        for a in range(self.n_actions):
            rows = self.actions == a
            out[:, a] = self.features[rows].T @ wy[rows]
        return out


@dataclass(frozen=True)
class ReleasePlan:
    """What one client's run releases: the Gram once at ``rho_gram``, ``sweeps`` phi-y
    releases at ``rho_sweep`` each; each at most the node's per-release ``rho``."""

    rho_gram: float
    rho_sweep: float
    sweeps: int

    @property
    def total(self) -> float:
        """zCDP composes additively: the run's rho."""
        return self.rho_gram + self.sweeps * self.rho_sweep

    @classmethod
    def of(cls, cfg: RunConfig, node: NodeSettings) -> ReleasePlan:
        """The run's request (``privacy-rho`` split by ``privacy-gram-share`` over
        ``num-server-rounds`` sweeps), each release lowered to the node's ``rho``."""
        rounds = cfg.num_server_rounds
        share = cfg.privacy_gram_share
        return cls(min(share * cfg.privacy_rho, node.rho),
                   min((1.0 - share) * cfg.privacy_rho / rounds, node.rho), rounds)


def sigma_of(sensitivity: float, rho: float) -> float:
    """Noise scale of a release (Gaussian mechanism, rho-zCDP)."""
    return sensitivity / math.sqrt(2.0 * rho)


def release_gram(stats: PrivateStatistics, rho: float, source: Any,
                 ledger: PrivacyLedger | None) -> np.ndarray:
    """The noisy Gram, plain packed (``gram``): noise on the isometric packing, scaled back."""
    noisy = release_real(iso_pack(stats.grams()), stats.gram_sensitivity, rho, source, ledger,
                         label="fqi-gram")
    return iso_to_plain(noisy, stats.dim)


def release_rhs(stats: PrivateStatistics, readout: np.ndarray, rho: float, source: Any,
                ledger: PrivacyLedger | None, sweep: int) -> np.ndarray:
    """One sweep's noisy ``phi-y``."""
    out: np.ndarray = release_real(stats.rhs(readout), stats.rhs_sensitivity, rho, source,
                                   ledger, label=f"fqi-phi-y-{sweep}")
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


def private_statistics(context: Context, cfg: RunConfig, stats: PrivateStatistics,
                       arrays: dict[str, np.ndarray], pid: int
                       ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """A private FedQHDExact reply: the node's noisy Gram when the server lacks it
    (``stats-request[0] == 0``; released once, then resent from the node state) and this
    sweep's noisy ``phi-y``; each release charged to the shard's on-disk ledger, the whole
    run checked against the node's budget before the first release."""
    node = NodeSettings.of(context.node_config)
    have, want = (float(v) for v in arrays[C.STATS_REQUEST])
    readout = arrays[C.READOUT]
    metrics: dict[str, float] = {C.NUM_TRANSITIONS: 1, C.GRAM_THROUGH: 1,
                                 C.PARTITION_ID: pid}
    out: dict[str, np.ndarray] = {
        C.ACTION_COUNTS: np.full(stats.n_actions, 1.0 / stats.n_actions),  # claims nothing
        C.REWARD_RANGE: np.asarray(stats.reward_range, dtype=np.float64)}   # public
    if node.noise == "none":  # exact clipped statistics: the node's consent, a marked run
        if not cfg.non_private:
            raise NonPrivateFQIRefusedError(
                f"client partition {pid}: noise is switched off (node config noise='none'), "
                "which would release exact statistics of private trajectories; refused "
                "because the run is not marked non-private (run-config non-private=true)")
        if have == 0:
            out[C.GRAM] = pack_upper(stats.grams())
        if want:
            out[C.PHI_Y] = stats.rhs(readout)
        return out, {**metrics, C.PRIVATE: 0}
    plan = ReleasePlan.of(cfg, node)
    meta = context.state[STATE_META] if STATE_META in context.state else None
    sweeps = int(meta["sweeps"]) if isinstance(meta, ConfigRecord) else 0  # type: ignore[arg-type]
    source = (NumpyNoise(np.random.default_rng(
                  [pool_noise_seed(cfg.seed, pid), sweeps, int(STATE_GRAM in context.state)]))
              if node.reproducible_noise else make_noise_source(node.noise))
    sigma = 0.0
    with LedgerStore(ledger_dir(context.node_config)).open(
            stats.fingerprint, node.rho_budget, cfg.privacy_delta,
            f"partition-{pid}") as ledger:
        if STATE_GRAM not in context.state:
            ledger.check(plan.total)  # the whole run, before any noise is drawn
            gram = release_gram(stats, plan.rho_gram, source, ledger)
            context.state[STATE_GRAM] = C.to_array_record({C.GRAM: gram})
            sigma = sigma_of(stats.gram_sensitivity, plan.rho_gram)
        record = context.state[STATE_GRAM]
        assert isinstance(record, ArrayRecord)
        if have == 0:
            out[C.GRAM] = record[C.GRAM].numpy()
        if want:
            if sweeps >= plan.sweeps:
                raise BudgetExceededError(
                    f"client partition {pid}: phi-y release {sweeps + 1} refused: the run "
                    f"planned (and checked) {plan.sweeps} sweeps")
            out[C.PHI_Y] = release_rhs(stats, readout, plan.rho_sweep, source, ledger,
                                       sweeps + 1)
            sweeps += 1
            sigma = sigma_of(stats.rhs_sensitivity, plan.rho_sweep)
        context.state[STATE_META] = ConfigRecord({"sweeps": sweeps})
        metrics.update(ledger_metrics(ledger, sigma))
    return out, metrics
