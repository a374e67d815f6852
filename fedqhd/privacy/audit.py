"""Empirical privacy audit of a Gaussian release: an epsilon LOWER bound.

(Unrelated to :mod:`fedqhd.deploy.audit`, which audits file access.)

Two releases are audited, by one core (:func:`audit_statistic`, which takes a sampler
of the test statistic on each data set):

* POOL's counts (:func:`audit_release`). Given the counts of two neighbouring data
  sets D and D' (restricted to the entries where they differ; every other entry has
  the same distribution under both and is independent of these, so it carries no
  evidence), the mechanism is run many times on each, vectorised, through the real
  :func:`~fedqhd.privacy.release_counts` (same calibration). By default the audit sees
  the Gaussian mechanism's output before clipping at zero: that is what the claimed rho
  is proved for, and clipping is post-processing, which can only hide evidence (with
  sparse counts it hides most of it).
* A real array, e.g. private FedQHD's readout (:func:`audit_real_release`; the caller
  passes the code path that adds the noise, see :mod:`fedqhd.studies.fedqhd_audit`).

The distinguisher is the likelihood-ratio test of two Gaussians with equal (isotropic)
covariance: project the output onto the sensitivity direction ``x(D') - x(D)`` and
threshold. Half of the releases choose the threshold and its direction, the other half
measure its false-positive and false-negative rates, bounded by Clopper-Pearson at the
requested confidence (split between the two rates). A mechanism that is
(epsilon, delta)-DP must satisfy ``FPR * e^eps + FNR >= 1 - delta`` for every
test, so

    eps_lb = log((1 - delta - FNR_upper) / FPR_upper)

is a lower bound on the mechanism's true epsilon with that confidence. It stays
below a correct claim; a bound above the claim proves the claim false.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

from fedqhd.privacy.ledger import (
    conversion_for,
    epsilon_by,
    epsilon_cks,
    epsilon_exact,
    epsilon_opendp,
)
from fedqhd.privacy.mechanisms import release_counts
from fedqhd.privacy.noise import NoiseSource

CHUNK = 20_000  #: releases drawn per vectorised batch (bounds memory)
MIN_RELEASES = 100  #: the fewest releases per data set an audit takes (half of them measure)


class ScaledNoise:
    """A deliberately BROKEN source: ``inner``'s noise with its scale multiplied by
    ``factor`` while the ledger still claims the calibrated rho. For audits only."""

    def __init__(self, inner: NoiseSource, factor: float) -> None:
        if not factor > 0:
            raise ValueError(f"noise scale factor must be positive, got {factor}")
        self.inner, self.factor = inner, factor
        self.secure, self.reproducible = inner.secure, inner.reproducible
        self.label = inner.label if factor == 1 else f"{inner.label} x{factor:g} (BROKEN)"

    def add_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        return self.inner.add_noise(values, sigma * self.factor)

    def add_real_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        """The inner source's real-valued sampler, scaled alike (what
        :func:`~fedqhd.privacy.release_real` calls)."""
        add = getattr(self.inner, "add_real_noise", None)
        if add is None:
            raise TypeError(f"noise source {self.inner.label!r} has no real-valued sampler")
        out: np.ndarray = add(values, sigma * self.factor)
        return out


def clopper_pearson_upper(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound of a rate seen ``k`` times in ``n``, holding
    with probability 1 - alpha (vectorised over ``k``)."""
    k = np.asarray(k)
    with np.errstate(invalid="ignore"):
        hi = stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1))
    return np.where(k >= n, 1.0, hi)


def epsilon_bound(fp: np.ndarray | int, fn: np.ndarray | int, n_neg: int, n_pos: int,
                  delta: float, alpha: float) -> np.ndarray:
    """``log((1 - delta - FNR_up) / FPR_up)`` (-inf where the test shows nothing)."""
    gain = 1.0 - delta - clopper_pearson_upper(fn, n_pos, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gain > 0, np.log(np.maximum(gain, 1e-300)
                                         / clopper_pearson_upper(fp, n_neg, alpha)), -np.inf)


def _candidate_thresholds(values: np.ndarray, per_tail: int = 2000) -> np.ndarray:
    """Sample values spaced geometrically from both ends: dense in the tails, where the
    best thresholds of a high-epsilon test lie."""
    v = np.sort(values)
    n = len(v)
    ends = np.geomspace(1, n, per_tail).astype(np.int64) - 1
    return np.unique(v[np.concatenate([ends, n - 1 - ends])])


