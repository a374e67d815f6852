"""The scale model of ``docs/scale.md``: what one round of the offline app costs, per
message and per reply, measured in process, and the round time it predicts for N
clients on P actor CPUs.

Why a model: a round at 10^5-10^6 clients cannot be run here, but its parts can. A round
of the offline app (shared encoder, FedQHDAvg, ADMM: the README's defaults) sends each
sampled node one train message; the server evaluates the global readout itself. So:

* **client, per message** (CPU s): ``c_hit`` when the node's learner is in the serving
  process's cache (an ADMM step and a few sweeps on its encoded shard), ``c_build`` when
  it is not (the learner rebuilt from the process's shard cache: the shard encoded, its
  Gram formed), measured with node config ``learner-cache-mib = 0`` and every shard kept
  (a shard is ~10 KB: 1/8 of the budget holds 10^4 of them);
* **node bytes**: the cached learner's arrays; a process keeps ``K = budget / bytes``
  nodes (admission, not LRU: :mod:`fedqhd.learners.cache`), so with N nodes spread at
  random over actors a message hits with probability ``h = min(1, K / N)``;
* **bytes on the wire**, per message and per reply (their arrays);
* **server, per reply** (CPU s): the ServerApp's own work (building messages, robust
  aggregation, the ADMM consensus), ``s_app``, and a fixed part per round (its greedy
  evaluation), both from in-process runs at two N; Flower's simulation engine adds
  ``s_flower`` per message (link state, the Ray call, (de)serialisation), measured once
  on a cluster from the ``flwr-simulation`` process's CPU.

Clients and the server's process work at the same time (the windowed grid keeps actors
fed while replies are pulled), each on its own CPUs when they have them, so a later round
takes

    T(N) = max(N a(N) / P, N s, N (a(N) + s) / C) / u
    a(N) = c_hit + (1 - h) (c_build - c_hit) + c_flower,    s = s_app + s_flower

with P actor CPUs, C the cores that actors and the server's process share (C = P on one
machine; no such bound when the server has its own machine), ``c_flower`` the Ray actor's
own per-message work and ``u`` the share of that bound a round achieves (dispatch
latency, polls): ``c_flower``, ``s_flower`` and ``u`` are calibrated on one cluster run
(:func:`calibrate`). The server's process is the bottleneck once ``P > a(N) / s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedqhd.envs import get_spec

#: the README's defaults, which the model describes (the app's offline protocol)
BASE_CONFIG: dict[str, Any] = {"protocol": "offline", "eval-episodes": 3, "seed": 0}
ALL_SHARDS = 1 << 40  #: a shard-cache budget no measurement fills


@dataclass
class Point:
    """One in-process measurement: ``clients`` nodes of ``env_id`` at ``dim`` features."""

    env_id: str
    dim: int
    n_actions: int
    clients: int
    rounds: int
    cached: bool  #: learner-cache-mib at its default (True) or 0 (every message builds)
    client_s: float  #: CPU s per train message after round 1 (mean)
    server_s_per_round: float  #: the ServerApp's CPU s per later round (not the clients')
    message_bytes: float  #: arrays sent to a node per train message (mean)
    reply_bytes: float  #: arrays in its reply (mean)
    node_bytes: float  #: a cached learner's arrays (mean over the process's nodes)
    wall_s: float


def _array_bytes(content: Any) -> int:
    return sum(len(arr.data) for rec in content.array_records.values() for arr in rec.values())


def measure(env_id: str, dim: int, clients: int, rounds: int = 3,
            cached: bool = True) -> Point:
    """Run ``clients`` nodes for ``rounds`` rounds in THIS process (call it in a fresh one:
    :func:`measure_in_child`) and time every message; round 1 (the shards' generation and
    first build) is left out of the per-message means. CPU seconds of this thread, where
    the ServerApp and the clients run (not the run's background matplotlib import)."""
    from fedqhd.client.app import app as client_app
    from fedqhd.learners import fqi, parse_run_config
    from fedqhd.server.app import run_federation
    from fedqhd.server.inprocess import InProcessGrid

    out = Path(tempfile.mkdtemp(prefix="fedqhd-scale-model-"))
    cfg = parse_run_config({**BASE_CONFIG, "env-id": env_id, "hd-dim": dim,
                            "num-server-rounds": rounds, "output-dir": str(out)})
    node_cfg = [{} if cached else {"learner-cache-mib": 0}] * clients
    grid = InProcessGrid([client_app] * clients, run_config=cfg.to_run_config(),
                         node_configs=node_cfg)
    per_round: list[dict[str, float]] = []
    handle = grid._handle

    def timed(msg: Any) -> Any:
        t0 = time.thread_time()
        reply = handle(msg)
        if not cached and fqi._NODE_SHARDS.budget < ALL_SHARDS:
            # after the first message sized both caches from learner-cache-mib = 0: the
            # learners are rebuilt, from shards kept as a large run keeps them
            fqi._NODE_SHARDS.resize(ALL_SHARDS)
        row = per_round[-1]
        row["client"] += time.thread_time() - t0
        row["messages"] += 1
        row["in"] += _array_bytes(msg.content)
        row["out"] += _array_bytes(reply.content) if reply.has_content() else 0
        return reply

    grid._handle = timed  # type: ignore[method-assign]
    calls = grid.send_and_receive

    def round_call(messages: Any, *, timeout: float | None = None) -> Any:
        # every call of the offline avg run is one round's train messages
        now = time.thread_time()
        if per_round:
            per_round[-1]["end"] = now
        per_round.append({"start": now, "end": now, "client": 0.0, "messages": 0,
                          "in": 0.0, "out": 0.0})
        return calls(messages, timeout=timeout)

    grid.send_and_receive = round_call  # type: ignore[method-assign]
    wall0 = time.perf_counter()
    run_federation(grid, cfg)
    end = time.thread_time()
    wall = time.perf_counter() - wall0
    per_round[-1]["end"] = end
    later = per_round[1:]
    msgs = sum(r["messages"] for r in later)
    cache = fqi._NODE_LEARNERS  # each entry: (learner, shard), with its array bytes
    return Point(env_id=env_id, dim=dim, n_actions=get_spec(env_id).n_actions, clients=clients,
                 rounds=rounds, cached=cached,
                 client_s=sum(r["client"] for r in later) / msgs,
                 server_s_per_round=sum(r["end"] - r["start"] - r["client"] for r in later)
                 / len(later),
                 message_bytes=sum(r["in"] for r in later) / msgs,
                 reply_bytes=sum(r["out"] for r in later) / msgs,
                 node_bytes=cache.used / len(cache.entries) if cache.entries else 0.0,
                 wall_s=round(wall, 2))


def measure_in_child(env_id: str, dim: int, clients: int, rounds: int = 3,
                     cached: bool = True) -> Point:
    """:func:`measure` in a fresh Python process (empty caches, one BLAS thread)."""
    code = ("import json, sys; from dataclasses import asdict; "
            "from fedqhd.studies.scale_model import measure; "
            "print(json.dumps(asdict(measure(*json.loads(sys.argv[1])))))")
    env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code,
                           json.dumps([env_id, dim, clients, rounds, cached])],
                          capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0:
        raise RuntimeError(f"measurement failed:\n{done.stderr[-3000:]}")
    return Point(**json.loads(done.stdout.strip().splitlines()[-1]))


