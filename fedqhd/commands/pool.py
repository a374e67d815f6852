"""``fedqhd pool ...``: the paper's studies as sub-commands, writing JSON and PNG.

``fedqhd pool rho``    gap vs rho for nonprivate / pool / input / output
``fedqhd pool sweep``  gap vs one of H, lam (|lambda|), wd (w+d), M
``fedqhd pool grid``   norm zones vs axis grid: gap and fit wall time vs M
``fedqhd pool federated``  does federation help a POOL client? federated vs lone vs pooled
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedqhd.commands.args import (
    at_least,
    list_of,
    number_in,
    path_arg,
    setting_check,
    writable_file,
    writable_folder,
)
from fedqhd.envs.inventory import BEHAVIOURS, DEMANDS, MODELS
from fedqhd.files import atomic_figure, atomic_write, pyplot
from fedqhd.pool.api import ZONINGS
from fedqhd.pool.baselines import METHODS
from fedqhd.studies.pool_experiments import Setting, grid_study, rho_study, run_grid, sweep_study

# What each study parameter must be for the method to mean anything (argparse types: a bad
# value is refused in one line naming the flag, exit 2, before the study runs).
_POSITIVE_INT = at_least(1)  #: reps, w, H, M, n, next-state cells: counts and sizes
_BOUNDARY = number_in(0.0, 1.0, low_open=True)  #: lam: a non-empty region of [0, 1]
_RHO = number_in(0.0, low_open=True)  #: zCDP rho: rho = 0 would need infinite noise


def _wd(text: str) -> int:
    """w + d: one order quantity per product, so ``2w`` (an even integer >= 2)."""
    value = at_least(2)(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"must be even (w + d = 2w), got {value}")
    return value


def _method(text: str) -> str:
    """One of the compared methods (:data:`~fedqhd.pool.baselines.METHODS`)."""
    if text not in METHODS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(METHODS)}, got {text!r}")
    return text


def _threshold(text: str) -> str | float:
    """auto, erho, or k >= 0 noise sigmas: a negative threshold would make every zone,
    even an empty one, known."""
    if text in ("auto", "erho"):
        return text
    try:
        return number_in(0.0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto, erho or a number of noise sigmas >= 0, got {text!r}") from None


#: the values ``sweep --values`` takes, per ``--param``: those of the flag each one sweeps
SWEEP_VALUES: dict[str, Callable[[str], Any]] = {
    "H": _POSITIVE_INT, "lam": _BOUNDARY, "wd": _wd, "M": _POSITIVE_INT}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=path_arg, default=Path("outputs/pool"), help="output directory")
    p.add_argument("--reps", type=_POSITIVE_INT, default=10, help="repetitions (paper: 10)")
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--w", type=_POSITIVE_INT, default=2, help="products; w+d = 2w")
    p.add_argument("--H", type=_POSITIVE_INT, default=7, help="horizon (stages)")
    p.add_argument("--M", type=_POSITIVE_INT, default=50, help="zones")
    p.add_argument("--lam", type=_BOUNDARY, default=1.0,
                   help="observable boundary per coordinate, in (0, 1]")
    p.add_argument("--rho", type=_RHO, default=1.0, help="zCDP rho (> 0)")
    p.add_argument("--n", type=_POSITIVE_INT, default=5000, help="offline trajectories")
    p.add_argument("--model", choices=MODELS, default="lost_sales")
    p.add_argument("--demand", choices=DEMANDS, default="uniform")
    p.add_argument("--zoning", choices=ZONINGS, default="post-decision",
                   help="post-decision (zones over y = s + a) or the paper's norm zones")
    p.add_argument("--behaviour", choices=BEHAVIOURS, default="uniform",
                   help="behaviour data: uniform random orders or a noisy base-stock policy")
    p.add_argument("--reward-scale", choices=["common", "stage"], default="common",
                   help="one reward scale for all stages, or per stage (biased, old)")
    p.add_argument("--threshold", type=_threshold, default="auto",
                   help="known-zone threshold: auto (3 noise sigmas for post-decision "
                   "zones, the paper's E_rho otherwise), erho, or k >= 0 (k noise sigmas)")
    p.add_argument("--kernel", choices=["auto", "shared", "zone"], default="auto",
                   help="next-state kernel: shared (one demand law per stage fitted to all "
                   "zones; needs post-decision zones) or zone (each zone's own counts, the "
                   "paper's); auto: shared for post-decision zones, zone otherwise")
    p.add_argument("--em-noise", choices=["clipped", "ignore"], default="clipped",
                   help="shared kernel's EM: model the mass clipping the noise at zero adds "
                   "(clipped) or take projected counts at face value (ignore; issue 9 round 2)")
    p.add_argument("--n-cells", type=_POSITIVE_INT, default=20, help="next-state cells")
    p.add_argument("--no-progress", action="store_true")


def _threshold_sigmas(a: argparse.Namespace) -> float | None:
    if a.threshold == "auto":
        return 3.0 if a.zoning == "post-decision" else None
    return None if a.threshold == "erho" else float(a.threshold)


def _kernel(a: argparse.Namespace) -> str:
    """The next-state kernel ``--kernel`` asks for; ``shared`` is refused (one line, before
    the study) unless the zones are post-decision ones: its demand law is fitted over the
    order-up-to level, which norm shells and the grid do not keep."""
    from fedqhd.config import ConfigError

    if a.kernel == "auto":
        return "shared" if a.zoning == "post-decision" else "zone"
    if a.kernel == "shared" and a.zoning != "post-decision":
        raise ConfigError(f"--kernel shared needs --zoning post-decision, got --zoning {a.zoning}")
    return str(a.kernel)


def _base(a: argparse.Namespace) -> Setting:
    return Setting(w=a.w, horizon=a.H, n_zones=a.M, lam=a.lam, rho=a.rho, n_traj=a.n,
                   model=a.model, demand=a.demand, zoning=a.zoning, behaviour=a.behaviour,
                   reward_scale=a.reward_scale, threshold_sigmas=_threshold_sigmas(a),
                   n_cells=a.n_cells, kernel=_kernel(a), em_noise=a.em_noise)


def _tag(a: argparse.Namespace) -> str:
    """File-name suffix: empty for the defaults, else the non-default choices."""
    parts = [] if a.zoning == "post-decision" else [a.zoning]
    parts += [] if a.kernel in ("auto", "shared") else [f"{a.kernel}-kernel"]
    parts += [] if a.em_noise == "clipped" else [f"em-{a.em_noise}"]
    parts += [] if a.model == "lost_sales" else [a.model]
    parts += [] if a.behaviour == "uniform" else [a.behaviour]
    return "".join(f"_{p}" for p in parts)


def _out(a: argparse.Namespace, *names: str) -> Path:
    """The ``--out`` folder, once it and the files ``names`` in it are known to be writable:
    a study takes minutes, so a bad path is refused before it runs, not after."""
    out = writable_folder("--out", a.out)
    for name in names:
        writable_file("--out", out / name)
    return out


def _run(a: argparse.Namespace, name: str, settings: list, x_of: Callable[[dict], tuple],
         xlabel: str, log_x: bool = False) -> int:
    """Run a study's labelled settings ``--reps`` times and write ``name``.json and .png
    in ``--out`` (checked first); ``x_of(row)``: the row's (series, x) in the plot."""
    out = _out(a, f"{name}.json", f"{name}.png")
    rows = run_grid(settings, a.reps, a.seed, not a.no_progress)
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    payload = {"study": name, "seed": a.seed, "reps": a.reps, "args": vars(a) | {"func": None},
               "rows": rows, "written": time.strftime("%Y-%m-%dT%H:%M:%S")}
    atomic_write(out / f"{name}.json", json.dumps(payload, indent=1, default=str))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for series in sorted({x_of(r)[0] for r in rows}):
        pts = [(x_of(r)[1], r["gap_mean"], r["gap_std"]) for r in rows if x_of(r)[0] == series]
        xs, ys, es = zip(*pts, strict=True)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=series)
    if log_x:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("relative gap (c - c*) / c* (%)")
    ax.set_title(f"{name}: mean +- std over {a.reps} reps, seed {a.seed}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    try:
        atomic_figure(fig, out / f"{name}.png", dpi=120)
    finally:
        plt.close(fig)
    for r in rows:
        print(f"{r['label']:>22s} {r['method']:>10s}  gap {r['gap_mean']:7.1f} "
              f"+- {r['gap_std']:5.1f} %   fit {r['fit_s_mean']:.3f}s")
    print(f"wrote {out / name}.json and .png")
    return 0


def _rho(a: argparse.Namespace) -> int:
    return _run(a, f"rho_{a.demand}{_tag(a)}", rho_study(_base(a), a.rhos, a.methods),
                lambda r: (r["method"], r["setting"]["rho"]), "rho (zCDP)", log_x=True)


def _sweep_values(a: argparse.Namespace) -> list:
    """``--values`` as the flag ``--param`` sweeps takes them (checked after parsing:
    which values are valid depends on ``--param``)."""
    from fedqhd.config import ConfigError

    try:
        return list_of(SWEEP_VALUES[a.param])(a.values)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--values (--param {a.param}): {exc}") from None


def _sweep(a: argparse.Namespace) -> int:
    return _run(a, f"sweep_{a.param}{_tag(a)}", sweep_study(_base(a), a.param, _sweep_values(a)),
                lambda r: ("pool", float(r["label"].split("=")[1])), a.param)


def _grid(a: argparse.Namespace) -> int:
    return _run(a, f"grid_wd{2 * a.w}{_tag(a)}", grid_study(_base(a), a.Ms),
                lambda r: (r["setting"]["zoning"], r["setting"]["n_zones"]),
                "M (zones or grid cells)")


def _pool_preset(folder: str, name: str, **settings: object) -> str:
    """A POOL preset file in ``folder``: ``pool.toml``'s settings with ``settings``
    (kebab-case keys) changed; returns its path."""
    from fedqhd.presets import PoolSettings, preset_path

    values = {**PoolSettings().to_dict(), **settings}
    unknown = sorted(set(values) - set(PoolSettings.keys()))
    if unknown:
        raise ValueError(f"unknown POOL settings {unknown}; valid: {list(PoolSettings.keys())}")
    path = Path(folder) / f"{name}.toml"
    lines = [f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"'
             for k, v in values.items()]
    atomic_write(path, f"# {name}: {preset_path('pool')} with {settings}\n"
                 + "\n".join(lines) + "\n")
    return str(path)


def federated_study(clients: int, rho: float, seeds: int, **settings: object
                    ) -> dict[str, object]:
    """Federated vs lone vs pooled POOL, measured the same way; gaps (%) per seed and means.

    Per seed (a fresh inventory MDP and fresh shards): one in-process federated round
    (real ServerApp logic and ClientApps, no Ray) gives the federated policy's gap
    (server), each client's own policy alone and its teacher-informed policy (client
    evaluation, mean over clients); the pooled row is one POOL release of all clients'
    trajectories together at the same rho (what a single trusted curator would get).
    All policies of a seed are scored on the same simulated demands against c*.

    ``settings``: POOL settings (``pool.toml``'s keys) other than the preset's. A
    simulation study: the nodes use numpy noise seeded from the run config (reproducible,
    NOT secure), and the privacy ledgers live in a temporary directory, so repeating the
    study does not spend a node's real budget.
    """
    import logging
    import tempfile

    import numpy as np

    from fedqhd.client.app import app as client_app
    from fedqhd.console import console_level
    from fedqhd.learners import parse_run_config
    from fedqhd.learners.pool_federated import ClientPrivacy, GapEvaluator, fit, release
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid
    from fedqhd.strategies import contract as C

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        preset = _pool_preset(tmp, "study", **settings)
        trajectories = int(parse_run_config(
            {"learner": "pool", "env-id": "fedqhd/Inventory-v0", "preset": preset}
        ).pool.trajectories)
        pooled_preset = _pool_preset(tmp, "pooled", **{**settings,
                                                       "trajectories": trajectories * clients})
        for seed in range(seeds):
            cfg = parse_run_config({
                "learner": "pool", "env-id": "fedqhd/Inventory-v0", "seed": seed,
                "num-server-rounds": 1, "privacy-rho": rho, "min-nodes": clients,
                "output-dir": tmp, "preset": preset})
            # simulated nodes, each with a budget of its one release (every seed's shards
            # are fresh): any --rho is measured, not refused by the default budget (10)
            nodes = [{"ledger-dir": f"{tmp}/ledgers", "noise": "numpy",
                      "reproducible-noise": True, "rho": rho, "rho-budget": rho}] * clients
            grid = InProcessGrid([client_app] * clients, run_config=cfg.to_run_config(),
                                 node_configs=nodes)
            with console_level(logging.WARNING):  # the study's table, not each run's round
                _, out_dir = run_federation(grid, cfg)
            row = json.loads((out_dir / "results.json").read_text())["rounds"][-1]
            pooled_cfg = cfg.replace(preset=pooled_preset)
            counts, _ = release(pooled_cfg, 0, ClientPrivacy.of(pooled_cfg, nodes[0]))
            pooled = GapEvaluator(cfg)(fit(pooled_cfg, counts))[C.GAP]
            rows.append({"seed": seed, "federated": row[C.GAP], "lone": row[C.GAP_OWN],
                         "informed": row[C.GAP_INFORMED], "pooled": pooled})
    names = [k for k in rows[0] if k != "seed"]
    means: dict[str, float] = {k: float(np.mean([r[k] for r in rows])) for k in names}
    stds = {k: float(np.std([r[k] for r in rows])) for k in means}
    diff = np.array([r["federated"] - r["lone"] for r in rows])  # paired, same seed
    means["federated-minus-lone"], stds["federated-minus-lone"] = diff.mean(), diff.std()
    means["seeds-federated-better"] = int(np.sum(diff < 0))
    return {"clients": clients, "rho": rho, "settings": settings, "mean": means, "std": stds,
            "runs": rows}


def _check_federated(a: argparse.Namespace) -> None:
    """Refuse, in the name of the flag, a value the run-config key or POOL setting it
    becomes would refuse (argparse checked the lower ends; these are the upper ones, and
    the pooled row's ``clients * trajectories``), rather than in the name of a key of a
    temporary preset the user never wrote."""
    from fedqhd.config import ConfigError

    for flag, value, valid in (
            ("--clients", a.clients, setting_check("run", "min_nodes")),
            ("--rho", a.rho, setting_check("run", "privacy_rho")),
            ("--trajectories", a.trajectories, setting_check("pool", "trajectories")),
            ("--clients * --trajectories (the pooled row's trajectories)",
             a.clients * a.trajectories, setting_check("pool", "trajectories"))):
        problem = valid(value)
        if problem:
            raise ConfigError(f"{flag}: expected {problem}, got {value}")


def _federated(a: argparse.Namespace) -> int:
    _check_federated(a)
    out = _out(a, "federated.json")
    res = federated_study(a.clients, a.rho, a.seeds, trajectories=a.trajectories)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "federated.json", json.dumps(res, indent=1, default=float))
    print(json.dumps({k: res[k] for k in ("clients", "rho", "mean", "std")}, indent=1))
    print(f"wrote {out / 'federated.json'}")
    return 0


