"""``fedqhd privacy audit --release fedqhd``: private FedQHD's readout release, audited on two
real neighbouring CartPole shards (one episode added), stays below its claim with power, and
a mechanism with a tenth of the noise is flagged.

The tests draw seeded numpy noise (1e5 releases in a fraction of a second); OpenDP's secure
sampler, the nodes' default and ``--noise opendp`` on the command line, draws ~50 us a
sample, so it only gets a small run that checks its claim (OpenDP's own map)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedqhd.commands.main import main
from fedqhd.config import RunConfig
from fedqhd.data import Shard
from fedqhd.learners.fqi import private_model
from fedqhd.privacy import NumpyNoise, OpenDPNoise
from fedqhd.privacy.audit import ScaledNoise
from fedqhd.studies.fedqhd_audit import audit_private_fedqhd, neighbouring_releases

M, R = 4, 0.05
CFG = RunConfig(privacy="zcdp", hd_dim=8, privacy_chunks=M, privacy_clip_norm=R, seed=0)


@pytest.fixture(scope="module")
def neighbours():
    return neighbouring_releases(CFG)


def _episodes(shard: Shard) -> list[bytes]:
    """Each episode's content (ids aside), sorted: what makes two shards neighbours."""
    out = []
    for eid in np.unique(shard.episode_ids):
        rows = shard.episode_ids == eid
        out.append(b"".join(np.ascontiguousarray(a[rows]).tobytes() for a in (
            shard.observations, shard.actions, shard.rewards, shard.next_observations,
            shard.terminated, shard.truncated)))
    return sorted(out)


def test_neighbours_differ_in_one_episode_and_move_nearly_the_sensitivity(neighbours):
    d, d_prime = _episodes(neighbours.d), _episodes(neighbours.d_prime)
    added = list(d_prime)
    for episode in d:
        added.remove(episode)  # every episode of D is in D'
    assert len(added) == 1 and len(d_prime) == len(d) + 1
    # the releases are the learner's own, from scratch on the whole shards
    np.testing.assert_array_equal(neighbours.release_d, private_model(CFG, neighbours.d).readout())
    np.testing.assert_array_equal(neighbours.release_d_prime,
                                  private_model(CFG, neighbours.d_prime).readout())
    assert neighbours.sensitivity == pytest.approx(2 * R / M)
    # beyond the empty chunk's R/m, near the worst case 2R/m, never past it
    assert 0.9 * 2 * R / M < neighbours.distance <= 2 * R / M * (1 + 1e-9)


def _audit(neighbours, rho: float, factor: float = 1.0):
    source = NumpyNoise(0) if factor == 1 else ScaledNoise(NumpyNoise(0), factor)
    return audit_private_fedqhd(neighbours, rho, source, 100_000, seed=0)


@pytest.mark.parametrize("rho, least, claim", [(0.1, 0.8, 1.760), (1.0, 3.0, 6.573)])
def test_bound_stays_below_the_claim_and_has_power(neighbours, rho, least, claim):
    res = _audit(neighbours, rho)
    assert res.claim_conversion == "exact-gaussian"
    assert res.claimed_epsilon == pytest.approx(claim, abs=1e-3)
    assert least < res.epsilon_lower_bound < res.claimed_epsilon and not res.flagged
    assert res.neighbour_l2 == {"readout": pytest.approx(neighbours.distance)}
    assert res.sensitivity_l2 == pytest.approx(2 * R / M)


@pytest.mark.parametrize("rho", [0.1, 1.0])
def test_a_mechanism_with_a_tenth_of_the_noise_is_flagged(neighbours, rho):
    res = _audit(neighbours, rho, factor=0.1)
    assert res.flagged and res.epsilon_lower_bound > res.claimed_epsilon + 1
    assert "BROKEN" in res.noise and res.noise_scale_factor == 0.1


def test_opendp_release_is_claimed_by_opendp_s_map(neighbours):
    res = audit_private_fedqhd(neighbours, 1.0, OpenDPNoise(), 200)
    assert res.claim_conversion == "opendp" and res.seed is None
    assert res.claimed_epsilon == pytest.approx(res.epsilon_opendp)
    assert not res.flagged


def test_cli_exit_code_and_json(tmp_path, capsys):
    common = ["privacy", "audit", "--release", "fedqhd", "--rho", "1", "--releases", "20000",
              "--hd-dim", "8", "--episodes", "60"]
    assert main([*common, "--out", str(tmp_path / "ok.json")]) == 0
    out = capsys.readouterr().out
    assert "private FedQHD readout release" in out and "of the sensitivity = 0.025" in out
    assert "consistent" in out
    assert main([*common, "--noise-scale-factor", "0.1", "--out", str(tmp_path / "bad.json")]) == 1
    out = capsys.readouterr().out
    assert "FLAGGED" in out and "claimed epsilon (exact-gaussian): 6.573" in out
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["flagged"] and bad["release"] == "fedqhd" and bad["neighbours"] == "add"
    assert bad["chunks"] == 4 and bad["episodes_d"] + 1 <= 60
    assert main([*common, "--clipped"]) == 2  # POOL's option: refused, not ignored


def test_anchor_release_audit_below_its_claim_and_weakened_flagged():
    """The heterogeneous release (advantages on M anchors, client 0's own encoder): the
    neighbours are the learner's own releases, one episode apart, moving most of
    2R sqrt(M)/m; the honest bound stays below the claim, a tenth of the noise is flagged."""
    from fedqhd.anchors import make_anchors

    cfg = CFG.replace(encoder="heterogeneous")
    anchors = make_anchors("uniform", cfg.env_id, 12, seed=0)
    nb = neighbouring_releases(cfg, 60, anchors)
    assert len(_episodes(nb.d_prime)) == len(_episodes(nb.d)) + 1
    np.testing.assert_array_equal(nb.release_d, private_model(cfg, nb.d, 0, anchors).readout())
    assert nb.release_d.shape == (12, 2)
    assert nb.sensitivity == pytest.approx(2 * R * np.sqrt(12) / M)
    assert 0.5 * nb.sensitivity < nb.distance <= nb.sensitivity * (1 + 1e-9)
    honest = _audit(nb, 1.0)
    assert 2.0 < honest.epsilon_lower_bound < honest.claimed_epsilon and not honest.flagged
    assert _audit(nb, 1.0, factor=0.1).flagged
