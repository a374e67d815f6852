"""``fedqhd privacy audit``: an empirical epsilon lower bound of a release, printed beside
the claimed epsilon; exits 1 when the bound exceeds the claim. ``--release counts`` audits
POOL's count release, ``--release fedqhd`` private FedQHD's readout release.
``fedqhd privacy ledgers``: what a node's on-disk ledgers have spent, and their epsilon
(infinite for a shard released with regenerable, seeded noise); an unreadable file is
reported and the rest still listed (exit 1)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fedqhd.commands.args import (
    at_least,
    in_setting_range,
    number_in,
    path_arg,
    writable_file,
)
from fedqhd.files import atomic_write

RELEASES = ("counts", "fedqhd")  #: what ``--release`` audits
#: each release's own options and their defaults; parsed with default None, so one given
#: with the other release is refused instead of silently ignored
ONLY_FOR: dict[str, dict[str, Any]] = {
    "counts": {"horizon": 7, "trajectories": 1000, "clipped": False},
    "fedqhd": {"chunks": 4, "clip_norm": 0.05, "hd_dim": 16, "anchors": 0, "episodes": 120},
}
#: ``--releases`` when not given, with numpy's sampler only: OpenDP's (~60 us a sample,
#: tens of samples a release) would take 10 min (counts) to an hour (fedqhd) at this count
DEFAULT_RELEASES = 1_000_000


def _releases(text: str) -> int:
    """An argparse type: releases per data set, at least the audit's minimum (imported
    here: ``fedqhd --help`` should not load scipy)."""
    from fedqhd.privacy.audit import MIN_RELEASES

    return at_least(MIN_RELEASES)(text)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_audit(a: argparse.Namespace) -> None:
    """Refuse, before any work, what the audit would ignore or regret: an option of the
    other release (ignored, it would read as audited), OpenDP's sampler at numpy's default
    count (silent for an hour), an output path that cannot be written (found only after
    the audit); then fill in the defaults."""
    from fedqhd.config import ConfigError

    other = next(r for r in RELEASES if r != a.release)
    foreign = [_flag(k) for k in ONLY_FOR[other] if getattr(a, k) is not None]
    if a.release == "fedqhd" and a.neighbours == "replace":
        foreign.append("--neighbours replace")  # fedqhd protects one episode added/removed
    if foreign:
        raise ConfigError(f"{', '.join(foreign)}: only for --release {other}, not "
                          f"--release {a.release}")
    if a.releases is None and a.noise == "opendp":
        raise ConfigError(f"--noise opendp draws about 60 us a sample: the default --releases "
                          f"{DEFAULT_RELEASES} would take 10 min (counts) to an hour (fedqhd); "
                          "give --releases, a few thousand (2000: 1 to 10 s)")
    if a.out is not None:
        writable_file("--out", a.out)
    for key, default in ONLY_FOR[a.release].items():
        if getattr(a, key) is None:
            setattr(a, key, default)
    a.releases = DEFAULT_RELEASES if a.releases is None else a.releases
    a.neighbours = a.neighbours or ("replace" if a.release == "counts" else "add")


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

    _check_audit(a)
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
    if a.out is not None:
        out = a.out
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, json.dumps({**res.to_dict(), "release": a.release, **extra,
                                      "wall-time-s": round(wall, 2)}, indent=1))
        print(f"wrote {out}")
    return 1 if res.flagged else 0


def _ledger_folder(a: argparse.Namespace) -> Path | None:
    """The folder to list; ``None`` when the default one does not exist yet (nothing
    released on this node). A folder the user named (``--ledger-dir``, or
    ``$FEDQHD_LEDGER_DIR``) must exist: a typo would otherwise read as nothing spent."""
    from fedqhd.config import ConfigError
    from fedqhd.privacy.store import LEDGER_DIR_ENV, ledger_dir

    named = a.ledger_dir if a.ledger_dir is not None else os.environ.get(LEDGER_DIR_ENV) or None
    if named is None:
        folder = ledger_dir({})
        return folder if folder.is_dir() else None
    flag = "--ledger-dir" if a.ledger_dir is not None else f"${LEDGER_DIR_ENV}"
    folder = Path(named).expanduser()
    if not named.strip() or not folder.is_dir():
        why = ("not a folder name" if not named.strip() else
               "not a folder" if folder.exists() else "no such folder")
        raise ConfigError(f"{flag} {named!r}: {why}")
    return folder


def _ledgers(a: argparse.Namespace) -> int:
    from fedqhd.privacy.store import LedgerFileError, LedgerStore, ledger_dir

    folder = _ledger_folder(a)
    if folder is None:
        print(f"0 ledger(s): no folder {ledger_dir({})} yet (nothing released on this node)")
        return 0
    store = LedgerStore(folder)
    paths = sorted(folder.glob("*.json"))
    print(f"{len(paths)} ledger(s) in {folder}")
    bad = 0
    for path in paths:  # a bad file is reported and skipped: the others are still shown
        try:
            ledger = store.read(path.stem)
        except LedgerFileError as exc:
            print(f"fedqhd privacy ledgers: error: {exc}", file=sys.stderr)
            bad += 1
            continue
        if ledger is None:  # removed since the listing
            continue
        delta = ledger.delta if a.delta is None else a.delta
        eps = ledger.epsilon(delta)
        shown = (f"inf ({ledger.conversion}: seeded noise, no privacy)" if eps == float("inf")
                 else f"{eps:.3f} ({ledger.conversion})")
        print(f"{path.stem[:12]}  {ledger.client_id}: rho spent {ledger.rho_spent:g} of "
              f"{ledger.budget_rho:g} in {len(ledger.entries)} entries; epsilon at delta "
              f"{delta:g}: {shown}")
    if bad:
        print(f"fedqhd privacy ledgers: {bad} of {len(paths)} ledger file(s) unreadable",
              file=sys.stderr)
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add ``fedqhd privacy audit`` to the dispatcher."""
    p = subparsers.add_parser("privacy", help="privacy tools (audit of a release, ledgers)")
    sub = p.add_subparsers(dest="privacy_command", required=True)
    a = sub.add_parser("audit", help="empirical epsilon lower bound vs the claimed epsilon "
                       "(exit 1 when the claim is refuted)")
    counts, fedqhd = ONLY_FOR["counts"], ONLY_FOR["fedqhd"]  # their defaults, for the help
    a.add_argument("--rho", type=in_setting_range("run", "privacy_rho", float), default=1.0,
                   help="zCDP rho the release claims")
    a.add_argument("--delta", type=number_in(0, 1, low_open=True, high_open=True),
                   default=1e-5)
    a.add_argument("--releases", type=_releases, default=None,
                   help="releases per data set (half choose the threshold, half measure; "
                   f"default {DEFAULT_RELEASES} with --noise numpy, needed with opendp)")
    a.add_argument("--confidence", type=number_in(0, 1, low_open=True, high_open=True),
                   default=0.95, help="confidence of the Clopper-Pearson bound")
    a.add_argument("--release", choices=RELEASES, default="counts",
                   help="what to audit: POOL's count release, or private FedQHD's readout "
                   "release (CartPole episodes, one episode added); an option marked for "
                   "the other release is refused")
    a.add_argument("--neighbours", choices=["replace", "add"], default=None,
                   help="counts: D' = D with one trajectory replaced (POOL's relation, the "
                   "default) or added; fedqhd: add only")
    a.add_argument("--noise", choices=["numpy", "opendp"], default="numpy",
                   help="sampler: numpy (fast, vectorised) or OpenDP's secure discrete Gaussian "
                   "(the nodes' default; exact but ~60 us a sample: give --releases, a few "
                   "thousand)")
    a.add_argument("--noise-scale-factor", type=number_in(0, low_open=True), default=1.0,
                   help="multiply the noise scale (0.1: a deliberately broken mechanism)")
    a.add_argument("--clipped", action="store_true", default=None,
                   help="counts: audit the output clipped at zero (post-processing: a weaker "
                   "test)")
    a.add_argument("--horizon", type=in_setting_range("pool", "horizon", int),
                   help=f"counts: H (trajectory length; default {counts['horizon']})")
    a.add_argument("--trajectories", type=in_setting_range("pool", "trajectories", int),
                   help=f"counts: trajectories in D (default {counts['trajectories']})")
    a.add_argument("--chunks", type=in_setting_range("run", "privacy_chunks", int),
                   help=f"fedqhd: m, the episode chunks (default {fedqhd['chunks']})")
    a.add_argument("--clip-norm", type=in_setting_range("run", "privacy_clip_norm", float),
                   help=f"fedqhd: R, each chunk's clip norm (default {fedqhd['clip_norm']}; small: "
                   "every chunk is clipped, the worst case)")
    a.add_argument("--hd-dim", type=in_setting_range("run", "hd_dim", int),
                   help=f"fedqhd: the encoder's dimension (default {fedqhd['hd_dim']})")
    a.add_argument("--anchors", type=at_least(0),
                   help="fedqhd: M > 0 audits the heterogeneous release (the chunks' "
                   "advantages on M uniform anchor states, client 0's own encoder; default "
                   f"{fedqhd['anchors']}: the readout)")
    a.add_argument("--episodes", type=at_least(1),
                   help="fedqhd: random CartPole episodes searched for the worst-case pair "
                   f"(default {fedqhd['episodes']})")
    a.add_argument("--seed", type=in_setting_range("run", "seed", int), default=0,
                   help="seeds the data and numpy noise")
    a.add_argument("--out", type=path_arg, help="write the result as JSON here")
    a.set_defaults(func=_audit)
    led = sub.add_parser("ledgers", help="a node's privacy ledgers: rho spent, budget, epsilon")
    led.add_argument("--ledger-dir", help="the node's ledger folder (default: "
                     "$FEDQHD_LEDGER_DIR, else ~/.fedqhd/ledgers); exits 1 when a ledger "
                     "file is unreadable")
    led.add_argument("--delta", type=number_in(0, 1, low_open=True, high_open=True),
                     help="report epsilon at this delta (default: the delta each ledger "
                     "was written with, 1e-5; rho is what composes)")
    led.set_defaults(func=_ledgers)