def register(subparsers) -> None:
    """Add the ``pool`` command and its studies to the ``fedqhd`` dispatcher."""
    p = subparsers.add_parser("pool", help="POOL experiments (private offline inventory RL)")
    sub = p.add_subparsers(dest="study", required=True)
    r = sub.add_parser("rho", help="gap vs rho for the four methods")
    _common(r)
    r.add_argument("--rhos", type=list_of(_RHO), default="0.1,1,5,10,20,40",
                   help="comma separated, each > 0")
    r.add_argument("--methods", type=list_of(_method), default=",".join(METHODS),
                   help=f"comma separated, of {', '.join(METHODS)}")
    r.set_defaults(func=_rho)
    s = sub.add_parser("sweep", help="gap vs H, lam, wd (w+d) or M")
    _common(s)
    s.add_argument("--param", choices=list(SWEEP_VALUES), required=True)
    s.add_argument("--values", required=True,
                   help="comma separated, e.g. 5,10,15,20,40; what the swept flag takes "
                   "(H, M: integers >= 1, lam: in (0, 1], wd: even integers >= 2). A list "
                   "that starts with a minus sign needs '=': --values=-5,0")
    s.set_defaults(func=_sweep)
    g = sub.add_parser("grid", help="norm zones vs axis grid: gap and wall time")
    _common(g)
    g.add_argument("--Ms", type=list_of(_POSITIVE_INT), default="50,100,200,400,800",
                   help="comma separated zone counts, integers >= 1")
    g.set_defaults(func=_grid)
    f = sub.add_parser("federated", help="federated vs lone vs pooled POOL clients "
                       "(in-process federation, no Ray)")
    f.add_argument("--clients", type=_POSITIVE_INT, default=5)
    f.add_argument("--rho", type=_RHO, default=1.0, help="zCDP rho of each client's release")
    f.add_argument("--seeds", type=_POSITIVE_INT, default=5, help="seeds 0 .. seeds-1")
    f.add_argument("--trajectories", type=_POSITIVE_INT, default=1000, help="per client")
    f.add_argument("--out", type=path_arg, default=Path("outputs/pool"), help="output directory")
    f.set_defaults(func=_federated)
