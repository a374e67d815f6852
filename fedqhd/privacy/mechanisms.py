"""The Gaussian mechanism calibrated for rho-zCDP.

A function with L2 sensitivity ``Delta`` released with N(0, sigma^2) noise is
``Delta^2 / (2 sigma^2)``-zCDP (Bun & Steinke 2016, Prop. 1.6), so the scale
for a target rho is ``sigma = Delta / sqrt(2 rho)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedqhd.privacy.ledger import PrivacyLedger
from fedqhd.privacy.noise import NoiseSource


def gaussian_sigma(sensitivity_l2: float, rho: float) -> float:
    """Noise scale giving rho-zCDP for a query with the given L2 sensitivity."""
    if rho <= 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be positive and finite, got {rho}")
    if sensitivity_l2 < 0:
        raise ValueError("sensitivity must be non-negative")
    return sensitivity_l2 / math.sqrt(2.0 * rho)


@dataclass(frozen=True)
class GaussianMechanism:
    """Gaussian mechanism for rho-zCDP.

    Parameters
    ----------
    sensitivity_l2 : float
        L2 sensitivity of the released vector between neighbouring datasets.
    rho : float
        zCDP parameter this release costs.
    """

    sensitivity_l2: float
    rho: float

    @property
    def sigma(self) -> float:
        return gaussian_sigma(self.sensitivity_l2, self.rho)

    def release(
        self,
        values: np.ndarray,
        source: NoiseSource,
        ledger: PrivacyLedger | None = None,
        label: str = "gaussian",
    ) -> np.ndarray:
        """Charge the ledger (refusing beyond budget), then return noisy values."""
        if ledger is not None:
            ledger.spend(self.rho, label=label, mechanism="gaussian", sigma=self.sigma,
                         noise=source.label, secure=bool(source.secure),
                         reproducible=bool(source.reproducible))
        return source.add_noise(values, self.sigma)


@dataclass(frozen=True)
class CountRelease:
    """Noisy count families and the noise scale every entry got."""

    values: dict[str, np.ndarray]
    sigma: float


def release_counts(
    families: Mapping[str, np.ndarray],
    rho: float,
    sensitivity_l2: float,
    source: NoiseSource,
    ledger: PrivacyLedger | None = None,
    clip_at_zero: bool = True,
) -> CountRelease:
    """Release several count families, splitting ``rho`` equally (zCDP composes additively).

    Each family gets ``rho / k`` and noise ``sigma = sensitivity / sqrt(2 rho / k)``;
    with two families and ``sensitivity^2 = 2H`` (one trajectory replaced moves
    2H counts by one) this is the POOL calibration
    ``sigma^2 = 2H / rho``. The whole budget is checked before any noise is drawn. Each
    family is one ledger entry, recording the sampler and whether it is ``secure``.
    """
    k = len(families)
    if k == 0:
        raise ValueError("no count families to release")
    if ledger is not None:
        ledger.check(rho)
    mech = GaussianMechanism(sensitivity_l2, rho / k)
    out = {}
    for name, counts in families.items():
        noisy = mech.release(counts, source, ledger, label=name)
        out[name] = np.maximum(noisy, 0.0) if clip_at_zero else noisy
    return CountRelease(out, mech.sigma)


def release_real(values: np.ndarray, sensitivity_l2: float, rho: float, source: NoiseSource,
                 ledger: PrivacyLedger | None = None, label: str = "gaussian") -> np.ndarray:
    """Release real-valued ``values`` (L2 sensitivity ``sensitivity_l2``) under rho-zCDP.

    The noise scale is ``sigma = Delta / sqrt(2 rho)``. The ledger is charged first (a
    release beyond the budget is refused before any noise is drawn). A source without a
    real-valued sampler is refused: :class:`OpenDPNoise`'s integer sampler would need the
    values rounded, which changes the sensitivity. With OpenDP, its own privacy map of the
    measurement is checked to give at most ``rho`` at ``Delta`` before the release.
    """
    add = getattr(source, "add_real_noise", None)
    if add is None:
        raise TypeError(f"noise source {source.label!r} has no real-valued sampler")
    sigma = gaussian_sigma(sensitivity_l2, rho)
    measurement = getattr(source, "real_measurement", None)
    if measurement is not None and sensitivity_l2 > 0:
        certified = float(measurement(sigma).map(float(sensitivity_l2)))
        if certified > rho * (1 + 1e-9):
            raise RuntimeError(f"OpenDP certifies rho {certified:g} for this release, above the "
                               f"{rho:g} charged")
    real_label = str(getattr(source, "real_label", source.label))
    if ledger is not None:
        ledger.spend(rho, label=label, mechanism="gaussian", sigma=sigma,
                     sensitivity=float(sensitivity_l2), noise=real_label,
                     secure=bool(source.secure), reproducible=bool(source.reproducible))
    out: np.ndarray = add(values, sigma)
    return out
