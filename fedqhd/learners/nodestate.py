"""A node's learner state in its ``context.state``, with this process's copy as a cache.

Flower's Ray actor pool serves a node's messages from whichever actor is free, and
only the node's Context follows the node: what a client carries between rounds must
live in ``context.state``. Rebuilding it for every message costs time, so each process
keeps the client it last served, used only while its version token is the one in the
Context; otherwise the client is rebuilt from ``context.state`` (fresh if empty).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np
from flwr.app import ConfigRecord, Context

from fedqhd.learners.base import partition
from fedqhd.strategies import contract as C

T = TypeVar("T")


class NodeStates(Generic[T]):
    """The versioned state of one learner's nodes (``name`` keys its records).

    ``cache`` maps (run, partition, partitions, config) to (client, version): this
    process's copies, a speed-up only.
    """

    def __init__(self, name: str, close: Callable[[T], None] | None = None) -> None:
        self.arrays_key = name  #: context.state ArrayRecord: the client's arrays
        self.meta_key = f"{name}-meta"  #: context.state ConfigRecord: scalars and version
        self.close = close
        self.cache: dict[tuple[Any, ...], tuple[T, str]] = {}

    @staticmethod
    def key(context: Context, cfg: Any) -> tuple[Any, ...]:
        pid, n_parts = partition(context)
        return (context.run_id, pid, n_parts, cfg)

    def version(self, context: Context) -> str:
        """The version token of the node's state ("" before its first save)."""
        if self.meta_key not in context.state:
            return ""
        return str(context.state[self.meta_key]["version"])  # type: ignore[index]

    def load(self, context: Context, cfg: Any, build: Callable[[], T],
             restore: Callable[[T, dict[str, np.ndarray], dict[str, Any]], None]) -> T:
        """This process's copy when it is the version in ``context.state``; else a client
        from ``build()``, ``restore``\\ d from ``context.state`` when the node has one.
        Copies of other runs or configs are dropped."""
        key = self.key(context, cfg)
        version = self.version(context)
        cached = self.cache.get(key)
        if cached is not None and cached[1] == version:
            return cached[0]
        client = build()
        if version:
            restore(client, C.from_array_record(context.state[self.arrays_key]),  # type: ignore[arg-type]
                    dict(context.state[self.meta_key]))  # type: ignore[arg-type]
        for stale in [k for k in self.cache if k == key or k[0] != context.run_id
                      or k[3] != cfg]:
            old = self.cache.pop(stale)[0]
            if self.close is not None:
                self.close(old)
        self.cache[key] = (client, version)
        return client

    def forget(self, context: Context, cfg: Any) -> None:
        """Drop this process's copy of the node, after a message that failed midway: the
        copy may have moved past ``context.state``, so the next message rebuilds the node
        from ``context.state``, as any other process would."""
        cached = self.cache.pop(self.key(context, cfg), None)
        if cached is not None and self.close is not None:
            self.close(cached[0])

    def save(self, context: Context, cfg: Any, client: T, arrays: dict[str, np.ndarray],
             scalars: dict[str, Any]) -> None:
        """Write ``arrays`` and ``scalars`` into ``context.state`` under a new version
        token (a counter and a random tag: a process whose earlier write was discarded
        cannot match a later write of another process) and mark this process's copy
        ``client`` as that version."""
        counter = (int(context.state[self.meta_key]["counter"]) + 1  # type: ignore[index,arg-type]
                   if self.meta_key in context.state else 1)
        version = f"{counter}-{secrets.token_hex(8)}"
        context.state[self.arrays_key] = C.to_array_record(arrays)
        context.state[self.meta_key] = ConfigRecord({**scalars, "counter": counter,
                                                     "version": version})
        self.cache[self.key(context, cfg)] = (client, version)