@dataclass
class Model:
    """The fitted model of one configuration (env, D)."""

    c_hit: float  #: client CPU s per message, learner cached
    c_build: float  #: client CPU s per message, learner rebuilt
    node_bytes: float
    cache_bytes: float  #: a process's learner cache (node config learner-cache-mib)
    s_app: float  #: the ServerApp's CPU s per reply
    t_fixed: float  #: the ServerApp's CPU s per round that does not grow with N
    s_flower: float = 0.0  #: Flower's simulation engine, CPU s per message (a cluster run)
    c_flower: float = 0.0  #: a Ray actor's own work, CPU s per message (a cluster run)
    utilisation: float = 1.0  #: measured round time over the CPU bound (a cluster run)
    message_bytes: float = 0.0
    reply_bytes: float = 0.0

    def hit_rate(self, n: int) -> float:
        return min(1.0, (self.cache_bytes / self.node_bytes) / n) if self.node_bytes else 1.0

    def client_s(self, n: int) -> float:
        """``a(N)``: an actor's CPU s per message."""
        return (self.c_hit + (1 - self.hit_rate(n)) * (self.c_build - self.c_hit)
                + self.c_flower)

    def server_s(self) -> float:
        """``s``: the server's process's CPU s per message."""
        return self.s_app + self.s_flower

    def cpu_bound_s(self, n: int, cpus: int, cores: int | None = None) -> float:
        """The least a later round can take: actors, the server's process and (``cores``:
        shared by both) the machine's cores each busy all round."""
        a, s = n * self.client_s(n), n * self.server_s() + self.t_fixed
        return max(a / cpus, s, (a + s) / cores if cores else 0.0)

    def round_s(self, n: int, cpus: int, cores: int | None = None) -> float:
        """A later round's wall time, N clients on ``cpus`` actor CPUs (``cores``: the
        cores actors and the server's process share, when they share any)."""
        return self.cpu_bound_s(n, cpus, cores) / self.utilisation

    def server_bound_cpus(self, n: int) -> float:
        """Actor CPUs beyond which the server's process sets the round time."""
        return self.client_s(n) / self.server_s()

    def server_reply_memory(self, n: int) -> float:
        """Bytes of one round's replies, all held by the ServerApp until it aggregates."""
        return n * self.reply_bytes