def _choose_threshold(s0: np.ndarray, s1: np.ndarray, delta: float, alpha: float
                      ) -> tuple[float, int]:
    """The (threshold, direction) with the best bound on these samples.

    Direction +1 says D' when the statistic is > t (errors: D above t, D' at or
    below it); -1 says D when it is < t (errors: D' below t, D at or above it).
    """
    s0, s1 = np.sort(s0), np.sort(s1)
    grid = _candidate_thresholds(np.concatenate([s0, s1]))
    best = (-np.inf, float(grid[0]), 1)
    for direction, (neg, pos) in ((1, (s0, s1)), (-1, (-s1[::-1], -s0[::-1]))):
        ts = direction * grid
        fp = len(neg) - np.searchsorted(neg, ts, side="right")  # negatives above t
        fn = np.searchsorted(pos, ts, side="right")              # positives at or below t
        eps = epsilon_bound(fp, fn, len(neg), len(pos), delta, alpha)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), float(grid[i]), direction)
    return best[1], best[2]


@dataclass(frozen=True)
class AuditResult:
    """What the audit measured and what the mechanism claims."""

    rho: float
    delta: float
    confidence: float
    releases: int
    sensitivity_l2: float
    neighbour_l2: dict[str, float]
    noise: str
    noise_scale_factor: float
    clipped: bool
    threshold: float
    direction: int
    false_positives: int
    false_negatives: int
    held_out: int
    epsilon_lower_bound: float
    claimed_epsilon: float
    claim_conversion: str
    epsilon_exact_gaussian: float
    epsilon_cks: float
    epsilon_opendp: float
    seed: int | None

    @property
    def flagged(self) -> bool:
        """The lower bound exceeds the claim: the mechanism is not what it claims."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "flagged": self.flagged}


#: ``sample(m)``: the projected statistic of ``m`` fresh releases on one data set
Sampler = Callable[[int], np.ndarray]


def _draw(sample: Sampler, releases: int) -> np.ndarray:
    """``releases`` statistics, drawn ``CHUNK`` at a time (memory stays bounded)."""
    out = np.empty(releases)
    for start in range(0, releases, CHUNK):
        m = min(CHUNK, releases - start)
        out[start:start + m] = sample(m)
    return out


def audit_statistic(sample_d: Sampler, sample_d_prime: Sampler, rho: float,
                    sensitivity_l2: float, neighbour_l2: dict[str, float], source: NoiseSource,
                    claim_noise: str, releases: int = 100_000, delta: float = 1e-5,
                    confidence: float = 0.95, seed: int | None = None,
                    clipped: bool = False) -> AuditResult:
    """The audit of any release, given samplers of its likelihood-ratio statistic on D and D'.

    Every release type shares this core (threshold on one half, Clopper-Pearson on the
    other, the claim); only how a release is drawn and projected differs. ``claim_noise``
    is the noise label the release's ledger entry records (it picks the claim's
    conversion); ``source`` may be a :class:`ScaledNoise`, whose honest inner source the
    claim is always about.
    """
    if releases < MIN_RELEASES:
        raise ValueError(f"releases = {releases}: an audit needs at least {MIN_RELEASES} per "
                         "data set")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    s0 = _draw(sample_d, releases)
    s1 = _draw(sample_d_prime, releases)
    half = releases // 2
    alpha = (1 - confidence) / 2  # two rates bounded: Bonferroni
    threshold, sign = _choose_threshold(s0[:half], s1[:half], delta, alpha)
    h0, h1 = s0[half:], s1[half:]
    if sign == 1:
        fp, fn = int(np.sum(h0 > threshold)), int(np.sum(h1 <= threshold))
    else:
        fp, fn = int(np.sum(h1 < threshold)), int(np.sum(h0 >= threshold))
    eps_lb = max(float(epsilon_bound(fp, fn, len(h0), len(h1), delta, alpha)), 0.0)
    conversion = conversion_for([claim_noise])
    factor = source.factor if isinstance(source, ScaledNoise) else 1.0
    return AuditResult(
        rho=rho, delta=delta, confidence=confidence, releases=releases,
        sensitivity_l2=sensitivity_l2, neighbour_l2=neighbour_l2,
        noise=source.label, noise_scale_factor=factor, clipped=clipped,
        threshold=threshold, direction=sign,
        false_positives=fp, false_negatives=fn, held_out=len(h0), epsilon_lower_bound=eps_lb,
        claimed_epsilon=epsilon_by(conversion, rho, delta), claim_conversion=conversion,
        epsilon_exact_gaussian=epsilon_exact(rho, delta), epsilon_cks=epsilon_cks(rho, delta),
        epsilon_opendp=epsilon_opendp(rho, delta), seed=seed)


def _honest(source: NoiseSource) -> NoiseSource:
    """The source a claim is about: a :class:`ScaledNoise`'s inner one."""
    return source.inner if isinstance(source, ScaledNoise) else source


