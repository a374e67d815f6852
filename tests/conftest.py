"""Shared fixtures: a private local SuperLink for the end-to-end ``flwr run`` tests.

Each test gets its own ``flower-superlink --simulation`` on free ports with a private
FLWR_HOME (the command ``flwr run`` would start for ``:local:``), so ``flwr run``
reuses it; the fixture stops it, with everything it spawned, by process group, also
when the test fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def local_superlink(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start a SuperLink; yields the environment ``flwr`` must run with to use it."""
    http_port, control_port = free_port(), free_port()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
               FLWR_HOME=str(tmp_path / "flwr-home"),
               FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(http_port),
               FLWR_LOCAL_CONTROL_API_PORT=str(control_port),
               FLWR_DISABLE_UPDATE_CHECK="1", RAY_DEDUP_LOGS="0",
               FEDQHD_CACHE_DIR=str(tmp_path / "cache"))
    link = subprocess.Popen(
        [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", f"127.0.0.1:{control_port}", "--host", "127.0.0.1",
         "--port", str(http_port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/health", timeout=0.5).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert link.poll() is None, "flower-superlink exited early"
            assert time.monotonic() < deadline, "SuperLink not healthy after 60 s"
            time.sleep(0.3)
        yield env
    finally:
        try:
            os.killpg(link.pid, signal.SIGTERM)
            link.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(link.pid, signal.SIGKILL)


@pytest.fixture(autouse=True)
def private_ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's POOL clients keep their on-disk privacy ledgers in its own tmp dir
    (never in ~/.fedqhd/ledgers, and never shared between tests)."""
    directory = tmp_path / "ledgers"
    monkeypatch.setenv("FEDQHD_LEDGER_DIR", str(directory))
    return directory
