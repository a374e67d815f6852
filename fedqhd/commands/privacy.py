"""``fedqhd privacy audit``: an empirical epsilon lower bound of a release, printed beside
the claimed epsilon; exits 1 when the bound exceeds the claim. ``--release counts`` audits
POOL's count release, ``--release fedqhd`` private FedQHD's readout release.
``fedqhd privacy ledgers``: what a node's on-disk ledgers have spent, and their epsilon
(infinite for a shard released with regenerable, seeded noise)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from fedqhd.files import atomic_write

RELEASES = ("counts", "fedqhd")  #: what ``--release`` audits


def _audit_counts(a: argparse.Namespace, source: Any, seed: int | None
                  ) -> tuple[Any, str, dict[str, Any]]:
    """POOL's count release: its result, the header line, and what the JSON adds."""
    from fedqhd.learners import parse_run_config
    from fedqhd.pool.counts import count_sensitivity
    from fedqhd.privacy.audit import audit_release
    from fedqhd.studies.pool_audit import neighbouring_counts

    cfg = parse_run_config({
        "learner": "pool", "env-id": "fedqhd/Inventory-v0", "seed": a.seed, "privacy-rho": a.rho,
    }).with_pool(horizon=a.horizon, trajectories=a.trajectories)
    d, d_prime = neighbouring_counts(cfg, a.neighbours)
    res = audit_release(d, d_prime, a.rho, count_sensitivity(a.horizon), source, a.releases,
                        a.delta, a.confidence, seed=seed, clip_at_zero=a.clipped)
    moved = ", ".join(f"{k} {v:.3g}" for k, v in res.neighbour_l2.items())
    head = (f"POOL count release, H = {a.horizon}, rho = {a.rho:g}, delta = {a.delta:g}; "
            f"neighbours: {a.neighbours} one trajectory (L2 moved: {moved}; "
            f"calibrated sensitivity {res.sensitivity_l2:.3g} per family)")
    return res, head, {"neighbours": a.neighbours, "horizon": a.horizon,
                       "trajectories": a.trajectories}


def _audit_fedqhd(a: argparse.Namespace, source: Any, seed: int | None
                  ) -> tuple[Any, str, dict[str, Any]]:
    """Private FedQHD's release (readout, or anchor values): its result, the header line,
    the JSON's extras."""
    from fedqhd.anchors import make_anchors
    from fedqhd.learners import parse_run_config
    from fedqhd.studies.fedqhd_audit import audit_private_fedqhd, neighbouring_releases

    cfg = parse_run_config({
        "learner": "fqi", "env-id": "CartPole-v1", "seed": a.seed, "privacy": "zcdp",
        "privacy-rho": a.rho, "privacy-chunks": a.chunks, "privacy-clip-norm": a.clip_norm,
        "hd-dim": a.hd_dim, "encoder": "heterogeneous" if a.anchors else "shared"})
    anchors = (make_anchors("uniform", cfg.env_id, a.anchors, seed=a.seed) if a.anchors
               else None)
    nb = neighbouring_releases(cfg, a.episodes, anchors)
    res = audit_private_fedqhd(nb, a.rho, source, a.releases, a.delta, a.confidence, seed)
    what = (f"anchor release (M = {a.anchors}, client 0's own encoder)" if a.anchors
            else f"readout release (hd-dim {a.hd_dim})")
    head = (f"private FedQHD {what}, {cfg.env_id}, m = {a.chunks} chunks, "
            f"R = {a.clip_norm:g}, rho = {a.rho:g}, delta = {a.delta:g}; "
            f"neighbours: add one episode (D {nb.d.n_episodes} episodes, D' "
            f"{nb.d_prime.n_episodes}; L2 moved {nb.distance:.3g} = "
            f"{nb.distance / nb.sensitivity:.2f} of the sensitivity = "
            f"{nb.sensitivity:.3g})")
    return res, head, {"neighbours": "add", "env_id": cfg.env_id, "chunks": a.chunks,
                       "clip_norm": a.clip_norm, "hd_dim": a.hd_dim, "anchors": a.anchors,
                       "episodes_d": nb.d.n_episodes, "added_chunk": nb.chunk}