def audit_release(counts_d: Mapping[str, np.ndarray], counts_d_prime: Mapping[str, np.ndarray],
                  rho: float, sensitivity_l2: float, source: NoiseSource, releases: int = 100_000,
                  delta: float = 1e-5, confidence: float = 0.95, seed: int | None = None,
                  clip_at_zero: bool = False) -> AuditResult:
    """Audit :func:`release_counts` at ``rho`` on two neighbouring count families.

    ``counts_d`` and ``counts_d_prime`` map family names to the same-shaped count
    arrays of D and D' (whole arrays or just the differing entries). ``source`` may
    be a :class:`ScaledNoise`; the claim is always that of its honest inner source.
    ``clip_at_zero`` audits the clipped output the learner sees instead of the
    mechanism's (a weaker test of the same claim).
    """
    if set(counts_d) != set(counts_d_prime):
        raise ValueError("D and D' must have the same count families")
    d0, d1 = {}, {}
    for k in counts_d:
        a, b = np.asarray(counts_d[k]).ravel(), np.asarray(counts_d_prime[k]).ravel()
        if a.shape != b.shape:
            raise ValueError(f"family {k!r}: D has {a.shape}, D' has {b.shape}")
        differ = a != b
        d0[k], d1[k] = a[differ].astype(np.int64), b[differ].astype(np.int64)
    direction = {k: (d1[k] - d0[k]).astype(float) for k in d0}
    if not any(v.size for v in direction.values()):
        raise ValueError("D and D' have identical counts: nothing to distinguish")

    def sampler(families: dict[str, np.ndarray]) -> Sampler:
        def sample(m: int) -> np.ndarray:
            batch = {k: np.broadcast_to(v, (m, v.size)).astype(np.int64)
                     for k, v in families.items()}
            noisy = release_counts(batch, rho, sensitivity_l2, source,
                                   clip_at_zero=clip_at_zero).values
            out: np.ndarray = sum((noisy[k] - d0[k]) @ direction[k] for k in families)
            return out
        return sample

    return audit_statistic(
        sampler(d0), sampler(d1), rho, sensitivity_l2,
        {k: float(np.linalg.norm(v)) for k, v in direction.items()}, source,
        _honest(source).label, releases, delta, confidence, seed, clip_at_zero)


def audit_real_release(values_d: np.ndarray, values_d_prime: np.ndarray,
                       release: Callable[[np.ndarray], np.ndarray], rho: float,
                       sensitivity_l2: float, source: NoiseSource, releases: int = 100_000,
                       delta: float = 1e-5, confidence: float = 0.95,
                       seed: int | None = None, name: str = "values") -> AuditResult:
    """Audit a Gaussian release of a real array at ``rho`` on two neighbouring pre-noise values.

    ``release(batch)`` must add the mechanism's noise to a batch ``(m, *shape)`` of
    copies, through the code under audit (e.g. :func:`~fedqhd.privacy.release_real`
    with ``source``). The noise is isotropic, so the likelihood-ratio test is the
    projection on ``values_d_prime - values_d``. ``name`` labels the neighbour distance.
    """
    x0 = np.asarray(values_d, dtype=float)
    x1 = np.asarray(values_d_prime, dtype=float)
    if x0.shape != x1.shape:
        raise ValueError(f"D's release has shape {x0.shape}, D''s {x1.shape}")
    direction = (x1 - x0).ravel()
    if not np.any(direction):
        raise ValueError("D and D' have identical releases: nothing to distinguish")

    def sampler(x: np.ndarray) -> Sampler:
        def sample(m: int) -> np.ndarray:
            noisy = np.asarray(release(np.broadcast_to(x, (m, *x.shape))))
            out: np.ndarray = (noisy - x0).reshape(m, -1) @ direction
            return out
        return sample

    honest = _honest(source)
    return audit_statistic(
        sampler(x0), sampler(x1), rho, sensitivity_l2,
        {name: float(np.linalg.norm(direction))}, source,
        str(getattr(honest, "real_label", honest.label)), releases, delta, confidence, seed)
