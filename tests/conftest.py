"""Shared fixtures: a private local SuperLink for the end-to-end ``flwr run`` tests, and a
private ledger folder for every test.

Each test gets its own ``flower-superlink --simulation``
(:func:`fedqhd.studies.scale.local_superlink`: free ports, a private FLWR_HOME, so
``flwr run`` reuses it); it is stopped, with everything it spawned, by process group,
also when the test fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np  # noqa: F401 - loads the BLAS libraries that the limit below applies to
import pytest
import scipy.linalg  # noqa: F401
from threadpoolctl import threadpool_limits

#: each test process's BLAS threads: its share of the cores. Left alone, every xdist worker
#: starts one BLAS thread per core and they preempt each other (-m "not heavy" on 2 cores
#: with -n 2: 5.3 min, against 3.6 with a thread a worker). Kept alive for the whole session;
#: it binds this process only: subprocesses (``flwr run``, Ray actors) keep their own pools.
_BLAS_LIMIT = threadpool_limits(
    limits=max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))),
    user_api="blas")


@pytest.fixture
def local_superlink(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start a SuperLink; yields the environment ``flwr`` must run with to use it."""
    from fedqhd.studies.scale import local_superlink as start

    with start(tmp_path) as (env, _):
        yield env


@pytest.fixture(autouse=True)
def private_ledger_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's POOL clients keep their on-disk privacy ledgers in its own tmp dir
    (never in ~/.fedqhd/ledgers, and never shared between tests)."""
    directory = tmp_path / "ledgers"
    monkeypatch.setenv("FEDQHD_LEDGER_DIR", str(directory))
    return directory


@pytest.fixture
def temp_envs() -> Iterator[Callable[..., str]]:
    """``add(env_id, **register_env kwargs)``: registers an env for one test, unregistered
    afterwards."""
    from fedqhd.envs import register_env, unregister_env

    added: list[str] = []

    def add(env_id: str, **kwargs) -> str:
        register_env(env_id, **kwargs)
        added.append(env_id)
        return env_id

    yield add
    for env_id in added:
        unregister_env(env_id)
