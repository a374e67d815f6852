"""The FedQHD paper's table on its own protocol: ``fedqhd bench --suite paper``.

Every cell is one method on one task in one setting (shared or heterogeneous
encoders) for one seed, under the paper's online protocol: ``clients`` clients,
``episodes`` episodes each, collected by each client's current epsilon-greedy
policy; the metric is the paper's, the mean training return of each client's
last 100 episodes, averaged over clients. Methods:

* ``fedqhd`` -- ours: bounded ridge FQI on HD features, readout averaging (shared)
  or anchor-set teacher compilation (heterogeneous);
* ``independent`` -- the same learners, never aggregated;
* ``truncate`` -- the paper's truncate FedAvg: the same learners, readouts cut to
  the smallest ``D_i`` and averaged; with the shared encoder it is plain readout
  averaging, i.e. exactly ``fedqhd`` shared;
* ``pooled`` -- one learner fitting ridge FQI on the pooled buffers of all clients,
  every client acting with its readout (shared setting only: one feature space; the
  paper reports no number);

Every cell runs the Flower apps in process (:func:`run_app_cell`): the ServerApp's rounds
and one ClientApp per client, the code ``flwr run`` executes, on the in-process Grid. The
FQI methods are the run config's ``strategy`` values (``fedqhd`` is ``auto``).
* ``fedavg-dqn`` -- FedAvg of DQN MLPs (shared setting only, as in the paper);
* ``distill-dqn`` -- distillation FedDQN on anchor states (both settings)
  (:mod:`fedqhd.baselines.dqn`, extra ``dqn``).

The suite writes ``paper.json`` (every cell, rewritten after each, with the versions
that computed it), one learning-curve PNG per task and ``paper-table.md``: mean +- std
over seeds with the paper's number beside each cell, and wall and CPU seconds per run.
The full table is hours of CPU, so it is built in pieces: a suite stopped part-way goes
on with ``resume`` (only the missing cells run), and :func:`merge` joins the
``paper.json`` of several suites (other machines, other days) into one table.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedqhd.files import atomic_figure, atomic_write, pyplot
from fedqhd.strategies.contract import REPLIES_REJECTED

ENVS: tuple[str, ...] = ("CartPole-v1", "Acrobot-v1", "LunarLander-v3", "MountainCar-v0")
SETTINGS: tuple[str, ...] = ("shared", "heterogeneous")
METHODS: tuple[str, ...] = ("fedqhd", "independent", "truncate", "fedavg-dqn",
                             "distill-dqn", "pooled")
#: the run-config keys of each method (with ``encoder`` = the setting): every cell runs
#: the Flower apps; the paper weights its deep baselines' clients alike
METHOD_KEYS: dict[str, dict[str, Any]] = {
    "fedqhd": {"learner": "fqi", "strategy": "auto"},
    "independent": {"learner": "fqi", "strategy": "independent"},
    "truncate": {"learner": "fqi", "strategy": "truncate"},
    "pooled": {"learner": "fqi", "strategy": "pooled"},
    "fedavg-dqn": {"learner": "dqn", "strategy": "avg", "weighting": "uniform"},
    "distill-dqn": {"learner": "dqn", "strategy": "anchor", "weighting": "uniform"},
}
SEEDS: tuple[int, ...] = (42, 43, 44)

#: the paper's main table (3-seed means of the last-100 training return), (shared, heterogeneous);
#: None where the paper has no entry
PAPER: dict[str, dict[str, tuple[float | None, float | None]]] = {
    "independent": {"CartPole-v1": (26.1, 24.0), "Acrobot-v1": (-306.1, -495.4),
                    "LunarLander-v3": (-187.3, -174.6), "MountainCar-v0": (-200.0, -200.0)},
    "truncate": {"CartPole-v1": (230.8, 112.6), "Acrobot-v1": (-106.5, -280.8),
                     "LunarLander-v3": (65.0, -24.8), "MountainCar-v0": (-148.3, -172.9)},
    "fedavg-dqn": {"CartPole-v1": (120.8, None), "Acrobot-v1": (-85.3, None),
                   "LunarLander-v3": (200.9, None), "MountainCar-v0": (-167.8, None)},
    "distill-dqn": {"CartPole-v1": (169.9, 149.4), "Acrobot-v1": (-87.5, -89.2),
                    "LunarLander-v3": (122.5, 131.4), "MountainCar-v0": (-156.0, -174.3)},
    "fedqhd": {"CartPole-v1": (466.3, 351.1), "Acrobot-v1": (-105.0, -102.5),
               "LunarLander-v3": (224.1, 101.5), "MountainCar-v0": (-143.7, -162.3)},
    "pooled": {e: (None, None) for e in ENVS},
}


#: methods named differently before the suite ran the apps' strategies by their names
RENAMED: dict[str, str] = {"truncate-avg": "truncate", "oracle": "pooled"}


def parse_seeds(text: str) -> list[int]:
    """``"42,43,44"`` or ranges ``"42-61"`` (both ends included), mixed by commas, as a
    list of distinct non-negative seeds in the order given; ``ValueError`` naming the
    part that is not."""
    seeds: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range A-B of seeds") from None
        if a < 0 or b < a:
            raise ValueError(f"{part!r}: seeds are >= 0 and a range A-B needs A <= B")
        seeds.extend(range(a, b + 1))
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    repeated = sorted(s for s, n in Counter(seeds).items() if n > 1)
    if repeated:
        raise ValueError(f"seeds given twice: {repeated}")
    return seeds


def paper_number(method: str, env_id: str, setting: str) -> float | None:
    """The paper's 3-seed mean for a cell, or None."""
    pair = PAPER.get(method, {}).get(env_id)
    return None if pair is None else pair[SETTINGS.index(setting)]


