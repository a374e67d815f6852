"""Per-run results: ``<output-dir>/<date>/<time>/`` with the run config, one JSON line
per round appended to ``rounds.jsonl`` (a crash keeps what was done; a later line of
the same round adds to its row: an evaluation that came with the next round's
messages), and at the end ``results.json`` (every round and the final entry), the final
model and a learning-curve PNG. Every file is written atomically (:mod:`fedqhd.files`)."""

from __future__ import annotations

import json
import platform
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd import __version__
from fedqhd.config import RunConfig
from fedqhd.files import append_line, atomic_figure, atomic_save, atomic_write, pyplot
from fedqhd.learners.base import RETURN_CURVES, Curves

ROUNDS = "rounds.jsonl"    #: one JSON object per round, appended as rounds end
RESULTS = "results.json"   #: the run's rounds and its final entry, written when it ends

#: the packages whose versions decide a run's numbers, recorded in ``run_config.json``
RECORDED_PACKAGES = ("flwr", "numpy", "gymnasium", "scikit-learn")


def package_versions() -> dict[str, str | None]:
    """Installed versions of :data:`RECORDED_PACKAGES` (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in RECORDED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def new_run_dir(root: str | Path) -> Path:
    """A fresh ``root/<YYYY-MM-DD>/<HH-MM-SS>`` folder (suffixed if it exists)."""
    now = datetime.now()
    base = Path(root).expanduser().resolve() / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")
    path, n = base, 1
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    path.mkdir(parents=True)
    return path


def read_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """The rounds a run has recorded: ``results.json``'s once it has ended, else the
    complete lines of ``rounds.jsonl`` (a run still going, or killed; a line torn by a
    kill is left out)."""
    run_dir = Path(run_dir)
    if (run_dir / RESULTS).is_file():
        return list(json.loads((run_dir / RESULTS).read_text())["rounds"])
    if not (run_dir / ROUNDS).is_file():
        return []
    lines = []
    for line in (run_dir / ROUNDS).read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            break  # the last line, cut short
    return merge_lines(lines)


def merge_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``rounds.jsonl``'s lines: a line of a round already seen adds its
    entries to that round's row (:meth:`RunRecorder.amend_round`)."""
    rows: list[dict[str, Any]] = []
    by_round: dict[Any, dict[str, Any]] = {}
    for line in lines:
        row = by_round.get(line.get("round"))
        if row is None:
            row = by_round[line.get("round")] = dict(line)
            rows.append(row)
        else:
            row.update(line)
    return rows


def preload_plotting() -> None:
    """Import matplotlib in a background thread while the rounds run: the ServerApp
    mostly waits for its clients then, and :meth:`RunRecorder.plot` at the run's end
    no longer pays the import (0.3 s of a warm-cluster run's tear-down)."""
    threading.Thread(target=pyplot, name="fedqhd-plotting", daemon=True).start()


