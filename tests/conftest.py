"""Shared fixtures: a private local SuperLink for the end-to-end ``flwr run`` tests, and a
private ledger folder for every test.

Each test gets its own ``flower-superlink --simulation``
(:func:`fedqhd.studies.scale.local_superlink`: free ports, a private FLWR_HOME, so
``flwr run`` reuses it); it is stopped, with everything it spawned, by process group,
also when the test fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


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
