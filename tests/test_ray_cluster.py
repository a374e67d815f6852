"""The SuperLink's simulation on a two-node Ray cluster (docs/deployment.md, "Simulation
on an existing Ray cluster"): the documented command, run as written from a fresh copy.

A head (127.0.0.2, resource ``head``) and a worker (127.0.0.3, resource ``worker``), 1 CPU
each, every port explicit; a SuperLink with ``RAY_ADDRESS`` at the head; one ``flwr run``
of 4 offline CartPole clients x 3 rounds, seed 7. Ray's GCS and raylets listen on all
interfaces (no Ray flag changes it), so the block runs in a private network namespace
(``unshare --user --map-root-user --net``) whose only interface is ``lo``: the test
asserts that, and that every socket seen in it is on 127.0.0.0/8 or a wildcard of the
documented ports. Asserted: ClientApp processes ran on both nodes (each logs its Ray node
once in run.log), and the results equal the same command on a single node (the head alone
with 2 CPUs). Every process of the namespace is stopped by PID afterwards, also on failure.

Runtime: 87 s on 2 cores at load average 5 (two clusters: 2 nodes, then 1; each about
40 s of which 15-20 s is Ray starting), hence ``heavy``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from test_docs import fresh_copy, shell_blocks

from fedqhd.studies.netns import netns_of, stop_namespace

BIN = Path(sys.executable).parent
NODE_LINE = re.compile(r"ClientApp process under Ray with \d+ CPU\(s\): BLAS threads \d+ "
                       r"\(Ray node (\S+) ([0-9a-f]+), resources (\S+), pid (\d+)\)")
#: the ports the docs say listen on all interfaces: GCS, each raylet's two, and the
#: worker processes' (drivers', actors') own gRPC ports (``--min/max-worker-port``)
WILDCARD_PORTS = {6379, 6380, 6381, 6390, 6391, *range(6400, 6500)}


def cluster_block() -> str:
    blocks = [b for b in shell_blocks() if "test_ray_cluster.py" in b.reason]
    assert len(blocks) == 1, [str(b) for b in blocks]
    return blocks[0].code


def netns_available() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "ip", "link", "set",
                           "lo", "up"], capture_output=True)
    return done.returncode == 0


def sockets(pid: int) -> list[tuple[str, int, str, int, str]]:
    """(local ip, local port, remote ip, remote port, state) of every TCP socket of
    ``pid``'s network namespace, from /proc/PID/net/tcp and tcp6."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            (local, lport), (remote, rport) = (f.split(":") for f in fields[1:3])
            out.append((_ip(local), int(lport, 16), _ip(remote), int(rport, 16), fields[3]))
    return out


def _ip(hexed: str) -> str:
    raw = bytes.fromhex(hexed)
    words = [raw[i:i + 4][::-1] for i in range(0, len(raw), 4)]  # little-endian 32-bit
    raw = b"".join(words)
    if len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":  # IPv4-mapped IPv6
        raw = raw[12:]
    if len(raw) == 4:
        return ".".join(str(b) for b in raw)
    return "::" if raw == bytes(16) else raw.hex()


def loopback_or_any(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("0.0.0.0", "::")


def run_block(code: str, project: Path, tmp: Path, name: str) -> dict:
    """Runs ``code`` in ``project`` inside a fresh network namespace; returns its exit
    code, output, the namespace's interfaces and every socket seen while it ran."""
    short = Path(tempfile.mkdtemp(prefix="fqr-", dir="/tmp"))  # Ray's socket paths: < 108 B
    env = {"PATH": os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin",
                                    "/usr/sbin", "/sbin"]),
           "HOME": str(tmp / f"home-{name}"), "FLWR_HOME": str(tmp / f"flwr-{name}"),
           "TMPDIR": str(short), "FEDQHD_CACHE_DIR": str(tmp / "cache"),
           "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--net", "bash", "-c",
         "ip link set lo up && exec bash -e -s"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=project, env=env, start_new_session=True)
    ours = netns_of(os.getpid())
    netns = None
    seen: set[tuple[str, int, str, int, str]] = set()
    interfaces: set[str] = set()
    try:
        while (netns := netns_of(proc.pid)) == ours:  # until unshare has made its own
            time.sleep(0.01)
        assert netns is not None
        assert proc.stdin is not None
        proc.stdin.write(code)
        proc.stdin.close()
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:
            seen.update(sockets(proc.pid))
            try:
                dev = Path(f"/proc/{proc.pid}/net/dev").read_text().splitlines()[2:]
                interfaces.update(line.split(":")[0].strip() for line in dev)
            except OSError:
                pass
            time.sleep(0.5)
        if proc.poll() is None:
            proc.kill()
        assert proc.stdout is not None
        output = proc.stdout.read()
        proc.wait()
    finally:
        left = stop_namespace(netns) if netns and netns != ours else []
        shutil.rmtree(short, ignore_errors=True)
    return {"rc": proc.returncode, "output": output, "sockets": seen,
            "interfaces": interfaces, "left": left}


