"""Memory a client's fit needs, what the machine has, and the refusal when it is not
enough: a clear message with the estimate, before anything is allocated, instead of a
bare ``MemoryError`` (or the kernel's OOM killer) in the middle of encoding a shard.

The estimates count the arrays the fit allocates (float64 features, 8 bytes a number;
not the shard, which is loaded already):

* in memory (:meth:`~fedqhd.readout.RidgeFQI.from_states`): one feature row per
  distinct state, ``states x D`` (``states``: n plus the next states that start no
  transition, n + episodes for shards in episode order; 2 n when unknown; 4 bytes a
  number with ``feature-dtype = float32``, plus the float64 block the arithmetic turns
  them into, ``min(n, max(UPCAST_ROWS, D)) x D``: a chunk of rows, or a whole action's
  rows when the dual Gram needs them), each
  action's Gram and its Cholesky factor, ``2 x |A| x min(n, D)^2``, rewards,
  continues, row and next-row indices, ``4 x n``, and the raw states the encoder
  reads (gathered float32, then two float64 copies), ``states x 20 obs_dim`` bytes;
* streamed (:class:`~fedqhd.readout.StreamingRidgeFQI`): each action's Gram and
  factor, ``2 x |A| x D^2``, the chunks a sweep holds (two pairs of states and next
  states, and the encoder's work), ``5 x chunk x D``, and the raw transitions it
  keeps by action: float32 states and next states (``obs_dim`` numbers each) and
  three float64/int64 numbers, ``n x (8 obs_dim + 24)`` bytes.

Checked against ``tracemalloc``'s peak over construction and one sweep
(``benchmarks/fit_memory_estimate.py``, BENCHMARKS.md): the peak lies between 0.63 and
1.0 times the estimate; tests/test_bounds.py asserts [0.4, 1].
"""

from __future__ import annotations

import os

__all__ = ["GIB", "FitMemoryError", "available_memory", "fit_memory", "format_bytes"]

GIB = 1 << 30
#: feature rows per transition the in-memory fit holds when its distinct states are
#: unknown (states and next states never shared)
IN_MEMORY_COPIES = 2
#: chunk x D arrays the streaming fit holds at its peak
CHUNK_COPIES = 5
#: rows of float32 features (``feature-dtype``) the encoder projects, and the fit turns into
#: float64, at a time (:func:`fedqhd.readout.features_times`, :meth:`HDEncoder.encode`)
UPCAST_ROWS = 2048


class FitMemoryError(MemoryError):
    """A fit would need more memory than allowed; the message gives the estimate."""


def fit_memory(n: int, dim: int, n_actions: int, streaming: bool, chunk_size: int = 4096,
               obs_dim: int = 0, states: int | None = None, feature_bytes: int = 8) -> int:
    """Bytes the fit of ``n`` transitions with ``dim`` features needs (module docstring);
    ``states``: distinct states (:func:`fedqhd.readout.distinct_state_count`), default
    the worst case ``2 n``; ``feature_bytes``: 4 for float32 in-memory features (the
    streamed fit keeps none)."""
    n, dim, k = int(n), int(dim), int(n_actions)
    rows = IN_MEMORY_COPIES * n if states is None else int(states)
    if streaming:
        return (8 * (2 * k * dim * dim + CHUNK_COPIES * min(chunk_size, max(n, 1)) * dim)
                + n * (8 * int(obs_dim) + 24))
    features = rows * dim * int(feature_bytes)
    if feature_bytes != 8:  # float32: the float64 block the arithmetic works on
        features += 8 * min(n, max(UPCAST_ROWS, dim)) * dim
    return features + 8 * (2 * k * min(n, dim) ** 2 + 4 * n) + rows * 20 * int(obs_dim)


def available_memory() -> int | None:
    """Bytes the system can give now (``MemAvailable`` of ``/proc/meminfo``, else free
    physical pages); ``None`` if unknown (then nothing is refused)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, AttributeError):
        return None


def format_bytes(n: float) -> str:
    """``1.5 GiB``, ``12.0 MiB``: sizes for messages."""
    for unit, size in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"
