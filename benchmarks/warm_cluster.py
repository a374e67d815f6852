"""Warm Ray cluster (issue 32): the same ``flwr run`` submitted N times to one running
Ray cluster and one SuperLink, each run's wall time split into start-up, rounds and
shut-down.

    python benchmarks/warm_cluster.py --nodes 2 --runs 3 --out /tmp/warm

The cluster is the one of docs/deployment.md ("Simulation on an existing Ray cluster",
with its settings for online runs on a warm cluster: a 1 GB object store per node, the
SuperExec polling for runs every 0.1 s, the app submitted without a venv inside it):
``--nodes 2`` a head (127.0.0.2) and a worker (127.0.0.3), 1 CPU each; ``--nodes 1`` the
head alone with 2 CPUs. Ray listens on all interfaces, so everything runs in a private
network namespace (``unshare --user --map-root-user --net``) whose only interface is
``lo``, as tests/test_ray_cluster.py does. The run: online heterogeneous CartPole, seed
42, 5 SuperNodes, 1 CPU per ClientApp actor.

Split of one run (seconds since ``flwr run`` was started): start-up = until the first
``[ROUND 1/`` line of ``--stream``; rounds = the last round's ``wall-time-s`` in the
run's results.json (counted from the strategy's start); shut-down = the rest, until
``flwr run`` returns. Everything started is stopped by process group (the SuperLink, each
``ray start --block``), then whatever is left in the namespace by PID; never ``ray stop``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from fedqhd.studies.netns import netns_of, stop_namespace
from fedqhd.studies.scale import GIB, PeakMemory, round_times, timed_lines

BIN = Path(sys.executable).parent
PROJECT = Path(__file__).resolve().parents[1]
RUN_CONFIG = "protocol='online' env-id='CartPole-v1' encoder='heterogeneous' seed=42"
INNER = "FEDQHD_WARM_CLUSTER_INNER"
COMMON = ["--block", "--disable-usage-stats"]
HEAD = [str(BIN / "ray"), "start", "--head", "--node-ip-address", "127.0.0.2", "--port", "6379",
        "--resources", '{"head": 1}', "--include-dashboard", "false",
        "--node-manager-port", "6380", "--object-manager-port", "6381",
        "--runtime-env-agent-port", "6382", "--dashboard-agent-grpc-port", "6383",
        "--dashboard-agent-listen-port", "6384", "--metrics-export-port", "6385",
        "--ray-client-server-port", "6386", "--min-worker-port", "6400",
        "--max-worker-port", "6449"]
WORKER = [str(BIN / "ray"), "start", "--address", "127.0.0.2:6379",
          "--node-ip-address", "127.0.0.3",
          "--resources", '{"worker": 1}', "--node-manager-port", "6390",
          "--object-manager-port", "6391", "--runtime-env-agent-port", "6392",
          "--dashboard-agent-grpc-port", "6393", "--dashboard-agent-listen-port", "6394",
          "--metrics-export-port", "6395", "--min-worker-port", "6450",
          "--max-worker-port", "6499"]
LINK_PORT = 39093


# ----------------------------------------------------------- outside the namespace
def outer(argv: list[str]) -> int:
    proc = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-c",
         'ip link set lo up && exec "$0" "$@"', sys.executable, __file__, *argv],
        env=dict(os.environ, **{INNER: "1"}), start_new_session=True)
    ours = netns_of(os.getpid())
    netns = None
    try:
        while (netns := netns_of(proc.pid)) == ours and proc.poll() is None:
            time.sleep(0.01)
        return proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
        left = stop_namespace(netns) if netns and netns != ours else []
        if left:
            print(f"still running in the namespace: {left}", file=sys.stderr)


# ------------------------------------------------------------ inside the namespace
def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """The process group ``proc`` leads (``start_new_session``): SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def wait_for(check, what: str, timeout: float = 120.0) -> float:
    t0 = time.perf_counter()
    while not check():
        if time.perf_counter() - t0 > timeout:
            raise RuntimeError(f"{what} not up after {timeout:.0f} s")
        time.sleep(0.5)
    return time.perf_counter() - t0


