"""Differential-privacy primitives that know nothing of RL.

* :mod:`.noise` -- noise sources behind one interface: :class:`NumpyNoise`
  (seeded, reproducible, **not secure**) and :class:`OpenDPNoise` (OpenDP's
  discrete Gaussian on integers, cryptographically secure sampling).
* :mod:`.mechanisms` -- the Gaussian mechanism calibrated for rho-zCDP from an
  L2 sensitivity, and :func:`release_counts` for families of visit counts, :func:`release_real`
  for real-valued statistics (private FedQHD's Grams and phi-y).
* :mod:`.ledger` -- a per-client :class:`PrivacyLedger`: composed rho,
  (epsilon, delta) by the CKS conversion and by the exact analytic Gaussian,
  refusal of releases beyond the budget, JSON round trip.
* :mod:`.store` -- a node's ledgers on disk, one per data fingerprint, so the
  budget holds across runs and restarts.
* :mod:`.audit` -- an empirical epsilon lower bound of a Gaussian release (POOL's counts,
  private FedQHD's readout; ``fedqhd privacy audit``), to refute a broken mechanism.
"""

from fedqhd.privacy.ledger import (
    BudgetExceededError,
    PrivacyLedger,
    epsilon_cks,
    epsilon_exact,
    epsilon_opendp,
)
from fedqhd.privacy.mechanisms import (
    CountRelease,
    GaussianMechanism,
    gaussian_sigma,
    release_counts,
    release_real,
)
from fedqhd.privacy.noise import (
    NOISE_KINDS,
    NoiseSource,
    NumpyNoise,
    OpenDPNoise,
    make_noise_source,
)

__all__ = [
    "NOISE_KINDS",
    "BudgetExceededError",
    "CountRelease",
    "GaussianMechanism",
    "NoiseSource",
    "NumpyNoise",
    "OpenDPNoise",
    "PrivacyLedger",
    "epsilon_cks",
    "epsilon_exact",
    "epsilon_opendp",
    "gaussian_sigma",
    "make_noise_source",
    "release_counts",
    "release_real",
]
