"""FedQHDPrivateExact: pooled ridge FQI from the clients' NOISY sufficient statistics.

The clients of a private run (run-config ``privacy = "zcdp"``,
:mod:`fedqhd.learners.fqi_private`) release their per-action Grams once and ``phi-y``
every round under rho-zCDP per trajectory; everything here is post-processing of those
releases, so it costs no privacy:

* the noisy Grams are summed and each action's sum is projected onto the PSD cone
  (symmetric eigendecomposition, negative eigenvalues set to 0: the nearest PSD matrix in
  Frobenius norm), and solved with the ridge raised by ``noise_ridge``, so
  ``G_psd + (ridge + noise_ridge) I`` is positive definite and every solve is well-posed;
  the extra ridge damps the positive noise directions the projection keeps. ``None``
  (auto): the spectral norm the summed noise reaches, ``sqrt(2 n D) sigma_G`` for n
  clients with Gram noise ``sigma_G`` each (diagonal variance ``n sigma_G^2``,
  off-diagonal ``n sigma_G^2 / 2``: a scaled GOE matrix, whose norm is about
  ``2 sqrt(D)`` times its off-diagonal standard deviation);
* targets are kept in the PUBLIC ``value_range`` (the clients clip to the same range
  themselves and never use the one sent);
* the checks FedQHDExact makes of exact statistics (non-negative diagonals, traces,
  Cauchy-Schwarz, counts) do not hold for noisy ones and the clients claim no sizes (a
  shard's size is private under add/remove-one-trajectory neighbours): a reply is checked
  for shapes and finiteness only, and clients are weighted uniformly. What bounds a
  client's influence is its own clipping, not the server.

Clients are keyed by node id, as in FedQHDExact; the Gram of a node is held once.
"""

from __future__ import annotations

import math
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from fedqhd.gram import GramSystems

from . import contract as C
from .exact import FedQHDExact, _Statistics
from .screening import decode_array


def psd_projection(gram: np.ndarray) -> np.ndarray:
    """The nearest PSD matrix (Frobenius) of the symmetric part of ``gram``."""
    sym = (gram + gram.T) / 2.0
    values, vectors = np.linalg.eigh(sym)
    out: np.ndarray = (vectors * np.maximum(values, 0.0)) @ vectors.T
    return out


class FedQHDPrivateExact(FedQHDExact):
    """FedQHDExact on noisy statistics (see the module docstring).

    Parameters
    ----------
    dim, n_actions, gamma, ridge
        As in :class:`FedQHDExact`.
    value_range : (lo, hi)
        The public range every target is kept in.
    gram_sigma : float
        The noise scale of one client's Gram release (public: the run's sensitivity and
        rho); sets the automatic ``noise_ridge``.
    noise_ridge : float or None
        Ridge added to the PSD-projected sums; ``None``: automatic (module docstring).
    **kwargs
        As for :class:`FedQHDExact` (sampling, safeguards).
    """

    def __init__(self, dim: int, n_actions: int, gamma: float, ridge: float,
                 value_range: tuple[float, float], gram_sigma: float,
                 noise_ridge: float | None = None, **kwargs: Any) -> None:
        kwargs.pop("max_feature_sq_norm", None)
        super().__init__(dim, n_actions, gamma, ridge, bounded=True, **kwargs)
        self.value_range = (float(value_range[0]), float(value_range[1]))
        self.gram_sigma = float(gram_sigma)
        self.noise_ridge = noise_ridge
        #: the extra ridge of the last solve (recorded in the round's metrics)
        self.last_noise_ridge = 0.0

    def summary(self) -> None:
        super().summary()
        log(INFO, "\t└──> Private (noisy statistics): PSD projection, noise ridge %s",
            "auto" if self.noise_ridge is None else self.noise_ridge)

    @property
    def q_range(self) -> tuple[float, float] | None:
        return self.value_range

    def noise_ridge_for(self, n_clients: int) -> float:
        """The ridge added to the projected sum of ``n_clients`` noisy Grams."""
        if self.noise_ridge is not None:
            return float(self.noise_ridge)
        return math.sqrt(2.0 * max(n_clients, 1) * self.dim) * self.gram_sigma

    def _make_systems(self) -> GramSystems:
        n_clients = sum(1 for n in self._have.values() if n > 0)
        self.last_noise_ridge = self.noise_ridge_for(n_clients)
        projected = np.stack([psd_projection(g) for g in self._grams])
        return GramSystems(projected, self.ridge + self.last_noise_ridge, self.proximal)

    def _screen_statistics(self, candidates: list[_Statistics]) -> list[str | None]:
        return [None] * len(candidates)  # noisy statistics obey none of the exact checks

    def _decode_statistics(self, msg: Message, node: int, metrics: dict[str, float],
                           rhs: np.ndarray | None) -> tuple[str | None, _Statistics | None]:
        record = msg.content.get(C.ARRAYS)
        has_gram = record is not None and C.GRAM in record
        if not has_gram and self._have.get(node, 0) == 0:
            return f"no '{C.GRAM}' sent and none held for this node", None
        zeros = np.zeros(self.n_actions)
        stats = _Statistics(node, metrics, 1.0, np.asarray(self.value_range), zeros, rhs,
                            diag=np.zeros((self.n_actions, self.dim)), new_counts=zeros)
        if not has_gram:
            return None, stats
        expected = (self.n_actions, self.dim * (self.dim + 1) // 2)
        reason, gram = decode_array(record[C.GRAM], expected)  # type: ignore[index]
        if reason is not None or gram is None:
            return f"'{C.GRAM}': {reason}", None
        if not np.all(np.isfinite(gram)):
            return f"'{C.GRAM}' holds non-finite values", None
        stats.gram = gram
        return None, stats
