"""Where a simulated round goes: the same run in process and under ``flwr run`` (Ray).

Both measurements run in child processes and are measured the same way: wall time,
per-round times from the run's ``results.json`` (its ``wall-time-s`` column, counted
from the ServerApp's start, so Ray's start-up falls before round 1 or into it), the
peak of the summed resident memory of the whole process tree (SuperLink, simulation
process, Ray and its workers), sampled every 0.2 s from ``/proc``, and the CPU seconds
of that tree (the measure that survives a shared machine).

``flwr run`` gets a private SuperLink on free ports and a private ``FLWR_HOME`` (the
command ``flwr run`` itself would start for ``:local:``), stopped with everything it
spawned by process group when the measurement ends, also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedqhd.deploy.launcher import free_port
from fedqhd.files import atomic_write

BIN = Path(sys.executable).parent
GIB = 2.0**30


# ------------------------------------------------------------------ process memory
def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids of every process visible in /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def _name(pid: int) -> str:
    """A short name for a process: its script (``flwr-simulation``, ``raylet``, ...), or
    ``ray::<actor class>`` for a Ray worker."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in args if a]
    if words and words[0].startswith("ray::"):
        return words[0]
    if "-c" in words:
        return "python -c"
    scripts = [w for w in words if not w.startswith("-")]
    pick = scripts[1] if len(scripts) > 1 and "python" in Path(scripts[0]).name else (
        scripts[0] if scripts else "?")
    return Path(pick).name


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (``None``: gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree_pids(pids: list[int]) -> list[int]:
    """``pids`` and all their descendants now, parents before children."""
    tree, out, seen = _children(), [], set()
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        stack.extend(tree.get(pid, []))
    return out


def tree_rss(pids: list[int], by_name: dict[str, int] | None = None,
             cpu: dict[int, float] | None = None) -> int:
    """Summed resident memory (bytes) of ``pids`` and all their descendants; with
    ``by_name``, also added up per process name there; with ``cpu``, each process's CPU
    seconds so far are recorded there by pid."""
    total = 0
    for pid in tree_pids(pids):
        if cpu is not None and (used := _cpu_seconds(pid)) is not None:
            cpu[pid] = used
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    total += rss
                    if by_name is not None:
                        name = _name(pid)
                        by_name[name] = by_name.get(name, 0) + rss
                    break
        except OSError:
            continue
    return total


class PeakMemory:
    """Samples :func:`tree_rss` of some root processes in a thread; ``peak`` in bytes,
    ``at_peak``, the per-process-name split of that peak, and ``cpu_seconds``, the CPU
    time of every process of the tree (as last sampled: a process's last 0.2 s before it
    exits are missed). CPU seconds, unlike wall time, hardly depend on what else the
    machine runs. With ``limit``, a tree that goes above it is killed, every process by
    its pid (Ray's processes are in another process group than the SuperLink's)."""

    def __init__(self, interval: float = 0.2, limit: int | None = None,
                 series: bool = False) -> None:
        self.pids: list[int] = []
        #: with ``series``: (seconds since start, CPU seconds so far by process name) at
        #: every sample, to split a run's CPU between its rounds
        self.series: list[tuple[float, dict[str, float]]] | None = [] if series else None
        self.limit = limit  #: bytes; above it every process of the tree is killed by pid
        self.exceeded = 0  #: the total that went above ``limit`` (0: never)
        self.peak = 0
        self.at_peak: dict[str, int] = {}
        self.cpu: dict[int, float] = {}
        #: pid -> the last name seen (``ray::IDLE`` becomes ``ray::ClientAppActor``)
        self.names: dict[int, str] = {}
        self.t0 = time.perf_counter()
        #: (seconds since start, pid, name) whenever a process appears or is renamed: when
        #: Ray's daemons, its workers and the actors' first ``run`` started
        self.timeline: list[tuple[float, int, str]] = []
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.pids:
                split: dict[str, int] = {}
                total = tree_rss(self.pids, split, self.cpu)
                for pid in self.cpu:
                    name = _name(pid).split(".")[0]  # ray::ClientAppActor(.run)
                    if name != "?" and name != self.names.get(pid):
                        self.names[pid] = name
                        self.timeline.append((round(time.perf_counter() - self.t0, 1),
                                              pid, name))
                if self.series is not None:
                    self.series.append((time.perf_counter() - self.t0, self.cpu_by_name()))
                if total > self.peak:
                    self.peak, self.at_peak = total, split
                if self.limit is not None and total > self.limit and not self.exceeded:
                    self.exceeded = total
                    for pid in reversed(tree_pids(self.pids)):  # children first
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
            self._stop.wait(self.interval)

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu.values())

    def cpu_by_name(self) -> dict[str, float]:
        """CPU seconds per process name (most first): where a run's CPU went."""
        split: dict[str, float] = {}
        for pid, used in self.cpu.items():
            name = self.names.get(pid, "?")
            split[name] = split.get(name, 0.0) + used
        return {k: round(v, 1) for k, v in sorted(split.items(), key=lambda kv: -kv[1])}

    def __enter__(self) -> PeakMemory:
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# ------------------------------------------------------------------ local SuperLink
@contextmanager
def local_superlink(home: Path, extra_env: dict[str, str] | None = None,
                    timeout: float = 60.0, private_cache: bool = True
                    ) -> Iterator[tuple[dict[str, str], subprocess.Popen]]:
    """A private ``flower-superlink --simulation`` on free ports with a private FLWR_HOME
    (the command ``flwr run`` starts for ``:local:``, so ``flwr run`` reuses it); yields
    (the environment ``flwr`` must run with, the SuperLink process).

    It is stopped, with everything it spawned (simulation process, Ray), by process
    group when the block ends, also on failure. ``private_cache``: generated shards go to
    ``home/cache`` (tests), else to the usual cache (as in-process runs use it).

    It starts in a fresh empty folder (``home/superlink-cwd``), never in the caller's:
    Ray puts the folder the SuperLink runs in on every ClientApp worker's ``sys.path``,
    so an app folder there (its ``task.py``) would shadow the modules of every app run
    later (docs/simulation.md, "A stale ClientApp").
    """
    import httpx

    home = Path(home).resolve()  # FLWR_HOME must not depend on the SuperLink's cwd
    http_port, control_port = free_port(), free_port()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               FLWR_HOME=str(home / "flwr-home"),
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
               FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
               FLWR_DISABLE_UPDATE_CHECK="1", RAY_DEDUP_LOGS="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", **(extra_env or {}))
    if private_cache:
        env["FEDQHD_CACHE_DIR"] = str(home / "cache")
    neutral = home / "superlink-cwd"
    neutral.mkdir(parents=True, exist_ok=True)
    link = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", f"127.0.0.1:{control_port}", "--host", "127.0.0.1",
         "--port", str(http_port)],
        env=env, cwd=neutral, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=0.5).is_success:
                    break
            except httpx.HTTPError:
                pass
            if link.poll() is not None:
                raise RuntimeError("flower-superlink exited early")
            if time.monotonic() > deadline:
                raise RuntimeError(f"SuperLink not healthy after {timeout:.0f} s")
            time.sleep(0.3)
        yield env, link
    finally:
        try:
            os.killpg(link.pid, signal.SIGTERM)
            link.wait(timeout=20)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(link.pid, signal.SIGKILL)
            link.wait(timeout=20)


