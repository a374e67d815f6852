"""BLAS threads of a ClientApp process, set from the CPUs it was given.

Why: under ``flwr run`` every Ray actor is a process running ClientApps; left alone,
OpenBLAS/MKL in each starts one thread per core of the machine, so ``k`` actors on
``c`` cores run ``k x c`` BLAS threads that preempt each other (and the SuperLink).
Each actor is given ``client-resources-num-cpus`` CPUs by Ray: the ClientApp limits
its BLAS (and OpenMP) pools to exactly that, once per process, with threadpoolctl.
Outside Ray (in process, a deployment's SuperNode) nothing is changed.
"""

from __future__ import annotations

import sys
from typing import Any

from flwr.common.logger import log

_LIMITER: dict[str, Any] = {}  #: the process-wide limit, applied once (kept alive)
#: threadpoolctl's view of the loaded libraries, found once: finding them scans the
#: process's memory maps (3.4 ms), asking each its thread count is microseconds
_POOLS: dict[str, Any] = {}


def ray_cpus() -> int | None:
    """CPUs Ray assigned to this process (an actor or task), or ``None`` outside Ray."""
    ray = sys.modules.get("ray")  # never import Ray here: only actors have it loaded
    if ray is None or not ray.is_initialized():
        return None
    try:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:  # noqa: BLE001 - the driver process has no assigned resources
        return None
    return max(1, int(cpus)) if cpus else None


#: resources every Ray node has; the others (``ray start --resources``) name a node
_STANDARD = {"CPU", "GPU", "memory", "object_store_memory", "accelerator_type"}


def ray_node() -> str:
    """Where this Ray worker process runs: ``node <ip> <node id>, resources <a,b>, pid
    <pid>``, the resources being the node's custom ones (``ray start --resources``).
    Logged once per ClientApp process, so a run's ``run.log`` shows which Ray nodes
    served it (tests/test_ray_cluster.py); it changes no result."""
    import os

    ray = sys.modules["ray"]
    try:
        node_id = ray.get_runtime_context().get_node_id()
        node: dict[str, Any] = next(
            (n for n in ray.nodes() if n.get("NodeID") == node_id), {})
        custom = sorted(k for k in node.get("Resources", {})
                        if k not in _STANDARD and not k.startswith("node:"))
        return (f"Ray node {node.get('NodeManagerAddress', '?')} {node_id}, "
                f"resources {','.join(custom) or '-'}, pid {os.getpid()}")
    except Exception as exc:  # noqa: BLE001 - only a log line: never fail a ClientApp
        return f"Ray node unknown: {exc!r}"


def blas_threads() -> int:
    """Threads of this process's BLAS pools now (the largest, if several are loaded).

    Called for every ClientApp message: the libraries are looked up once per process
    (numpy and scipy load theirs at import, before any message), their counts each call."""
    if "blas" not in _POOLS:
        from threadpoolctl import ThreadpoolController

        _POOLS["blas"] = ThreadpoolController().select(user_api="blas")
    counts = [int(p["num_threads"]) for p in _POOLS["blas"].info()]
    return max(counts, default=1)


def limit_client_threads() -> int:
    """Limit BLAS and OpenMP to the CPUs Ray gave this process (first call only);
    returns the BLAS thread count now in force."""
    if "done" not in _LIMITER:
        _LIMITER["done"] = True
        cpus = ray_cpus()
        if cpus is not None:
            from threadpoolctl import threadpool_limits

            _LIMITER["limits"] = threadpool_limits(limits=cpus)
            log(20, "fedqhd: ClientApp process under Ray with %d CPU(s): BLAS threads %d "
                "(%s)", cpus, blas_threads(), ray_node())
    return blas_threads()
