"""Neighbouring private-FedQHD releases for the privacy audit (:mod:`fedqhd.privacy.audit`).

Private FedQHD (:mod:`fedqhd.learners.fqi_private`) protects one episode, add/remove:
D' = D plus one episode, which lands in one chunk ``j`` and moves the release (before
noise) by ``||c_j(D') - c_j(D)|| / m <= 2R/m``. The audit is only as strong as this
distance is close to ``2R/m``: an added episode landing in a chunk empty in D reaches
``R/m`` (half the sensitivity, a quarter of the rho), a pair that turns the chunk's
clipped readout around reaches more.

Construction (nothing fetched): a pool of CartPole episodes with uniform random actions
(:func:`~fedqhd.data.collect_shard`), each in its chunk by its own hash. For every chunk
``j``, every episode ``e0`` of the pool in ``j`` (or none: the empty chunk) and every
other ``e1`` in ``j``, the chunk's clipped readout with ``{e0}`` and with ``{e0, e1}`` is
fitted by the learner's own model (:func:`~fedqhd.learners.fqi.private_model`), and the
pair moving it the most is kept. D is ``e0`` plus every pool episode of the other chunks,
D' is D plus ``e1``; both releases are then computed from scratch on the whole shards.
With R small enough that every chunk's readout is clipped (only directions matter), 120
episodes reach about 0.94 of ``2R/m``. With ``anchors`` (heterogeneous encoders) the release
is the chunks' advantages on those states, in client 0's own encoder, sensitivity
``2R sqrt(M)/m``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedqhd.config import RunConfig
from fedqhd.data import Shard, collect_shard
from fedqhd.learners.fqi import private_model
from fedqhd.learners.fqi_private import episode_chunks, release_readout
from fedqhd.privacy.audit import AuditResult, audit_real_release
from fedqhd.privacy.noise import NoiseSource

EPISODES = 120  #: pool of random episodes searched for the worst-case pair


@dataclass(frozen=True)
class NeighbouringReleases:
    """Two neighbouring shards and their pre-noise releases ``mean_j c_j``."""

    d: Shard
    d_prime: Shard
    added_episode: int  #: id (in both pools) of the episode D' adds
    chunk: int          #: the chunk it lands in
    release_d: np.ndarray
    release_d_prime: np.ndarray
    sensitivity: float  #: 2R/m, what the noise is calibrated for

    @property
    def distance(self) -> float:
        """L2 distance between the two pre-noise releases (at most the sensitivity)."""
        return float(np.linalg.norm(self.release_d_prime - self.release_d))


def _episodes(pool: Shard, ids: Sequence[int]) -> Shard:
    """The shard of ``pool``'s episodes ``ids`` (rows in pool order)."""
    rows = np.isin(pool.episode_ids, np.asarray(ids, dtype=np.int64))
    arrays: dict[str, Any] = {k: v[rows] for k, v in pool.arrays().items()}  # Any: for **
    return Shard(**arrays, metadata={**pool.metadata, "n_episodes": len(ids)})


def neighbouring_releases(cfg: RunConfig, episodes: int = EPISODES,
                          anchors: np.ndarray | None = None) -> NeighbouringReleases:
    """D and D' = D + one episode, chosen to move the release nearly its sensitivity
    (module docstring); ``cfg`` sets the env, the encoder, m, R, the fit and the data's
    seed; ``anchors``: the release on these states (heterogeneous encoders)."""
    pool = collect_shard(cfg.env_id, episodes, 1.0, cfg.seed)
    ids, first = np.unique(pool.episode_ids, return_index=True)
    chunk_of = dict(zip(ids.tolist(), episode_chunks(pool, cfg.privacy_chunks)[first].tolist(),
                        strict=True))

    def model(shard: Shard) -> Any:
        return private_model(cfg, shard, 0, anchors)

    probe = model(_episodes(pool, ids[:1].tolist()))  # nothing fitted: the shapes
    shape = (probe.dim if anchors is None else len(anchors), probe.n_actions)
    best = (-1.0, -1, -1, -1)  # (moved, e0 or -1, e1, chunk)
    for j in range(cfg.privacy_chunks):
        members = [e for e in ids.tolist() if chunk_of[e] == j]
        for e0 in [-1, *members]:
            base = [] if e0 < 0 else [e0]
            before = (model(_episodes(pool, base)).chunk_readout(j) if base
                      else np.zeros(shape))  # an empty chunk's readout is the public zero
            for e1 in members:
                if e1 != e0:
                    after = model(_episodes(pool, [*base, e1])).chunk_readout(j)
                    moved = float(np.linalg.norm(after - before))
                    if moved > best[0]:
                        best = (moved, e0, e1, j)
    _, e0, e1, j = best
    if e1 < 0:
        raise ValueError(f"no chunk holds two of the {episodes} episodes: use more episodes")
    in_d = [e for e in ids.tolist() if chunk_of[e] != j] + ([e0] if e0 >= 0 else [])
    d, d_prime = _episodes(pool, in_d), _episodes(pool, [*in_d, e1])
    fitted = model(d)
    return NeighbouringReleases(d, d_prime, e1, j, fitted.readout(), model(d_prime).readout(),
                                fitted.sensitivity)


@dataclass(frozen=True)
class _Copies:
    """``m`` copies of a readout, for :func:`release_readout` to noise at once."""

    values: np.ndarray
    sensitivity: float

    def readout(self) -> np.ndarray:
        return self.values


def audit_private_fedqhd(neighbours: NeighbouringReleases, rho: float, source: NoiseSource,
                         releases: int = 100_000, delta: float = 1e-5,
                         confidence: float = 0.95, seed: int | None = None) -> AuditResult:
    """Audit private FedQHD's release on ``neighbours`` at ``rho``: every release goes
    through :func:`~fedqhd.learners.fqi_private.release_readout`, the function the client
    calls, with ``source`` (a :class:`~fedqhd.privacy.audit.ScaledNoise` to weaken it)."""
    def release(batch: np.ndarray) -> np.ndarray:
        return release_readout(_Copies(batch, neighbours.sensitivity), rho, source, None)

    return audit_real_release(neighbours.release_d, neighbours.release_d_prime, release, rho,
                              neighbours.sensitivity, source, releases, delta, confidence,
                              seed, name="readout")