def not_applicable(method: str, env_id: str, setting: str) -> str | None:
    """Why a cell cannot run, or None. FedAvg of network parameters needs one architecture
    (shared setting only); the pooled oracle's cell is whatever its run config refuses (it
    sums FQI statistics of one feature space: CartPole's preset, shared)."""
    if method == "fedavg-dqn" and setting == "heterogeneous":
        return "fedavg-dqn needs the shared setting (one network architecture)"
    if method == "pooled":
        from fedqhd.config import ConfigError, RunConfig

        try:
            RunConfig.from_run_config(app_run_config(method, env_id, setting, 0))
        except ConfigError as exc:
            return str(exc)
    return None


def run_cell(method: str, env_id: str, setting: str, seed: int, episodes: int = 600,
             clients: int = 5) -> dict[str, Any]:
    """One method, task, setting and seed; returns the paper's metric, the final greedy
    return, the learning curve (per round) and wall and CPU seconds."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(METHODS)}")
    if setting not in SETTINGS:
        raise ValueError(f"unknown setting {setting!r}; one of {', '.join(SETTINGS)}")
    reason = not_applicable(method, env_id, setting)
    if reason:
        raise ValueError(reason)
    return run_app_cell(method, env_id, setting, seed, episodes, clients)


def app_run_config(method: str, env_id: str, setting: str, seed: int, episodes: int = 600,
                   clients: int = 5) -> dict[str, Any]:
    """The run config of a cell: the method's keys, the task's online settings
    (``preset = auto``), the paper's weighted means with the default norm screen (no
    client lies in a study, so ``weight-cap-factor`` and ``clip-factor`` are 0: the
    defaults' clipping touches a few honest replies on MountainCar and Acrobot,
    BENCHMARKS.md "Adaptive attackers"; the norm screen stays on, as users get it: on a
    few seeds it leaves out an honest reply far from the rest, and most score higher for
    it, BENCHMARKS.md "The norm screen in the paper's cells"; each cell counts the
    replies left out) and one greedy evaluation, after the last round (the training return is
    the paper's metric)."""
    return {"protocol": "online", "env-id": env_id, "encoder": setting, "seed": seed,
            **METHOD_KEYS[method], "min-nodes": clients, "online-episodes": episodes,
            "weight-cap-factor": 0.0, "clip-factor": 0.0, "eval-every": 100_000}


def run_app_cell(method: str, env_id: str, setting: str, seed: int, episodes: int = 600,
                 clients: int = 5) -> dict[str, Any]:
    """A cell: ``clients`` ClientApps and the ServerApp's rounds in this process (the
    in-process Grid, :class:`fedqhd.server.inprocess.InProcessGrid`), the code a ``flwr
    run`` executes, with Flower's per-round log lines held back."""
    import logging
    import shutil
    import tempfile

    from fedqhd.client.app import app as client_app
    from fedqhd.console import console_level
    from fedqhd.learners import parse_run_config
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    keys = app_run_config(method, env_id, setting, seed, episodes, clients)
    scratch = Path(tempfile.mkdtemp(prefix="fedqhd-paper-"))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        cfg = parse_run_config({**keys, "output-dir": str(scratch)})
        with console_level(logging.WARNING):
            final, out_dir = run_federation(
                InProcessGrid([client_app] * clients, run_config=cfg.to_run_config()), cfg)
        rows = json.loads((out_dir / "results.json").read_text())["rounds"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    label = f"{method} {env_id} {setting} seed {seed}"
    if final.get("status") != "completed":
        raise RuntimeError(f"{label}: the run failed ({final.get('reason')})")
    return {**cell_from_rounds(rows, cfg.episodes_per_round, label),
            # replies a safeguard (in a study: the norm screen) left out, over the run
            "replies-rejected": final["replies"][REPLIES_REJECTED],
            "wall-s": time.perf_counter() - wall0, "cpu-s": time.process_time() - cpu0,
            "config": cfg.record()}


def cell_from_rounds(rows: list[dict[str, Any]], episodes_per_round: int, label: str
                     ) -> dict[str, Any]:
    """A completed run's cell figures from its round rows: the last round's training and
    greedy returns, and the curves. A round whose every train reply was refused reports
    no training return and is left out of the curves; if that round is the last, the run
    has no final figure and the cell is refused (``RuntimeError``), not guessed."""
    last = rows[-1]
    if "train-return-last100" not in last:
        counts = ", ".join(f"{k} {v:g}" for k, v in last.items()
                           if k.startswith("replies-") and v)
        raise RuntimeError(f"{label}: the last round ({last.get('round')}) accepted no train "
                           f"reply ({counts or 'no replies'}), so the run has no final "
                           "training return")

    def curve(key: str) -> list[tuple[int, float]]:
        return [(r["round"] * episodes_per_round, r[key]) for r in rows if key in r]

    return {"train-return-last100": float(last["train-return-last100"]),
            "greedy-return": float(last["return-mean"]),
            "curve": curve("train-return-last100"),
            # FQI and TD clients report their start states' value bias; DQN clients do not
            "value-bias": curve("value-bias")}


def checkout_commit(package_dir: Path) -> str | None:
    """The git commit of the fedqhd checkout ``package_dir`` (the package folder) sits at
    the top of, with ``-dirty`` for uncommitted changes to tracked files; None for a
    package installed anywhere else (a wheel inside some other project's repository must
    not report that project's commit) or where git is missing."""
    import subprocess

    def git(*args: str) -> str | None:
        done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=package_dir, check=False)
        return done.stdout.strip() if done.returncode == 0 else None

    try:
        top = git("rev-parse", "--show-toplevel")
        if top is None or Path(top).resolve() != Path(package_dir).resolve().parent:
            return None
        commit = git("rev-parse", "HEAD")
        if commit and git("status", "--porcelain", "--untracked-files=no"):
            commit += "-dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    """What computed a cell, for ``paper.json``: package versions, Python, the machine,
    and the git commit of a fedqhd checkout (:func:`checkout_commit`)."""
    import platform

    from fedqhd import __version__

    return {"fedqhd": __version__,
            "git-commit": checkout_commit(Path(__file__).resolve().parent),
            "numpy": np.__version__, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count()}


def cell_key(cell: dict[str, Any]) -> tuple[str, str, str, int]:
    """A cell's identity: method, task, setting, seed."""
    return (str(cell["method"]), str(cell["env-id"]), str(cell["setting"]), int(cell["seed"]))


def load_summary(path: Path) -> dict[str, Any]:
    """A suite's ``paper.json``, checked to be one (protocol and cells), with a clear error."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable paper.json ({exc})") from None
    if not (isinstance(data, dict) and isinstance(data.get("cells"), list)
            and isinstance(data.get("protocol"), dict)):
        raise ValueError(f"{path}: not a paper suite's paper.json (no protocol and cells)")
    for c in data["cells"]:
        if isinstance(c, dict) and c.get("method") in RENAMED:  # a suite before 2026-12-04
            c["method"] = RENAMED[c["method"]]
        try:
            cell_key(c)
            float(c["train-return-last100"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: a cell without method, env-id, setting, seed and "
                             f"train-return-last100: {str(c)[:120]}") from None
    return data


def _same_protocol(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a.get("clients"), a.get("episodes")) == (b.get("clients"), b.get("episodes"))


def merge(paths: Sequence[Path]) -> dict[str, Any]:
    """One summary from several suites' ``paper.json`` (same protocol: clients and
    episodes). A cell present in two files must carry the same result (a rerun that
    reproduced it); different results for one cell are refused, naming both files, since
    the table could only pick one of them silently. Each cell keeps the environment of the
    suite that computed it."""
    if not paths:
        raise ValueError("merge: no paper.json given")
    merged: dict[str, Any] = {}
    source: dict[tuple[str, str, str, int], Path] = {}
    for path in paths:
        data = load_summary(path)
        if not merged:
            merged = {"protocol": data["protocol"], "started": data.get("started"),
                      "merged-from": [], "cells": []}
        elif not _same_protocol(merged["protocol"], data["protocol"]):
            raise ValueError(f"{path}: protocol {data['protocol']} differs from "
                             f"{paths[0]}'s {merged['protocol']}; cells of different "
                             "protocols do not belong in one table")
        merged["merged-from"].append(str(path))
        env = data.get("environment")
        for c in data["cells"]:
            key = cell_key(c)
            if key in source:
                kept = next(k for k in merged["cells"] if cell_key(k) == key)
                if kept["train-return-last100"] != c["train-return-last100"]:
                    raise ValueError(
                        f"cell {key} is in {source[key]} ({kept['train-return-last100']}) "
                        f"and {path} ({c['train-return-last100']}) with different results; "
                        "remove one of them")
                continue
            source[key] = path
            merged["cells"].append({**c, "environment": c.get("environment", env)})
    merged["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    return merged


def write_outputs(summary: dict[str, Any], out: Path) -> None:
    """``paper.json``, ``paper-table.md`` and the curves of ``summary`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "paper.json", summary)
    atomic_write(out / "paper-table.md", markdown_table(summary))
    plot_curves(summary, out)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Whole or not at all: a suite killed while writing keeps its last complete file."""
    atomic_write(path, json.dumps(data, indent=1, default=float))


def run_suite(envs: Sequence[str] = ENVS, settings: Sequence[str] = SETTINGS,
              methods: Sequence[str] = METHODS, seeds: Sequence[int] = SEEDS,
              out: Path = Path("outputs/paper"), episodes: int = 600, clients: int = 5,
              progress: bool = True, cell: Callable[..., dict[str, Any]] = run_cell,
              resume: bool = False, overwrite: bool = False, jobs: int = 1
              ) -> dict[str, Any]:
    """Run every applicable cell, writing ``paper.json`` after each; then plots and table.

    An ``out`` that already holds a ``paper.json`` with cells is refused (hours of runs
    are not overwritten by a repeated command) unless ``resume`` (keep its cells, run only
    the missing ones; the protocol must match) or ``overwrite``. ``jobs`` > 1 runs that
    many cells at once, each in its own worker process with one BLAS thread (a cell's
    numbers are then those of a single-threaded run, whatever the machine's cores: the
    same bits as ``OMP_NUM_THREADS=1`` and ``jobs`` 1); ``cell`` must then be picklable
    (a module-level function). The new cells are written in the order of the jobs."""
    from tqdm import tqdm

    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    reasons = {(m, e, s): not_applicable(m, e, s) for e in envs for s in settings
               for m in methods}
    todo = [(m, e, s, seed) for e in envs for s in settings for m in methods
            for seed in seeds if not reasons[m, e, s]]
    skipped = [{"method": m, "env-id": e, "setting": s, "reason": why}
               for (m, e, s), why in reasons.items() if why]
    for x in skipped if progress else []:
        print(f"paper suite: no {x['method']} {x['env-id']} {x['setting']}: {x['reason']}",
              file=sys.stderr)
    protocol = {"clients": clients, "episodes": episodes, "metric": "train-return-last100"}
    summary: dict[str, Any] = {"protocol": protocol,
                               "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                               "environment": environment(), "cells": [], "skipped": skipped}
    found = out / "paper.json"
    if found.exists() and not overwrite:
        earlier = load_summary(found)
        if earlier["cells"] and not resume:
            raise FileExistsError(
                f"{found} holds {len(earlier['cells'])} cells (started "
                f"{earlier.get('started')}); resume runs only the missing cells, overwrite "
                "starts over (--resume / --overwrite)")
        if resume:
            if not _same_protocol(earlier["protocol"], protocol):
                raise ValueError(f"{found}: protocol {earlier['protocol']}, asked for "
                                 f"{protocol}; resume needs the same clients and episodes")
            env = earlier.get("environment")
            summary["started"] = earlier.get("started", summary["started"])
            summary["cells"] = [{**c, "environment": c.get("environment", env)}
                                for c in earlier["cells"]]
            done = {cell_key(c) for c in summary["cells"]}
            todo = [j for j in todo if j not in done]
    out.mkdir(parents=True, exist_ok=True)
    kept = list(summary["cells"])
    new: dict[int, dict[str, Any]] = {}

    def record(i: int, result: dict[str, Any]) -> None:
        """Keep cell ``i`` of ``todo`` (after the kept ones, in job order) and write."""
        method, env_id, setting, seed = todo[i]
        new[i] = {"method": method, "env-id": env_id, "setting": setting, "seed": seed,
                  **result}
        summary["cells"] = kept + [new[k] for k in sorted(new)]
        _write_json(found, summary)

    bar = tqdm(total=len(todo), desc="paper suite", unit="run", disable=not progress)
    try:  # closed before a failure's one line is printed, not after it
        if jobs == 1:
            for i, (method, env_id, setting, seed) in enumerate(todo):
                bar.set_postfix_str(f"{method} {env_id} {setting} seed {seed}")
                record(i, cell(method, env_id, setting, seed, episodes=episodes,
                               clients=clients))
                bar.update()
        else:
            _run_parallel(todo, cell, episodes, clients, jobs, record, bar)
    finally:
        bar.close()
    summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    write_outputs(summary, out)
    return summary


_WORKER_LIMITS: Any = None  #: a worker process's thread limit, kept alive


def _worker_init(scratch: str) -> None:
    """Worker initializer: one BLAS / OpenMP thread for the worker's life, and its
    temporary files (each cell's run folder) under the suite's ``scratch``, which the
    suite removes however the worker ends."""
    import tempfile

    from threadpoolctl import threadpool_limits

    global _WORKER_LIMITS
    _WORKER_LIMITS = threadpool_limits(limits=1)
    tempfile.tempdir = scratch


def _run_parallel(todo: Sequence[tuple[str, str, str, int]], cell: Callable[..., dict[str, Any]],
                  episodes: int, clients: int, jobs: int,
                  record: Callable[[int, dict[str, Any]], None], bar: Any) -> None:
    """Run ``todo``'s cells in ``jobs`` spawned worker processes, recording each as it
    ends. A cell that raises stops the suite: the cells not yet started are cancelled,
    those running are waited for (and kept), then the error is raised."""
    import multiprocessing
    import tempfile
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")  # no fork of a process with BLAS / JAX threads
    before = set(multiprocessing.active_children())
    with tempfile.TemporaryDirectory(prefix="fedqhd-suite-") as scratch, \
            ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_worker_init,
                                initargs=(scratch,)) as pool:
        futures = {pool.submit(cell, method, env_id, setting, seed, episodes=episodes,
                               clients=clients): i
                   for i, (method, env_id, setting, seed) in enumerate(todo)}
        pending = set(futures)
        error: BaseException | None = None
        try:
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in sorted(done, key=futures.__getitem__):
                    exc = fut.exception()
                    if exc is not None:
                        error = error or exc
                        continue
                    i = futures[fut]
                    record(i, fut.result())
                    method, env_id, setting, seed = todo[i]
                    bar.set_postfix_str(f"done: {method} {env_id} {setting} seed {seed}")
                    bar.update()
                if error is not None and pending:
                    for fut in pending:
                        fut.cancel()
                    pending = {f for f in pending if not f.cancelled()}
        except KeyboardInterrupt:
            # Ctrl-C reaches the workers too, ``kill PID`` only this process: end the
            # workers now rather than wait minutes for their cells (their run folders go
            # with ``scratch``)
            for fut in pending:
                fut.cancel()
            for worker in set(multiprocessing.active_children()) - before:
                worker.kill()
            raise
        if error is not None:
            raise error


def _cells(summary: dict[str, Any], method: str, env_id: str, setting: str
           ) -> list[dict[str, Any]]:
    return [c for c in summary["cells"] if (c["method"], c["env-id"], c["setting"])
            == (method, env_id, setting)]


def markdown_table(summary: dict[str, Any]) -> str:
    """Method x (task, setting): ours mean +- std over seeds, the paper's number beside it;
    then wall and CPU seconds per run (means)."""
    cells = summary["cells"]
    envs = [e for e in ENVS if any(c["env-id"] == e for c in cells)]
    settings = [s for s in SETTINGS if any(c["setting"] == s for c in cells)]
    methods = [m for m in METHODS if any(c["method"] == m for c in cells)]
    cols = [(e, s) for e in envs for s in settings]
    head = " | ".join(f"{e.split('-')[0]} {'shared' if s == 'shared' else 'het.'}" for e, s in cols)
    lines = [f"Last-100 training return, mean +- std over seeds (paper's number in brackets); "
             f"{summary['protocol']['clients']} clients x {summary['protocol']['episodes']} "
             f"episodes.", "", f"| method | {head} |", "|---|" + "---:|" * len(cols)]
    times = ["", "Wall / CPU seconds per run (mean over seeds).", "",
             f"| method | {head} |", "|---|" + "---:|" * len(cols)]
    spread = ["", "Seeds per cell / standard error of the mean (sample std / sqrt(seeds); "
              "a 3-seed mean moves by a few of these between seed sets).", "",
              f"| method | {head} |", "|---|" + "---:|" * len(cols)]
    for m in methods:
        row, trow, srow = [], [], []
        for e, s in cols:
            got = _cells(summary, m, e, s)
            paper = paper_number(m, e, s)
            ref = f" ({paper:g})" if paper is not None else ""
            if not got:
                row.append("-" + ref)
                trow.append("-")
                srow.append("-")
                continue
            v = np.array([c["train-return-last100"] for c in got])
            row.append(f"{v.mean():.1f} +- {v.std():.1f}{ref}")
            trow.append(f"{np.mean([c['wall-s'] for c in got]):.0f} / "
                        f"{np.mean([c['cpu-s'] for c in got]):.0f}")
            srow.append(f"{len(v)} / {v.std(ddof=1) / np.sqrt(len(v)):.1f}" if len(v) > 1
                        else "1 / -")
        lines.append(f"| {m} | " + " | ".join(row) + " |")
        times.append(f"| {m} | " + " | ".join(trow) + " |")
        spread.append(f"| {m} | " + " | ".join(srow) + " |")
    # cells from before the count have no key: nothing is claimed for them
    left_out = [f"{c['method']} {c['env-id']} {c['setting']} seed {c['seed']}: "
                f"{c['replies-rejected']}" for c in cells if c.get("replies-rejected")]
    if left_out:
        spread += ["", "Replies a safeguard left out (the default norm screen), by run: "
                   + "; ".join(left_out) + "."]
    return "\n".join(lines + times + spread) + "\n"


def plot_curves(summary: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per task: last-100 training return against episodes, per method and setting
    (mean over seeds, band: min to max)."""
    plt = pyplot()

    written = []
    for env_id in sorted({c["env-id"] for c in summary["cells"]}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for method in METHODS:
            for setting in SETTINGS:
                got = [c for c in _cells(summary, method, env_id, setting) if c.get("curve")]
                if not got:
                    continue
                n = min(len(c["curve"]) for c in got)
                x = np.array([p[0] for p in got[0]["curve"][:n]])
                y = np.array([[p[1] for p in c["curve"][:n]] for c in got])
                line, = ax.plot(x, y.mean(0), label=f"{method} ({setting})",
                                linestyle="-" if setting == "shared" else "--")
                ax.fill_between(x, y.min(0), y.max(0), alpha=0.15, color=line.get_color())
        ax.set_xlabel("episodes per client")
        ax.set_ylabel("mean return of the last 100 training episodes")
        ax.set_title(f"{env_id}: mean over seeds, band min-max", fontsize=9)
        ax.legend(fontsize=7)
        fig.tight_layout()
        try:
            written.append(atomic_figure(fig, out / f"curves-{env_id}.png", dpi=110))
        finally:
            plt.close(fig)
    return written
