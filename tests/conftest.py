"""Shared fixtures: a private local SuperLink for the end-to-end ``flwr run`` tests.

Each test gets its own ``flower-superlink --simulation`` (:func:`fedqhd.scale.local_superlink`:
free ports, a private FLWR_HOME, so ``flwr run`` reuses it); it is stopped, with
everything it spawned, by process group, also when the test fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def local_superlink(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Start a SuperLink; yields the environment ``flwr`` must run with to use it."""
    from fedqhd.scale import local_superlink as start

    with start(tmp_path) as (env, _):
        yield env
