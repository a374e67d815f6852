"""The processes of a private network namespace (``unshare --net``), found and stopped by
PID: how the Ray-cluster test and benchmark stop every Ray daemon they started, without
``ray stop`` (which stops other users' Ray too)."""

from __future__ import annotations

import os
import signal
import time


def netns_of(pid: int) -> str | None:
    """``pid``'s network namespace (``/proc/PID/ns/net``), or None if it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def pids_in(netns: str) -> list[int]:
    """Every process whose network namespace is ``netns``."""
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and netns_of(int(p)) == netns]


def stop_namespace(netns: str, grace: float = 15.0) -> list[int]:
    """SIGTERM every process of ``netns`` by PID, then SIGKILL what is left; returns the
    PIDs still there afterwards (none expected)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids_in(netns):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while pids_in(netns) and time.monotonic() < deadline:
            time.sleep(0.2)
    return pids_in(netns)