def ray_nodes(env: dict[str, str]) -> int:
    done = subprocess.run([str(BIN / "ray"), "status", "--address", "127.0.0.2:6379"],
                          env=env, capture_output=True, text=True)
    return done.stdout.count(" node_") if done.returncode == 0 else 0


def healthy() -> bool:
    try:
        return bool(urllib.request.urlopen(f"http://127.0.0.1:{LINK_PORT}/health",
                                           timeout=1).status == 200)
    except OSError:
        return False


def app_copy(into: Path) -> Path:
    """The app's tracked files copied into ``into``: what ``flwr run`` submits, without
    the virtual environment inside the checkout (Flower 1.42's ``flwr run`` walks every
    file under the app folder before it filters them: 32,000 files of a venv cost 1.3 s
    a run; docs/deployment.md, "Simulation on an existing Ray cluster")."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    app = into / PROJECT.name
    for name in filter(None, files):
        if (PROJECT / name).is_file():
            (app / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(PROJECT / name, app / name)
    return app


def one_run(i: int, env: dict[str, str], out: Path, args: argparse.Namespace,
            roots: list[int], app: Path) -> dict:
    """Run ``i``; ``roots``: the cluster's and the SuperLink's processes, whose trees'
    CPU seconds during the run are split by process name."""
    run_out = out / f"run-{i}"
    cmd = [str(BIN / "flwr"), "run", str(app), "ray-cluster", "--stream",
           "--federation-config",
           f"num-supernodes={args.supernodes} client-resources-num-cpus=1", "--run-config",
           f"{args.run_config} verbose=true output-dir='{run_out}'"]
    before = load()
    t0 = time.perf_counter()
    with PeakMemory(series=True) as mem:
        mem.pids = roots
        proc = subprocess.Popen(cmd, cwd=app, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        lines = timed_lines(proc, t0, timeout=args.timeout)
    wall = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / f"run-{i}.log").write_text("".join(f"{t:7.2f} | {x}" for t, x in lines))
    results = sorted(run_out.glob("*/*/results.json"))
    if proc.returncode != 0 or not results:
        raise RuntimeError(f"run {i} failed (rc {proc.returncode}), see {out}/run-{i}.log")

    def first(marker: str) -> float | None:
        return next((round(t, 2) for t, x in lines if marker in x), None)

    data = json.loads(results[-1].read_text())
    # CPU seconds by process name between two moments of the run: the cluster's processes
    # count from their level at the first sample (they ran before the run)
    series = mem.series
    assert series

    def cpu_between(a: float, b: float) -> dict[str, float]:
        lo = next((c for s, c in series if s >= a), series[-1][1])
        hi = next((c for s, c in series if s >= b), series[-1][1])
        return {k: round(v - lo.get(k, 0.0), 1) for k, v in hi.items()
                if v - lo.get(k, 0.0) >= 0.1}

    # per round: from its "[ROUND k/" line to the next (the last: to the strategy's end)
    marks = [t for t, x in lines if "[ROUND " in x and "/" in x.split("[ROUND ", 1)[1]]
    done = next((t for t, x in lines if "Strategy execution finished" in x), wall)
    round_cpu = [cpu_between(a, b) for a, b in zip(marks, [*marks[1:], done], strict=True)]
    rounds = data["rounds"][-1]["wall-time-s"]
    start = first("[ROUND 1/")
    assert start is not None, "no [ROUND 1/ line"
    return {"run": i, "load-before": before, "wall-s": round(wall, 2),
            "start-up-s": start, "rounds-s": round(rounds, 2),
            "shut-down-s": round(wall - start - rounds, 2),
            "submitted-s": first("Successfully started run"),
            "simulation-s": first("Starting Flower Simulation"),
            "strategy-s": first("Starting FedQHD"),
            "first-clientapp-s": first("ClientApp process under Ray"),
            "round-s": round_times(results[-1])["round-s"],
            "cpu-by-process-s": dict(sorted(cpu_between(0.0, wall).items(),
                                            key=lambda kv: -kv[1])),
            "round-cpu-s": round_cpu,
            "peak-rss-gib": round(mem.peak / GIB, 3),
            "return-mean": data["final"]["return-mean"]}


def inner(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="fqw-", dir="/tmp"))  # Ray's socket paths: < 108 B
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               TMPDIR=str(tmp), FLWR_HOME=str(tmp / "flwr"), RAY_USAGE_STATS_ENABLED="0",
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1", RAY_DEDUP_LOGS="0",
               FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1")
    env.pop(INNER, None)
    (tmp / "flwr").mkdir()
    (tmp / "flwr" / "config.toml").write_text(
        f'[superlink.ray-cluster]\naddress = "127.0.0.1:{LINK_PORT}"\ninsecure = true\n')
    started: list[subprocess.Popen] = []

    def start(cmd: list[str], log: str, cwd: Path = tmp, **extra: str) -> None:
        with open(tmp / log, "w") as fh:
            started.append(subprocess.Popen(cmd, cwd=cwd, env=dict(env, **extra), stdout=fh,
                                            stderr=subprocess.STDOUT, start_new_session=True))

    report: dict = {"nodes": args.nodes, "poll": args.poll, "runs": [],
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
    try:
        t0 = time.perf_counter()
        cpus = "1" if args.nodes == 2 else "2"
        common = [*COMMON, "--object-store-memory", str(args.object_store_mib << 20)]
        start([*HEAD, "--temp-dir", str(tmp / "head"), "--num-cpus", cpus, *common], "head.log")
        wait_for(lambda: ray_nodes(env) >= 1, "Ray head")
        if args.nodes == 2:
            start([*WORKER, "--temp-dir", str(tmp / "worker"), "--num-cpus", "1", *common],
                  "worker.log")
            wait_for(lambda: ray_nodes(env) >= 2, "Ray worker")
        report["cluster-up-s"] = round(time.perf_counter() - t0, 2)
        neutral = tmp / "link-cwd"  # docs/simulation.md, "A stale ClientApp"
        neutral.mkdir()
        t1 = time.perf_counter()
        start([str(BIN / "flower-superlink"), "--simulation", "--insecure", "--host",
               "127.0.0.1", "--port", str(LINK_PORT)], "superlink.log", cwd=neutral,
              RAY_ADDRESS="127.0.0.2:6379",
              **({"FLWR_SUPEREXEC_TASK_POLL_INTERVAL": str(args.poll)} if args.poll else {}))
        wait_for(healthy, "SuperLink")
        report["superlink-up-s"] = round(time.perf_counter() - t1, 2)
        print(f"cluster ({args.nodes} node(s)) up in {report['cluster-up-s']} s, SuperLink "
              f"in {report['superlink-up-s']} s", flush=True)
        roots = [p.pid for p in started]
        app = app_copy(tmp / "app")
        report["app"] = str(app)
        for i in range(1, args.runs + 1):
            row = one_run(i, env, out, args, roots, app)
            report["runs"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        for proc in reversed(started):  # the SuperLink, then each node, by process group
            stop_group(proc)
        for log in ("head.log", "worker.log", "superlink.log"):
            if (tmp / log).exists():
                shutil.copy(tmp / log, out / log)
        shutil.rmtree(tmp, ignore_errors=True)
        (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"{'run':>3} {'load before':>16} {'wall':>6} {'start-up':>8} {'rounds':>6} "
          f"{'shut-down':>9} {'return':>7}")
    for r in report["runs"]:
        print(f"{r['run']:>3} {r['load-before']:>16} {r['wall-s']:>6.1f} {r['start-up-s']:>8.1f}"
              f" {r['rounds-s']:>6.1f} {r['shut-down-s']:>9.1f} {r['return-mean']:>7.1f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, choices=(1, 2), default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="/tmp/warm-cluster")
    parser.add_argument("--supernodes", type=int, default=5, help="SuperNodes (clients)")
    parser.add_argument("--run-config", default=RUN_CONFIG,
                        help="the runs' --run-config (default: online heterogeneous CartPole)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    parser.add_argument("--object-store-mib", type=int, default=1024,
                        help="each node's Ray object store (docs/deployment.md: 1 GB for "
                             "online runs, whose states spill to disk below about 500 MiB)")
    parser.add_argument("--poll", type=float, default=0.1,
                        help="the SuperExec's task poll interval, s (docs/deployment.md: "
                             "0.1 on a warm cluster; 0: Flower's default, 1.0)")
    args = parser.parse_args()
    if os.environ.get(INNER):
        return inner(args)
    return outer(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