def _audit(a: argparse.Namespace) -> int:
    from fedqhd.privacy.audit import ScaledNoise
    from fedqhd.privacy.noise import NoiseSource, NumpyNoise, OpenDPNoise

    if a.release == "fedqhd" and (a.clipped or a.neighbours == "replace"):
        print("fedqhd privacy audit: error: --release fedqhd protects one episode added or "
              "removed (--neighbours add) and has no clipping at zero (--clipped)",
              file=sys.stderr)
        return 2
    a.neighbours = a.neighbours or ("replace" if a.release == "counts" else "add")
    inner: NoiseSource = NumpyNoise(a.seed) if a.noise == "numpy" else OpenDPNoise()
    # unwrapped when honest: release_real then checks OpenDP's own map, as in the learner
    source = inner if a.noise_scale_factor == 1 else ScaledNoise(inner, a.noise_scale_factor)
    seed = a.seed if a.noise == "numpy" else None
    t0 = time.perf_counter()
    res, head, extra = (_audit_counts if a.release == "counts" else _audit_fedqhd)(a, source,
                                                                                   seed)
    wall = time.perf_counter() - t0
    counts = a.release == "counts"
    print(head)
    clipping = ("clipped output; " if res.clipped else "before clipping; ") if counts else ""
    print(f"noise: {res.noise}; {clipping}{a.releases} releases per data set, seed {res.seed}, "
          f"{wall:.1f} s")
    side, x = ("D" if res.direction == -1 else "D'"), "c" if counts else "w"
    print(f"test: projection on {x}(D') - {x}(D), threshold {res.threshold:.3g} "
          f"({side} side), held out "
          f"{res.held_out} + {res.held_out}: FP {res.false_positives}, "
          f"FN {res.false_negatives}")
    print(f"epsilon lower bound ({res.confidence:.0%} Clopper-Pearson): "
          f"{res.epsilon_lower_bound:.3f}")
    print(f"claimed epsilon ({res.claim_conversion}): {res.claimed_epsilon:.3f}   "
          f"[exact Gaussian {res.epsilon_exact_gaussian:.3f}, OpenDP discrete-Gaussian map "
          f"{res.epsilon_opendp:.3f}, CKS {res.epsilon_cks:.3f}]")
    if res.seed is not None:
        print("note: the audit seeds its numpy noise to repeat its draws; the claim is the "
              "mechanism's epsilon for noise nobody can regenerate (a release whose seed is "
              "known has epsilon = inf)")
    verdict = ("FLAGGED: the lower bound exceeds the claim; this mechanism is not "
               f"{a.rho:g}-zCDP" if res.flagged else "consistent: the bound stays below the claim")
    print(verdict)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, json.dumps({**res.to_dict(), "release": a.release, **extra,
                                      "wall-time-s": round(wall, 2)}, indent=1))
        print(f"wrote {out}")
    return 1 if res.flagged else 0


def _ledgers(a: argparse.Namespace) -> int:
    from fedqhd.privacy.store import LedgerStore, ledger_dir

    store = LedgerStore(a.ledger_dir or ledger_dir({}))
    paths = sorted(store.directory.glob("*.json")) if store.directory.is_dir() else []
    print(f"{len(paths)} ledger(s) in {store.directory}")
    for path in paths:
        ledger = store.read(path.stem)
        assert ledger is not None
        eps = ledger.epsilon()
        shown = (f"inf ({ledger.conversion}: seeded noise, no privacy)" if eps == float("inf")
                 else f"{eps:.3f} ({ledger.conversion})")
        print(f"{path.stem[:12]}  {ledger.client_id}: rho spent {ledger.rho_spent:g} of "
              f"{ledger.budget_rho:g} in {len(ledger.entries)} entries; epsilon at delta "
              f"{ledger.delta:g}: {shown}")
    return 0


def register(subparsers) -> None:
    """Add ``fedqhd privacy audit`` to the dispatcher."""
    p = subparsers.add_parser("privacy", help="privacy tools (audit of a release, ledgers)")
    sub = p.add_subparsers(dest="privacy_command", required=True)
    a = sub.add_parser("audit", help="empirical epsilon lower bound vs the claimed epsilon "
                       "(exit 1 when the claim is refuted)")
    a.add_argument("--rho", type=float, default=1.0, help="zCDP rho the release claims")
    a.add_argument("--delta", type=float, default=1e-5)
    a.add_argument("--releases", type=int, default=1_000_000,
                   help="releases per data set (half choose the threshold, half measure)")
    a.add_argument("--confidence", type=float, default=0.95,
                   help="confidence of the Clopper-Pearson bound")
    a.add_argument("--release", choices=RELEASES, default="counts",
                   help="what to audit: POOL's count release, or private FedQHD's readout "
                   "release (CartPole episodes, one episode added)")
    a.add_argument("--neighbours", choices=["replace", "add"], default=None,
                   help="counts: D' = D with one trajectory replaced (POOL's relation, the "
                   "default) or added; fedqhd: add only")
    a.add_argument("--noise", choices=["numpy", "opendp"], default="numpy",
                   help="sampler: numpy (fast, vectorised) or OpenDP's secure discrete Gaussian "
                   "(the nodes' default; exact but ~60 us a sample: use --releases of a few "
                   "thousand)")
    a.add_argument("--noise-scale-factor", type=float, default=1.0,
                   help="multiply the noise scale (0.1: a deliberately broken mechanism)")
    a.add_argument("--clipped", action="store_true",
                   help="counts: audit the output clipped at zero (post-processing: a weaker "
                   "test)")
    a.add_argument("--horizon", type=int, default=7, help="counts: H (trajectory length)")
    a.add_argument("--trajectories", type=int, default=1000, help="counts: trajectories in D")
    a.add_argument("--chunks", type=int, default=4, help="fedqhd: m, the episode chunks")
    a.add_argument("--clip-norm", type=float, default=0.05,
                   help="fedqhd: R, each chunk's clip norm (small: every chunk is clipped, "
                   "the worst case)")
    a.add_argument("--hd-dim", type=int, default=16, help="fedqhd: the encoder's dimension")
    a.add_argument("--anchors", type=int, default=0,
                   help="fedqhd: M > 0 audits the heterogeneous release (the chunks' "
                   "advantages on M uniform anchor states, client 0's own encoder)")
    a.add_argument("--episodes", type=int, default=120,
                   help="fedqhd: random CartPole episodes searched for the worst-case pair")
    a.add_argument("--seed", type=int, default=0, help="seeds the data and numpy noise")
    a.add_argument("--out", default="", help="write the result as JSON here")
    a.set_defaults(func=_audit)
    led = sub.add_parser("ledgers", help="a node's privacy ledgers: rho spent, budget, epsilon")
    led.add_argument("--ledger-dir", default="", help="the node's ledger folder (default: "
                     "$FEDQHD_LEDGER_DIR, else ~/.fedqhd/ledgers)")
    led.set_defaults(func=_ledgers)