# ------------------------------------------------------------------ the two runs
def round_times(results: Path) -> dict[str, Any]:
    data = json.loads(results.read_text())
    walls = [r["wall-time-s"] for r in data["rounds"]]
    rounds = [b - a for a, b in zip([0.0, *walls[:-1]], walls, strict=True)]
    later = rounds[1:] or rounds
    return {"round-s": [round(r, 3) for r in rounds],
            "later-round-mean-s": round(sum(later) / len(later), 3),
            "return-mean": data["final"]["return-mean"],
            "replies-ok": [r.get("replies-ok") for r in data["rounds"]],
            "results": str(results)}


def timed_lines(proc: subprocess.Popen, t0: float, timeout: float) -> list[tuple[float, str]]:
    """``proc``'s output lines, each with the seconds since ``t0`` when it was read."""
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - t0, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    proc.wait(timeout=timeout)
    reader.join(timeout=10)
    return lines


#: log lines of ``flwr run --stream`` whose first time :func:`_milestones` reports
MILESTONES = {"run submitted": "Successfully started run", "app installed": "Successfully "
              "installed", "strategy started": "Starting FedQHD", "round 1": "[ROUND 1/",
              "round 1 train replies": "train round 1:", "round 2": "[ROUND 2/"}


def _milestones(lines: list[tuple[float, str]]) -> dict[str, float]:
    """Seconds since the start at which each of :data:`MILESTONES` was first logged, and
    the last line ("end")."""
    out: dict[str, float] = {}
    for name, marker in MILESTONES.items():
        hit = next((t for t, line in lines if marker in line), None)
        if hit is not None:
            out[name] = round(hit, 2)
    if lines:
        out["end"] = round(lines[-1][0], 2)
    return out


