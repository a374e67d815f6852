"""A per-process cache of node learners, bounded by the bytes their arrays hold.

Why: a process may serve many simulated nodes (a Ray actor takes whichever node's
message comes next, so over a run every actor sees most nodes). Keeping every node's
encoded shard costs ``nodes x actors`` copies (3.8 MB a node at the defaults, 7 MB
before states and next states shared their features: 10 GiB for 1000 nodes on two
actors), while rebuilding a learner from its cached shard is
deterministic and takes tens of milliseconds. So the cache keeps learners up to a
byte budget and builds the rest per message.

Admission, not LRU: nodes arrive round-robin (every node once a round), and an LRU
smaller than the working set then misses on every access. Entries are admitted while
they fit and kept; a node that does not fit is built for the message and dropped.
Entries of earlier runs (or other settings) are dropped when the first message of
another run (or settings) arrives.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np

V = TypeVar("V")


def array_bytes(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes of the numpy arrays reachable from ``obj`` (attributes, containers), each
    array (or the base it views) counted once."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        base = obj.base if isinstance(obj.base, np.ndarray) else None
        if base is not None:
            return array_bytes(base, seen)
        return int(obj.nbytes)
    if isinstance(obj, dict):
        return sum(array_bytes(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return sum(array_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        return array_bytes(vars(obj), seen)
    return 0


class BoundedCache(Generic[V]):
    """Values by key, admitted while their :func:`array_bytes` fit ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.entries: dict[Hashable, tuple[V, int]] = {}
        self.used = 0
        self.generation: Hashable = None
        self.hits = 0
        self.builds = 0

    def get(self, key: Hashable, build: Callable[[], V], generation: Hashable = None) -> V:
        """The cached value of ``key``, or ``build()`` (kept if it fits).

        ``generation`` (a run and its settings): when it differs from the last call's,
        every entry is dropped first, once. Why not a per-entry staleness test: that
        scans every entry at every build (O(entries) per message, 5 ms at 280 entries).
        """
        if generation != self.generation:
            self.entries.clear()
            self.used = 0
            self.generation = generation
        if key in self.entries:
            self.hits += 1
            return self.entries[key][0]
        value = build()
        self.builds += 1
        size = array_bytes(value)
        if self.used + size <= self.budget:
            self.entries[key] = (value, size)
            self.used += size
        return value

    def resize(self, budget: int) -> None:
        """A new budget; entries beyond it are dropped, newest first."""
        self.budget = int(budget)
        for key in reversed(list(self.entries)):
            if self.used <= self.budget:
                break
            self.used -= self.entries.pop(key)[1]