def fit(small: Point, large: Point, build: Point, cache_mib: int = 1024) -> Model:
    """The model from two cached runs at different N (the server's per-reply slope and
    fixed part) and one run with every learner rebuilt (``c_build``)."""
    if small.clients == large.clients:
        raise ValueError("the server's slope needs two different numbers of clients")
    slope = ((large.server_s_per_round - small.server_s_per_round)
             / (large.clients - small.clients))
    fixed = small.server_s_per_round - slope * small.clients
    return Model(c_hit=(small.client_s + large.client_s) / 2, c_build=build.client_s,
                 node_bytes=large.node_bytes, cache_bytes=float(cache_mib << 20),
                 s_app=max(slope, 0.0), t_fixed=max(fixed, 0.0),
                 message_bytes=large.message_bytes, reply_bytes=large.reply_bytes)


def later_rounds(run: dict[str, Any], clients: int) -> tuple[float, float, float]:
    """(mean wall s, actor CPU s per message, ``flwr-simulation`` CPU s per message) of a
    cluster run's later rounds (a row of ``benchmarks/warm_cluster.py``'s report: one
    train message per node a round). Round 1 (Ray's workers, imports, every learner's
    first build) is left out."""
    later, walls = run["round-cpu-s"][1:], run["round-s"][1:]
    if not later or len(later) != len(walls):
        raise ValueError("the run needs at least two rounds, each with its CPU")
    messages = clients * len(later)
    return (sum(walls) / len(walls),
            sum(r.get("ray::ClientAppActor", 0.0) for r in later) / messages,
            sum(r.get("flwr-simulation", 0.0) for r in later) / messages)


def calibrate(model: Model, clients: int, run: dict[str, Any], cpus: int,
              cores: int | None) -> Model:
    """``c_flower``, ``s_flower`` and ``utilisation`` from one run of the offline app on
    a cluster with ``clients`` nodes (:func:`later_rounds`): the CPU the actors and the
    ``flwr-simulation`` process spent beyond the in-process model's client and server
    work, and how far the rounds' wall time was above the CPU bound."""
    wall, actors, server = later_rounds(run, clients)
    model.c_flower = 0.0
    model.c_flower = max(actors - model.client_s(clients), 0.0)
    model.s_flower = max(server - model.s_app - model.t_fixed / clients, 0.0)
    model.utilisation = model.cpu_bound_s(clients, cpus, cores) / wall
    return model
