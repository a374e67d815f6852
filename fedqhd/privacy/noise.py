"""Noise sources: one interface, a reproducible one and a secure one.

Experiments need bit-for-bit reproducible noise, which a seeded numpy
generator gives but which is **not** suitable for protecting real data (its
state is predictable and floating-point Gaussians leak through their low
bits). Real releases should use :class:`OpenDPNoise`, which samples the
discrete Gaussian exactly from a cryptographically secure generator; it is the
default of the Flower app. A :class:`NumpyNoise` without a seed draws its seed
from fresh OS entropy, so noise seeded from a run config (which anyone holding
the config can regenerate, recovering every unclipped count) only happens when
a node asks for it (node config ``reproducible-noise = true``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class NoiseSource(Protocol):
    """Adds zero-mean Gaussian noise of standard deviation ``sigma``.

    Attributes
    ----------
    secure : bool
        Whether the sampler is fit for protecting real data.
    reproducible : bool
        Whether the noise can be regenerated from a known seed (then it hides nothing
        from whoever knows the seed).
    label : str
        Short name recorded in ledgers and results.
    """

    secure: bool
    reproducible: bool
    label: str

    def add_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        """Return ``values`` plus independent noise with scale ``sigma``."""
        ...


class NumpyNoise:
    """Seeded continuous Gaussian noise from numpy. NOT SECURE: experiments only.

    Parameters
    ----------
    random_state : int, numpy Generator or None
        Seed (or generator) making the noise reproducible; ``None`` seeds from fresh OS
        entropy (:class:`numpy.random.SeedSequence`), never recorded anywhere.
    """

    secure = False

    def __init__(self, random_state: int | np.random.Generator | None = None) -> None:
        self.reproducible = random_state is not None
        self.label = ("numpy-seeded (NOT secure)" if self.reproducible
                      else "numpy-fresh-entropy (NOT secure)")
        self.rng = np.random.default_rng(np.random.SeedSequence() if random_state is None
                                         else random_state)

    def add_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        if sigma == 0:
            return values.copy()
        return values + self.rng.normal(0.0, sigma, size=values.shape)

    #: real values take the same continuous Gaussian
    add_real_noise = add_noise

    @property
    def real_label(self) -> str:
        return self.label


class OpenDPNoise:
    """OpenDP's discrete Gaussian on integer values (secure sampling).

    The discrete Gaussian with scale ``sigma`` on integer counts gives exactly
    the same rho-zCDP as the continuous one (Canonne, Kamath & Steinke 2020),
    so calibration is shared with :class:`NumpyNoise`. Output is integer-valued
    (returned as float for a uniform interface).
    """

    secure = True
    reproducible = False
    label = "opendp-discrete-gaussian"

    def __init__(self) -> None:
        import opendp.prelude as dp

        dp.enable_features("contrib")
        self._dp = dp

    def add_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        values = np.asarray(values)
        if not np.issubdtype(values.dtype, np.integer):
            if not np.all(np.equal(np.mod(values, 1), 0)):
                raise ValueError("OpenDPNoise adds discrete Gaussian noise to integer counts only")
            values = values.astype(np.int64)
        if sigma == 0:
            return values.astype(float)
        dp = self._dp
        meas = dp.m.make_gaussian(
            dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int), scale=float(sigma)
        )
        flat = [int(v) for v in values.ravel()]
        return np.asarray(meas(flat), dtype=float).reshape(values.shape)

    def add_real_noise(self, values: np.ndarray, sigma: float) -> np.ndarray:
        """Real-valued ``values`` plus OpenDP's Gaussian for floats: a discrete Gaussian on
        the finest float lattice, sampled securely, whose OpenDP privacy map is exactly
        ``Delta^2 / (2 sigma^2)`` (checked by :func:`~fedqhd.privacy.release_real`)."""
        values = np.asarray(values, dtype=float)
        if sigma == 0:
            return values.copy()
        meas = self.real_measurement(sigma)
        return np.asarray(meas([float(v) for v in values.ravel()]),
                          dtype=float).reshape(values.shape)

    def real_measurement(self, sigma: float) -> Any:
        """OpenDP's Gaussian measurement on float vectors (L2 metric) at scale ``sigma``."""
        dp = self._dp
        return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=float, nan=False)),
                                  dp.l2_distance(T=float), scale=float(sigma))

    #: what a ledger entry of a real-valued release names as its sampler (a discrete
    #: Gaussian, so the ledger converts with OpenDP's map)
    real_label = "opendp-discrete-gaussian (float lattice)"


#: noise kinds a client may be configured with: two sources, or none (non-private baseline)
NOISE_KINDS: tuple[str, ...] = ("numpy", "opendp", "none")


def make_noise_source(kind: str, random_state: int | None = None) -> NoiseSource:
    """Build a noise source by name: ``"numpy"`` (not secure; seeded only when
    ``random_state`` is given, else fresh entropy) or ``"opendp"`` (never seeded)."""
    if kind == "numpy":
        return NumpyNoise(random_state)
    if kind == "opendp":
        return OpenDPNoise()
    raise ValueError(f"unknown noise source {kind!r}; expected 'numpy' or 'opendp'")