def _split(mem: PeakMemory) -> dict[str, float]:
    return {k: round(v / GIB, 3) for k, v in sorted(mem.at_peak.items(), key=lambda kv: -kv[1])}


def _run_config_text(run_config: dict[str, Any]) -> str:
    def toml(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f"'{v}'"
        return repr(v)
    return " ".join(f"{k}={toml(v)}" for k, v in run_config.items())


def inprocess(n_clients: int, run_config: dict[str, Any], out: Path,
              timeout: float = 3600.0) -> dict[str, Any]:
    """The run on :class:`~fedqhd.server.inprocess.InProcessGrid` in a child process."""
    out.mkdir(parents=True, exist_ok=True)
    code = ("import json,sys; from fedqhd.studies.scale import _inprocess_child as f; "
            "f(int(sys.argv[1]), json.loads(sys.argv[2]))")
    cfg = {**run_config, "output-dir": str(out / "inprocess")}
    t0 = time.perf_counter()
    with PeakMemory() as mem:
        proc = subprocess.Popen([sys.executable, "-c", code, str(n_clients), json.dumps(cfg)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        mem.pids = [proc.pid]
        log, _ = proc.communicate(timeout=timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"in-process run failed:\n{log[-3000:]}")
    results = sorted((out / "inprocess").glob("*/*/results.json"))[-1]
    return {"mode": "in-process", "clients": n_clients, "wall-s": round(wall, 2),
            "cpu-s": round(mem.cpu_seconds, 1),
            "peak-rss-gib": round(mem.peak / GIB, 3), "peak-by-process-gib": _split(mem),
            **round_times(results)}


def _inprocess_child(n_clients: int, run_config: dict[str, Any]) -> None:
    from fedqhd.client.app import app as client_app
    from fedqhd.learners import parse_run_config
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    cfg = parse_run_config(run_config)
    run_federation(InProcessGrid([client_app] * n_clients, run_config=cfg.to_run_config()), cfg)


class _Profiler:
    """py-spy on a SuperLink's process tree, written to ``out`` as collapsed stacks with
    one root frame per process. ``--subprocesses`` loses Ray's workers (they start as
    ``setup_worker.py`` and exec into the actor), so every ``ray::`` worker that appears
    (the ClientAppActors, found by polling) gets its own py-spy, merged into ``out``
    under a ``process PID:"ray::..."`` root frame when :meth:`stop` is called."""

    def __init__(self, root: int, out: Path) -> None:
        self.root, self.out = root, out
        self.spies: list[tuple[int, str, Path, subprocess.Popen]] = [
            (root, "", out, self._spy(root, out, "--subprocesses"))]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    @staticmethod
    def _spy(pid: int, out: Path, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "py-spy"), "record", "--pid", str(pid), *extra,
                                 "--rate", "20", "--format", "raw", "--output", str(out),
                                 "--nonblocking"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def _watch(self) -> None:
        seen = {self.root}
        while not self._stop.wait(0.3):
            for pid in tree_pids([self.root]):
                name = _name(pid)
                if pid in seen or not name.startswith("ray::") or "Agent" in name:
                    continue
                seen.add(pid)
                out = self.out.with_name(f"{self.out.name}.{pid}")
                self.spies.append((pid, name.split(".")[0], out, self._spy(pid, out)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        for _, _, _, spy in self.spies:
            spy.send_signal(signal.SIGINT)
        for _, _, _, spy in self.spies:
            spy.wait(timeout=60)
        with self.out.open("a") as merged:
            for pid, name, out, _ in self.spies[1:]:
                if out.exists():
                    for line in out.read_text().splitlines():
                        merged.write(f'process {pid}:"{name}";{line}\n')
                    out.unlink()


def flwr_run(n_clients: int, run_config: dict[str, Any], out: Path, app_dir: Path,
             federation: str = "client-resources-num-cpus=1", timeout: float = 3600.0,
             extra_env: dict[str, str] | None = None,
             profile: Path | None = None, memory_limit: int | None = None) -> dict[str, Any]:
    """The run under ``flwr run --stream`` on a private local SuperLink (Ray); with
    ``profile``, py-spy samples every process of the SuperLink's tree, Ray's actors
    included, into that file (collapsed stacks, one root frame per process,
    :class:`_Profiler`); with ``memory_limit`` (bytes), the
    run is killed when all its processes together hold more (a RuntimeError that says
    so; the rounds done are in the run's ``rounds.jsonl``)."""
    out.mkdir(parents=True, exist_ok=True)
    # verbose: the milestones are Flower's own lines, which the quiet console keeps back
    cfg = {**run_config, "output-dir": str(out / "flwr"), "verbose": True}
    with tempfile.TemporaryDirectory(dir=out) as home, PeakMemory(limit=memory_limit) as mem:
        t0 = time.perf_counter()
        # shards from the same cache as the in-process run: round 1 compares like with like
        with local_superlink(Path(home), extra_env, private_cache=False) as (env, link):
            t_link = time.perf_counter() - t0
            cmd = [str(BIN / "flwr"), "run", str(app_dir), "--stream", "--federation-config",
                   f"num-supernodes={n_clients} {federation}",
                   "--run-config", _run_config_text(cfg)]
            proc = subprocess.Popen(cmd, cwd=app_dir, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            mem.pids = [link.pid, proc.pid]
            spy = None if profile is None else _Profiler(link.pid, profile)
            try:
                lines = timed_lines(proc, t0, timeout)
            finally:
                if spy is not None:
                    spy.stop()
            wall = time.perf_counter() - t0
    log = "".join(line for _, line in lines)
    atomic_write(out / "flwr-run.log", "".join(f"{t:7.2f} | {line}" for t, line in lines))
    if mem.exceeded:
        raise RuntimeError(f"flwr run killed after {wall:.0f} s: its processes held "
                           f"{mem.exceeded / GIB:.2f} GiB, above the limit of "
                           f"{(memory_limit or 0) / GIB:.2f} GiB")
    results = sorted((out / "flwr").glob("*/*/results.json"))
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"flwr run failed (see {out / 'flwr-run.log'}):\n{log[-3000:]}")
    return {"mode": "flwr-run", "clients": n_clients, "federation": federation,
            "wall-s": round(wall, 2), "cpu-s": round(mem.cpu_seconds, 1),
            "cpu-by-process-s": mem.cpu_by_name(),
            "timeline": [f"{t:.1f} {pid} {name}" for t, pid, name in mem.timeline],
            "superlink-start-s": round(t_link, 2), "log-s": _milestones(lines),
            "peak-rss-gib": round(mem.peak / GIB, 3), "peak-by-process-gib": _split(mem),
            **round_times(results[-1])}


# ------------------------------------------------------------------ the suite
def _child_json(code: str, timeout: float = 3600.0) -> dict[str, Any]:
    """Run ``code`` (which prints one JSON object last) in a fresh Python process."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child process failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_suite(clients: int, rounds: int, out: Path, *, flwr: bool, app_dir: Path,
              run_config: dict[str, Any] | None = None, transitions: int = 20_000,
              dim: int = 2000, blas_rows: int = 8192, seed: int = 0) -> dict[str, Any]:
    """``fedqhd bench --suite scale``: every issue-10 measurement in one run, with a
    progress bar; writes ``out/scale.json`` and returns it.

    * ``rounds``: ``clients`` clients in process, and (``flwr``) under ``flwr run``
      (Ray) with ``client-resources-num-cpus=1``; their later-round ratio;
    * ``streaming``: one client's fit of ``transitions`` at ``dim``, streamed (fresh
      process, its peak memory);
    * ``exact``: FedQHDExact vs centralised ridge FQI (up to 5 clients, at the run
      config's ``hd-dim``, 500 if not given);
    * ``blas``: the local fit's parts against the matmul peak at ``dim``, one BLAS thread.
    """
    from threadpoolctl import threadpool_limits
    from tqdm import tqdm

    from fedqhd.studies import perf

    rc = {"num-server-rounds": rounds, "eval-episodes": 3, "seed": seed, **(run_config or {})}
    parts = ["in-process", *(["flwr-run"] if flwr else []), "streaming", "exact", "blas"]
    summary: dict[str, Any] = {"clients": clients, "rounds": rounds, "seed": seed,
                               "run-config": rc, "date": time.strftime("%Y-%m-%d")}
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(parts, desc="bench scale", unit="part") as bar:
        for part in bar:
            bar.set_postfix_str(part)
            if part == "in-process":
                summary["in-process"] = inprocess(clients, rc, out / "rounds")
            elif part == "flwr-run":
                summary["flwr-run"] = flwr_run(clients, rc, out / "rounds", app_dir)
                summary["flwr-over-in-process"] = round(
                    summary["flwr-run"]["later-round-mean-s"]
                    / summary["in-process"]["later-round-mean-s"], 2)
            elif part == "streaming":
                summary["streaming"] = _child_json(
                    "import json; from fedqhd.studies.perf import streaming_memory as f; "
                    f"print(json.dumps(f({transitions}, {dim}, sweeps=1, seed={seed}, "
                    "stream=True)))")
            elif part == "exact":
                summary["exact"] = perf.exact_error(min(clients, 5), int(rc.get("hd-dim", 500)),
                                                    3, out / "exact", seed=seed)
            else:
                with threadpool_limits(limits=1, user_api="blas"):
                    summary["blas"] = perf.blas_fraction(dim, blas_rows, repeats=2)
            atomic_write(out / "scale.json", json.dumps(summary, indent=2))
    return summary


def markdown(summary: dict[str, Any]) -> str:
    """The suite's table (one row per measurement)."""
    rows = ["| measurement | value |", "|---|---:|"]
    for mode in ("in-process", "flwr-run"):
        if mode in summary:
            r = summary[mode]
            rows.append(f"| {mode}, {r['clients']} clients x {len(r['round-s'])} rounds: wall "
                        f"/ round 1 / later rounds (mean) / CPU (all processes) / peak RSS "
                        f"(all processes) | {r['wall-s']:.1f} s / {r['round-s'][0]:.2f} s / "
                        f"{r['later-round-mean-s']:.2f} s / {r['cpu-s']:.0f} s / "
                        f"{r['peak-rss-gib']:.2f} GiB |")
    if "flwr-over-in-process" in summary:
        rows.append(f"| flwr run / in-process, later rounds (bar <= 1.5) | "
                    f"{summary['flwr-over-in-process']:.2f} |")
    s = summary["streaming"]
    rows.append(f"| streamed fit, {s['transitions']} transitions at D = {s['dim']}: peak RSS "
                f"(in-memory features would need {s['in-memory-features-gib']} GiB) | "
                f"{s['peak-rss-gib']:.3f} GiB |")
    e = summary["exact"]
    rows.append(f"| FedQHDExact vs centralised ridge FQI, {e['clients']} clients, D = "
                f"{e['dim']}: max relative readout difference (bar 1e-8) | "
                f"{e['relative-error']:.1e} |")
    b = summary["blas"]
    rows.append(f"| D = {b['dim']}, one BLAS thread: Gram (dsyrk) / Cholesky as a fraction of "
                f"the dgemm peak ({b['peak-gflops']} GFLOP/s) | {b['gram-syrk-fraction']:.2f} "
                f"/ {b['cholesky-fraction']:.2f} |")
    return "\n".join(rows)