def run_dir(project: Path) -> Path:
    found = sorted((project / "outputs" / "ray-cluster").glob("*/*/results.json"))
    assert len(found) == 1, found
    return found[0].parent


@pytest.mark.heavy
def test_flwr_run_on_a_two_node_ray_cluster_equals_one_node(tmp_path: Path) -> None:
    if shutil.which("git") is None or not netns_available():
        pytest.skip("needs git, unshare and ip, and user + network namespaces")
    code = cluster_block()
    two = fresh_copy(tmp_path / "two")
    got = run_block(code, two, tmp_path, "two")
    log = got["output"]
    assert got["rc"] == 0, log[-4000:]
    assert got["left"] == [], f"processes of the namespace still running: {got['left']}"

    # nothing but loopback: the namespace has lo only, and every socket Ray, the
    # SuperLink and flwr opened there is on 127.0.0.0/8, or a wildcard of the ports
    # documented as such (GCS, raylets)
    assert got["interfaces"] == {"lo"}, got["interfaces"]
    assert got["sockets"], "no sockets seen"
    strays = [s for s in got["sockets"] if not (loopback_or_any(s[0]) and loopback_or_any(s[2]))]
    assert not strays, strays
    wildcard = {s[1] for s in got["sockets"] if s[4] == "0A" and s[0] in ("0.0.0.0", "::")}
    assert wildcard <= WILDCARD_PORTS, wildcard
    listening = {(s[0], s[1]) for s in got["sockets"] if s[4] == "0A"}
    assert {("127.0.0.2", 6382), ("127.0.0.3", 6392)} <= listening, listening

    # ClientApp processes on both nodes, each found by its own node (not Ray's prefix)
    two_dir = run_dir(two)
    nodes = NODE_LINE.findall((two_dir / "run.log").read_text())
    served = {(ip, resources) for ip, _, resources, _ in nodes}
    assert served == {("127.0.0.2", "head"), ("127.0.0.3", "worker")}, nodes
    assert len({node_id for _, node_id, _, _ in nodes}) == 2

    # the same command on one node: the head alone, 2 CPUs, no worker
    one_code = code.replace('NODE="--block --num-cpus 1 ', 'NODE="--block --num-cpus 2 ')
    one_code = re.sub(r"setsid ray start --address .*?\nWORKER=\$!\n", "", one_code,
                      flags=re.S)
    one_code = one_code.replace("-ge 2 ]", "-ge 1 ]").replace(" -$WORKER", "")
    assert one_code.count("ray start") == 1 and "--num-cpus 2 " in one_code
    one = fresh_copy(tmp_path / "one")
    single = run_block(one_code, one, tmp_path, "one")
    assert single["rc"] == 0, single["output"][-4000:]
    assert single["left"] == []
    one_dir = run_dir(one)
    assert {(ip, r) for ip, _, r, _ in NODE_LINE.findall((one_dir / "run.log").read_text())} \
        == {("127.0.0.2", "head")}

    # returns bit for bit; float aggregates (residual, gap, the readout) to the last few
    # bits: which actor serves which node changes the order of additions
    a = json.loads((two_dir / "results.json").read_text())
    b = json.loads((one_dir / "results.json").read_text())
    assert [r["round"] for r in a["rounds"]] == [1, 2, 3]
    for key in ("return-mean", "return-std", "replies-ok", "num-transitions"):
        assert [r[key] for r in a["rounds"]] == [r[key] for r in b["rounds"]], key
    for key in ("bellman-residual", "consensus-gap"):
        np.testing.assert_allclose([r[key] for r in a["rounds"]],
                                   [r[key] for r in b["rounds"]], rtol=1e-12)
    assert a["final"]["return-mean"] == b["final"]["return-mean"]
    ra = np.load(two_dir / "final_model.npz")["readout"]
    rb = np.load(one_dir / "final_model.npz")["readout"]
    np.testing.assert_allclose(ra, rb, rtol=0, atol=1e-12 * np.abs(rb).max())