class RunRecorder:
    """Collects one row per round and writes the run's files.

    ``rows`` and ``rows_bytes`` continue a resumed run: its rounds so far and the length
    of ``rounds.jsonl`` that holds them (``run_config.json`` is then left as it is).
    """

    def __init__(self, cfg: RunConfig, out_dir: Path, extra: dict[str, Any] | None = None,
                 rows: list[dict[str, Any]] | None = None, rows_bytes: int = 0,
                 curves: Curves | None = None, title: str = ""):
        self.cfg = cfg
        self.out_dir = out_dir
        self.curves = curves or RETURN_CURVES
        self.title = title or f"{cfg.env_id}: {cfg.resolved_strategy}, {cfg.encoder} encoder"
        self.rounds: list[dict[str, Any]] = list(rows or [])
        #: bytes of rounds.jsonl holding self.rounds (what a checkpoint records)
        self.rows_bytes = int(rows_bytes)
        # a resumed run's wall time goes on from its last round (time stopped not counted)
        self.started = time.time() - (self.rounds[-1].get("wall-time-s", 0.0)
                                      if self.rounds else 0.0)
        preload_plotting()
        if rows is not None:
            return
        info = {"config": cfg.record(), "seed": cfg.seed, "fedqhd-version": __version__,
                "python": platform.python_version(), "versions": package_versions(),
                "started": datetime.now().isoformat()}
        info.update(extra or {})
        atomic_write(out_dir / "run_config.json", json.dumps(info, indent=2, sort_keys=True))

    def record_round(self, row: dict[str, Any]) -> None:
        """Keep ``row`` and append it to ``rounds.jsonl`` (one line, fsynced)."""
        row = {"round": int(row["round"]), **{k: v for k, v in row.items() if k != "round"}}
        row["wall-time-s"] = round(time.time() - self.started, 3)
        self.rounds.append(row)
        self.rows_bytes = append_line(self.out_dir / ROUNDS, json.dumps(row))

    def amend_round(self, server_round: int, entries: dict[str, Any]) -> dict[str, Any]:
        """Add ``entries`` to the row of ``server_round`` (recorded already), appending
        them to ``rounds.jsonl`` as a line of that round; returns the row."""
        row = next((r for r in reversed(self.rounds) if r["round"] == server_round), None)
        if row is None:
            raise KeyError(f"no row of round {server_round} to amend")
        row.update(entries)
        self.rows_bytes = append_line(self.out_dir / ROUNDS,
                                      json.dumps({"round": int(server_round), **entries}))
        return row

    def finish(self, arrays: dict[str, np.ndarray], extra: dict[str, Any] | None = None
               ) -> dict[str, Any]:
        """Write the model, the plot and then ``results.json`` with the final entry; returns
        the final entry.

        If the model or the plot cannot be written (a full disk), ``results.json`` still
        says so: its status is ``failed`` with the error as the reason (whatever the run's
        status was), and the error is raised again. A ``results.json`` that cannot be
        written raises; being atomic, it never says ``completed`` for outputs it lacks.
        """
        evaluated = [r for r in self.rounds if "return-mean" in r]
        last = evaluated[-1] if evaluated else {}
        best = max(evaluated, key=lambda r: r["return-mean"]) if evaluated else {}
        final = {"round": last.get("round"), "return-mean": last.get("return-mean"),
                 "return-std": last.get("return-std"), "best-round": best.get("round"),
                 "best-return-mean": best.get("return-mean"),
                 "wall-time-s": round(time.time() - self.started, 3)}
        final.update(extra or {})
        # typed as Any: numpy's stub would match ** of arrays against allow_pickle: bool
        payload: dict[str, Any] = arrays
        try:
            atomic_save(self.out_dir / "final_model.npz", lambda fh: np.savez(fh, **payload))
            self.plot()
        except Exception as exc:
            earlier = final.get("reason")
            final.update(status="failed", reason=(
                f"writing the run's outputs failed: {type(exc).__name__}: {exc}"
                + (f" (after: {earlier})" if final.get("status") == "failed" and earlier
                   else "")))
            self._write_results(final)
            raise
        self._write_results(final)
        return final

    def _write_results(self, final: dict[str, Any]) -> None:
        results = {"seed": self.cfg.seed, "env-id": self.cfg.env_id,
                   "strategy": self.cfg.resolved_strategy, "encoder": self.cfg.encoder,
                   "rounds": self.rounds, "final": final}
        atomic_write(self.out_dir / RESULTS, json.dumps(results, indent=2))

    def plot(self) -> Path:
        """The learning curve this learner defines (:class:`~fedqhd.learners.base.Curves`):
        its metrics per round (with their band) on the left, the first diagnostic present
        (Bellman or projection residual) and, for ADMM clients, the consensus gap on the
        right; integer round ticks; no empty panel."""
        plt = pyplot()
        from matplotlib.ticker import MaxNLocator

        curves = self.curves
        gap = [(r["round"], r["consensus-gap"]) for r in self.rounds if "consensus-gap" in r]
        diagnostic = next(((key, label) for key, label in curves.diagnostics
                           if any(key in r for r in self.rounds)), None)
        right = diagnostic is not None or bool(gap)
        fig, axes = plt.subplots(1, 1 + right, figsize=(10 if right else 6, 3.8), squeeze=False)
        ax = axes[0, 0]
        for i, (key, label) in enumerate(curves.lines):
            rows = [r for r in self.rounds if isinstance(r.get(key), int | float)]
            if not rows:
                continue
            x = np.array([r["round"] for r in rows])
            m = np.array([r[key] for r in rows], dtype=float)
            (line,) = ax.plot(x, m, marker="o" if i == 0 else ".", label=label)
            if i == 0 and curves.band is not None:
                s = np.array([r.get(curves.band[0], 0.0) for r in rows], dtype=float)
                ax.fill_between(x, m - s, m + s, alpha=0.2, color=line.get_color(),
                                label=curves.band[1])
        ax.set(xlabel="round", ylabel=curves.ylabel, title=self.title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        panels = [ax]
        if right:
            ax2 = axes[0, 1]
            panels.append(ax2)
            if diagnostic is not None:
                key, label = diagnostic
                ax2.plot(*zip(*[(r["round"], r[key]) for r in self.rounds if key in r],
                               strict=True), marker=".")
                ax2.set(ylabel=label, title="diagnostics")
                ax2.ticklabel_format(axis="y", useOffset=False)
            ax2.set_xlabel("round")
            if gap:  # ADMM clients: how far local readouts are from the consensus
                twin = ax2.twinx()
                twin.semilogy(*zip(*gap, strict=True), color="tab:orange", marker=".")
                twin.set_ylabel("consensus gap (ADMM)", color="tab:orange")
                ax2.set_title("local fit and consensus")
        for panel in panels:
            panel.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        try:
            return atomic_figure(fig, self.out_dir / "learning_curve.png", dpi=110)
        finally:
            plt.close(fig)
