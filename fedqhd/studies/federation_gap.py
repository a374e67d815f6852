"""The FedQHD paper's federation-gap ablations (``fedqhd bench --suite federation-gap``).

With heterogeneous encoders a client never receives the teacher itself, only its values
on ``m`` anchor states, and compiles them into its own ``D`` features with one ridge
projection. The *federation gap* is what that costs: the distance between the compiled
teacher and the best the client's features could do. The paper claims it falls roughly
like ``D^-0.5`` with ``m = 4D`` and drops sharply once ``m`` reaches about ``D``; this
study measures both on CartPole, through fedqhd's own code.

What is measured, per seed:

* **Teacher.** Clients ``0 .. n-2`` of an ``n``-client federation (default 5, the run's
  ``behaviour-skew`` shards, ``episodes-per-client`` episodes each) fit ridge FQI with
  their own heterogeneous encoders (``D_i`` cycled from 500 / 1,000 / 2,000 / 5,000,
  their own bandwidths), as a node learner does (:func:`~fedqhd.learners.fqi.local_ridge`,
  ``num-server-rounds x local-iterations`` sweeps). The teacher is the
  transition-weighted mean of their Q-functions: FedQHDAnchor's aggregate of honest
  replies under plain means. It is a function of the state, so it can be evaluated
  anywhere, not only on anchors. The target client (the last one, ``n - 1``) is left out
  of it, so the teacher is the same function at every ``D`` and ``m``.
* **Compiled teacher.** The target client, with its own encoder seed and bandwidth and
  dimension ``D``, compiles the teacher's values on ``m`` anchors with
  :meth:`fedqhd.learners.fqi.FQILearner.compile` (the library's anchor compile: ridge
  ``compile-ridge``, by default the run's ``ridge``, 0.1). Anchors are the run's
  (``make_anchors("rollouts", ...)``: short uniform-random rollouts; a smaller ``m`` is a
  prefix of a larger one) or, as a diagnostic, states drawn from the data distribution.
* **Oracle.** The least-squares projection of the teacher onto the span of the target
  client's ``D`` features under the data distribution: ``W* = argmin (1/N) sum_s
  ||phi(s) W - T(s)||^2 + 1e-12 ||W||^2`` over ``N`` (default 32,768) held-out data states
  (fresh episodes of the same clients' behaviour policies, never the shards or anchors).
  The ``1e-12`` per state only conditions the solve (it is not the compile's ridge):
  a teacher inside the span is its own oracle to 2e-7 at D = 64 (1e-8 left 2e-4).
* **Error.** On 4,096 further held-out data states: the relative L2 error of Q over
  states and actions, ``||Q_compiled - Q_oracle||_F / ||Q_oracle||_F``. Beside it: the
  compiled and the oracle against the teacher (the oracle's is the heterogeneity floor),
  and the *oracle split*: two oracles fitted on the two halves of the ``N`` states,
  against each other, which bounds how much of the gap is the oracle's own sampling;
  and the anchor system's effective dimension ``sum_k mu_k / (mu_k + ridge)`` over the
  eigenvalues of the anchor Gram (:meth:`~fedqhd.readout.RidgeSystem.effective_dimension`):
  how many directions the compile really fits. The paper's conditioning argument counts
  ``D``; on CartPole's states far fewer directions carry weight.

Two sweeps: ``D`` with ``m = 4D``, and ``m`` at ``D = 512``; each for every variant
(:data:`VARIANTS`: the library's compile, a near-zero compile ridge, anchors drawn from
the data). Results: ``federation-gap.json`` / ``.csv`` / ``.md`` and
``federation-gap.png`` in the output folder.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from fedqhd.anchors import make_anchors
from fedqhd.config import RunConfig
from fedqhd.data import client_shard
from fedqhd.encoders import EncoderParams, HDEncoder, heterogeneous_encoder_params
from fedqhd.envs import get_spec
from fedqhd.files import atomic_write, pyplot
from fedqhd.learners.fqi import FQILearner, encoder_scale, local_ridge
from fedqhd.seeding import anchor_seed, held_out_seed

DIMS: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)  #: the D sweep (m = 4D)
ANCHOR_COUNTS: tuple[int, ...] = (64, 128, 256, 384, 512, 768, 1024, 2048, 4096)  #: the m sweep
M_SWEEP_DIM = 512  #: D of the m sweep
ANCHORS_PER_DIM = 4  #: m = 4D in the D sweep (the paper's)
SEEDS: tuple[int, ...] = (0, 1, 2)
ORACLE_RIDGE = 1e-12  #: per held-out state: conditions the oracle's solve, nothing more
BLOCK = 4096  #: rows encoded at a time (a 32,768 x 5,000 float64 table would be 1.3 GB)


@dataclass(frozen=True)
class Variant:
    """How the target client compiles: the compile ridge (None: the run's ``ridge``) and
    where the anchors come from ("rollouts": the run's anchors; "data": held-out data
    states, i.e. the distribution the error is measured on)."""

    name: str
    ridge: float | None = None
    anchors: str = "rollouts"


#: the library's compile, and two diagnostics that each change one thing
VARIANTS: tuple[Variant, ...] = (Variant("library"), Variant("ridge-1e-6", ridge=1e-6),
                                 Variant("data-anchors", anchors="data"))


@dataclass(frozen=True)
class GapSettings:
    """The study's grid; the defaults are the suite's (about 2-3 minutes on one core)."""

    dims: tuple[int, ...] = DIMS
    anchor_counts: tuple[int, ...] = ANCHOR_COUNTS
    m_sweep_dim: int = M_SWEEP_DIM
    anchors_per_dim: int = ANCHORS_PER_DIM
    seeds: tuple[int, ...] = SEEDS
    clients: int = 5
    oracle_states: int = 32_768
    eval_states: int = 4096
    variants: tuple[Variant, ...] = VARIANTS
    run_config: dict[str, Any] = field(default_factory=dict)  #: RunConfig fields

    def config(self, seed: int) -> RunConfig:
        fields = {"env_id": "CartPole-v1", **self.run_config, "seed": seed,
                  "encoder": "heterogeneous"}
        return RunConfig(**fields)

    def anchor_pool(self) -> int:
        """Data anchors needed: the largest m of either sweep."""
        return max([*self.anchor_counts, *(self.anchors_per_dim * d for d in self.dims)])


#: a small grid for tests and ``--quick`` (seconds)
QUICK = GapSettings(dims=(32, 64, 128, 256), anchor_counts=(32, 64, 128, 256, 512),
                    m_sweep_dim=128, seeds=(0, 1), oracle_states=8192, eval_states=2048)


def _blocks(states: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return np.concatenate([fn(states[i:i + BLOCK]) for i in range(0, len(states), BLOCK)])


class Problem:
    """One seed's fixed parts: the teacher, the target client's shard and encoder
    settings, the held-out states (evaluation, the oracle's two halves, data anchors)
    and the teacher's values on them."""

    def __init__(self, settings: GapSettings, seed: int) -> None:
        cfg = settings.config(seed)
        self.cfg = cfg
        self.seed = seed
        n = settings.clients
        self.n_actions = get_spec(cfg.env_id).n_actions
        self.scale = encoder_scale(cfg)
        shards = [client_shard(cfg.env_id, cfg.partition, i, n, cfg.episodes_per_client,
                               cfg.seed, epsilon_min=cfg.epsilon_min,
                               epsilon_max=cfg.epsilon_max) for i in range(n)]
        self.members = []
        for i in range(n - 1):
            learner = FQILearner(shards[i], heterogeneous_encoder_params(cfg.seed, i,
                                                                         cfg.bandwidth).build(
                self.scale), self.n_actions, cfg.gamma, local_ridge(cfg.ridge, n),
                proximal=0.0, compile_ridge=cfg.ridge)
            learner.train(cfg.num_server_rounds * cfg.local_iterations)
            self.members.append(learner)
        counts = np.array([s.n_transitions for s in shards[:-1]], dtype=np.float64)
        self.weights = counts / counts.sum()
        self.target_shard = shards[-1]
        self.target = heterogeneous_encoder_params(cfg.seed, n - 1, cfg.bandwidth)
        states = held_out_states(cfg, n, settings.eval_states + settings.oracle_states
                                 + settings.anchor_pool())
        half = settings.oracle_states // 2
        e = settings.eval_states
        self.eval_states = states[:e]
        self.oracle_halves = (states[e:e + half], states[e + half:e + 2 * half])
        self.data_anchors = states[e + 2 * half:]
        self.use_teacher(lambda x: sum(w * m.q_values(x) for w, m in
                                       zip(self.weights, self.members, strict=True)))

    def use_teacher(self, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        """Measure against teacher ``fn`` (states -> Q, shape (n, |A|)); by default the
        members' transition-weighted mean. Tests give one inside the target's span, whose
        oracle is the teacher itself."""
        self._teacher = fn
        self.teacher_eval = self.teacher(self.eval_states)
        self.teacher_halves = tuple(self.teacher(s) for s in self.oracle_halves)
        self._oracles: dict[int, tuple[np.ndarray, float]] = {}

    def teacher(self, states: np.ndarray) -> np.ndarray:
        """The teacher's Q on ``states``."""
        return _blocks(states, self._teacher)

    def encoder(self, dim: int) -> HDEncoder:
        """The target client's encoder at dimension ``dim`` (its seed and bandwidth)."""
        return EncoderParams(dim, self.target.bandwidth, self.target.seed).build(self.scale)

    def oracle(self, dim: int) -> tuple[np.ndarray, float]:
        """The oracle readout at ``dim`` and the oracle split (cached per ``dim``)."""
        if dim not in self._oracles:
            enc = self.encoder(dim)
            systems = [_normal_equations(enc, s, t) for s, t in
                       zip(self.oracle_halves, self.teacher_halves, strict=True)]
            n = sum(len(s) for s in self.oracle_halves)
            full = _ridge_solve(systems[0][0] + systems[1][0], systems[0][1] + systems[1][1],
                                ORACLE_RIDGE * n)
            halves = [_ridge_solve(g, r, ORACLE_RIDGE * n / 2) for g, r in systems]
            feats = enc.encode(self.eval_states)
            split = _relative(feats @ halves[0], feats @ halves[1])
            self._oracles[dim] = (full, split)
        return self._oracles[dim]

    def anchors(self, variant: Variant, m: int) -> np.ndarray:
        if variant.anchors == "data":
            if m > len(self.data_anchors):
                raise ValueError(f"m = {m}: only {len(self.data_anchors)} data anchors drawn")
            return self.data_anchors[:m]
        return make_anchors("rollouts", self.cfg.env_id, m, seed=anchor_seed(self.cfg.seed))

    def point(self, dim: int, m: int, variant: Variant) -> dict[str, Any]:
        """One measurement: compile the teacher on ``m`` anchors at ``dim``, compare."""
        t0 = time.perf_counter()
        enc = self.encoder(dim)
        ridge = self.cfg.ridge if variant.ridge is None else variant.ridge
        learner = FQILearner(self.target_shard, enc, self.n_actions, self.cfg.gamma,
                             local_ridge(self.cfg.ridge, len(self.members) + 1), proximal=0.0,
                             compile_ridge=ridge)
        anchors = self.anchors(variant, m)
        taught = self.teacher(anchors)
        residual = learner.compile(anchors, taught)
        assert learner.anchor_system is not None
        d_eff = learner.anchor_system.effective_dimension()
        oracle, split = self.oracle(dim)
        feats = enc.encode(self.eval_states)
        q_oracle, q_compiled = feats @ oracle, feats @ learner.readout
        return {"variant": variant.name, "seed": self.seed, "D": dim, "m": m,
                "compile-ridge": ridge, "gap": _relative(q_compiled, q_oracle),
                "compiled-vs-teacher": _relative(q_compiled, self.teacher_eval),
                "oracle-vs-teacher": _relative(q_oracle, self.teacher_eval),
                "oracle-split": split, "effective-dimension": d_eff,
                "greedy-agreement": float(np.mean(q_compiled.argmax(1) == q_oracle.argmax(1))),
                "anchor-residual": residual / max(float(np.linalg.norm(taught)), 1e-300),
                "seconds": round(time.perf_counter() - t0, 3)}


def held_out_states(cfg: RunConfig, clients: int, n: int) -> np.ndarray:
    """``n`` states of the data distribution (the ``clients`` behaviour policies of the
    run's partition, equal episodes each) from episodes no shard holds, shuffled."""
    episodes = 64
    while True:
        shards = [client_shard(cfg.env_id, cfg.partition, i, clients, episodes,
                               held_out_seed(cfg.seed), epsilon_min=cfg.epsilon_min,
                               epsilon_max=cfg.epsilon_max) for i in range(clients)]
        states = np.concatenate([s.observations for s in shards])
        if len(states) >= n:
            rng = np.random.default_rng(held_out_seed(cfg.seed))
            return states[rng.permutation(len(states))[:n]]
        episodes = int(episodes * max(2.0, 1.2 * n / max(len(states), 1)))


def _normal_equations(enc: HDEncoder, states: np.ndarray, targets: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``Phi^T Phi`` and ``Phi^T T`` accumulated ``BLOCK`` rows at a time."""
    dim = enc.hd_dim
    gram, rhs = np.zeros((dim, dim)), np.zeros((dim, targets.shape[1]))
    for i in range(0, len(states), BLOCK):
        phi = enc.encode(states[i:i + BLOCK])
        gram += phi.T @ phi
        rhs += phi.T @ targets[i:i + BLOCK]
    return gram, rhs


def _ridge_solve(gram: np.ndarray, rhs: np.ndarray, ridge: float) -> np.ndarray:
    system = gram.copy()
    system[np.diag_indices_from(system)] += ridge
    return np.asarray(cho_solve(cho_factor(system, lower=True), rhs))


def _relative(q: np.ndarray, reference: np.ndarray) -> float:
    """Relative L2 (Frobenius) error of ``q`` against ``reference``."""
    return float(np.linalg.norm(q - reference) / max(float(np.linalg.norm(reference)), 1e-300))


# ------------------------------------------------------------------ fits
def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(lx, ly, 1)[0])


def geometric_means(rows: list[dict[str, Any]], key: str) -> dict[int, float]:
    """Per value of ``key`` (D or m), the geometric mean of the gap over seeds."""
    out: dict[int, list[float]] = {}
    for r in rows:
        out.setdefault(int(r[key]), []).append(float(r["gap"]))
    return {k: float(np.exp(np.mean(np.log(v)))) for k, v in sorted(out.items())}


def drop_point(means: dict[int, float]) -> dict[str, Any]:
    """Where the error vs m drops: the grid segment with the steepest log-log descent,
    the local slopes, and the smallest m within 2x of the error at the largest m."""
    ms, errs = list(means), list(means.values())
    slopes = [float(np.log(errs[i + 1] / errs[i]) / np.log(ms[i + 1] / ms[i]))
              for i in range(len(ms) - 1)]
    steepest = int(np.argmin(slopes))
    knee = next(m for m, e in zip(ms, errs, strict=True) if e <= 2 * errs[-1])
    return {"steepest-segment": [ms[steepest], ms[steepest + 1]],
            "steepest-slope": slopes[steepest],
            "segment-slopes": {f"{a}-{b}": s for a, b, s in
                               zip(ms[:-1], ms[1:], slopes, strict=True)},
            "within-2x-of-largest-m": knee}


def summarise(rows: list[dict[str, Any]], settings: GapSettings) -> dict[str, Any]:
    """Per variant: geometric-mean gap per D and per m, the fitted slopes (D sweep: over
    the whole grid; m sweep: over the whole grid, below D and from D on) and the drop."""
    out: dict[str, Any] = {}
    for v in settings.variants:
        d_rows = [r for r in rows if r["sweep"] == "D" and r["variant"] == v.name]
        m_rows = [r for r in rows if r["sweep"] == "m" and r["variant"] == v.name]
        d_means, m_means = geometric_means(d_rows, "D"), geometric_means(m_rows, "m")
        dim = settings.m_sweep_dim
        below = {m: e for m, e in m_means.items() if m <= dim}
        above = {m: e for m, e in m_means.items() if m >= dim}
        per_seed = [loglog_slope(*zip(*sorted((r["D"], r["gap"]) for r in d_rows
                                              if r["seed"] == s), strict=True))
                    for s in settings.seeds]
        out[v.name] = {
            "gap-vs-D": d_means, "gap-vs-m": m_means,
            "slope-vs-D": loglog_slope(list(d_means), list(d_means.values())),
            "slope-vs-D-per-seed": per_seed,
            "slope-vs-m": loglog_slope(list(m_means), list(m_means.values())),
            "slope-vs-m-below-D": (loglog_slope(list(below), list(below.values()))
                                   if len(below) > 1 else None),
            "slope-vs-m-from-D": (loglog_slope(list(above), list(above.values()))
                                  if len(above) > 1 else None),
            "drop": drop_point(m_means),
            "oracle-vs-teacher-vs-D": {d: float(np.mean([r["oracle-vs-teacher"] for r in d_rows
                                                         if r["D"] == d])) for d in d_means},
            "oracle-split-vs-D": {d: float(np.mean([r["oracle-split"] for r in d_rows
                                                    if r["D"] == d])) for d in d_means},
            "effective-dimension-vs-D": {d: float(np.mean([r["effective-dimension"]
                                                           for r in d_rows if r["D"] == d]))
                                         for d in d_means},
            "effective-dimension-vs-m": {m: float(np.mean([r["effective-dimension"]
                                                           for r in m_rows if r["m"] == m]))
                                         for m in m_means},
        }
    return out


# ------------------------------------------------------------------ the suite
def run_suite(settings: GapSettings, out: Path,
              progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Both sweeps for every seed and variant; writes the JSON, CSV, table and plot."""
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for seed in settings.seeds:
        problem = Problem(settings, seed)
        for v in settings.variants:
            for dim in settings.dims:
                rows.append({"sweep": "D", **problem.point(dim, settings.anchors_per_dim * dim,
                                                           v)})
                if progress:
                    progress(f"seed {seed} {v.name} D={dim}")
            for m in settings.anchor_counts:
                rows.append({"sweep": "m", **problem.point(settings.m_sweep_dim, m, v)})
                if progress:
                    progress(f"seed {seed} {v.name} m={m}")
    summary: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"), "settings": _settings_json(settings),
        "summary": summarise(rows, settings), "rows": rows,
        "wall-s": round(time.perf_counter() - t0, 1)}
    write_outputs(summary, out)
    return summary


def _settings_json(settings: GapSettings) -> dict[str, Any]:
    data = asdict(settings)
    data["run-config"] = settings.config(settings.seeds[0]).to_run_config()
    del data["run_config"]
    return data


def write_outputs(summary: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "federation-gap.json", json.dumps(summary, indent=2))
    with (out / "federation-gap.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(summary["rows"][0]))
        writer.writeheader()
        writer.writerows(summary["rows"])
    atomic_write(out / "federation-gap.md", markdown(summary))
    plot(summary, out / "federation-gap.png")


def markdown(summary: dict[str, Any]) -> str:
    """The tables: gap vs D (m = 4D) and vs m (at the m sweep's D), one column per
    variant (geometric means over seeds), then the slopes and the drop."""
    s, st = summary["summary"], summary["settings"]
    names = list(s)
    lines = [f"Federation gap ||Q_compiled - Q_oracle|| / ||Q_oracle|| on held-out data "
             f"states, geometric mean over seeds {st['seeds']}",
             "", "| D (m = 4D) | " + " | ".join(names) + " | oracle vs teacher | oracle split "
             f"| effective dimension ({names[0]}) |", "|---:|" + "---:|" * (len(names) + 3)]
    lib = s[names[0]]
    for d in lib["gap-vs-D"]:
        lines.append(f"| {d} | " + " | ".join(f"{s[n]['gap-vs-D'][d]:.4f}" for n in names)
                     + f" | {lib['oracle-vs-teacher-vs-D'][d]:.1e} | "
                     f"{lib['oracle-split-vs-D'][d]:.1e} | "
                     f"{lib['effective-dimension-vs-D'][d]:.0f} |")
    lines += ["", f"| m (D = {st['m_sweep_dim']}) | " + " | ".join(names)
              + " | effective dimension: " + " / ".join(names) + " |",
              "|---:|" + "---:|" * (len(names) + 1)]
    for m in lib["gap-vs-m"]:
        lines.append(f"| {m} | " + " | ".join(f"{s[n]['gap-vs-m'][m]:.4f}" for n in names)
                     + " | " + " / ".join(f"{s[n]['effective-dimension-vs-m'][m]:.0f}"
                                          for n in names) + " |")
    lines += ["", "| fit | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label: str, fmt: Callable[[dict[str, Any]], str]) -> str:
        return f"| {label} | " + " | ".join(fmt(s[n]) for n in names) + " |"

    lines += [row("slope vs D (per seed)", lambda v: f"{v['slope-vs-D']:.2f} (" + ", ".join(
                  f"{x:.2f}" for x in v["slope-vs-D-per-seed"]) + ")"),
              row("slope vs m", lambda v: f"{v['slope-vs-m']:.2f}"),
              row("slope vs m, m <= D / m >= D", lambda v: f"{_num(v['slope-vs-m-below-D'])} / "
                  f"{_num(v['slope-vs-m-from-D'])}"),
              row("steepest drop (segment: slope)", lambda v: "{}-{}: {:.2f}".format(
                  *v["drop"]["steepest-segment"], v["drop"]["steepest-slope"])),
              row("smallest m within 2x of largest m", lambda v: str(
                  v["drop"]["within-2x-of-largest-m"]))]
    return "\n".join(lines) + "\n"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def plot(summary: dict[str, Any], path: Path) -> None:
    """Gap vs D (log-log, m = 4D, with a D^-0.5 guide) and gap vs m (log-log, the
    sweep's D marked); seeds as dots, geometric means as lines."""
    plt = pyplot()

    s, st, rows = summary["summary"], summary["settings"], summary["rows"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, v) in enumerate(s.items()):
        color = f"C{i}"
        for ax, sweep, key, means in ((axes[0], "D", "D", v["gap-vs-D"]),
                                      (axes[1], "m", "m", v["gap-vs-m"])):
            pts = [(r[key], r["gap"]) for r in rows if r["sweep"] == sweep
                   and r["variant"] == name]
            ax.scatter(*zip(*pts, strict=True), s=9, color=color, alpha=0.5)
            label = (f"{name} (slope {v['slope-vs-D']:.2f})" if sweep == "D"
                     else f"{name} (slope {v['slope-vs-m']:.2f})")
            ax.plot(list(means), list(means.values()), "-o", ms=3, color=color, label=label)
    lib = next(iter(s.values()))["gap-vs-D"]
    d0, e0 = next(iter(lib.items()))
    ds = np.array(list(lib), float)
    axes[0].plot(ds, e0 * (ds / d0) ** -0.5, "k:", label="D^-0.5 (paper)")
    axes[1].axvline(st["m_sweep_dim"], color="k", ls=":", label=f"m = D = {st['m_sweep_dim']}")
    for ax, xlabel, title in ((axes[0], "D (m = 4D)", "gap vs encoder dimension"),
                              (axes[1], "anchors m", f"gap vs anchors, D = {st['m_sweep_dim']}")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("||Q_compiled - Q_oracle|| / ||Q_oracle||")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Federation gap, {st['run-config']['env-id']}, seeds {st['seeds']} "
                 f"({summary['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
