"""A node's own settings: what the SuperNode's operator sets (``flower-supernode
--node-config``, or the simulation's per-node config), never the run submitter.

They protect the node and its data: how far a shard file may claim or expand before it is
refused, what to do with values far outside the env's bounds, how much memory a fit may
take, and how many encoded shards one process keeps. A run config cannot lift them. The
POOL learner's privacy settings (``rho-budget``, ``noise``, ``reproducible-noise``) are
the node's too (:class:`fedqhd.pool.federated.ClientPrivacy`); ``partition-id``,
``num-partitions`` and ``data-dir`` say which data the node holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from fedqhd.data.shard import MAX_COMPRESSION_RATIO, MAX_TRANSITIONS, VALUE_CHECKS

__all__ = ["NodeConfigError", "NodeSettings"]


class NodeConfigError(ValueError):
    """A node-config key has a bad value; the message names the key and the valid range."""


def _setting(default: Any, check: Callable[[Any], str | None], doc: str) -> Any:
    return field(default=default, metadata={"check": check, "doc": doc})


def _number(lo: float, hi: float, integer: bool = False) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        ok = (isinstance(v, int if integer else int | float) and not isinstance(v, bool)
              and lo <= v <= hi)
        return None if ok else f"{'an integer' if integer else 'a number'} in [{lo}, {hi}]"
    return check


@dataclass(frozen=True)
class NodeSettings:
    """Node-config keys (field ``foo_bar`` is key ``foo-bar``) with their defaults."""

    value_check: str = _setting(
        "refuse", lambda v: None if v in VALUE_CHECKS else f"one of {', '.join(VALUE_CHECKS)}",
        "shard values far outside the env's bounds (docs/data.md): refuse, warn (a warning "
        "and the reply metric value-flags) or off")
    max_shard_transitions: int = _setting(
        MAX_TRANSITIONS, _number(1, 2**62, integer=True),
        "most rows a shard file may declare (checked before loading)")
    max_compression_ratio: float = _setting(
        MAX_COMPRESSION_RATIO, _number(1.0, 1e12), "most a shard archive may expand "
        "(uncompressed / file size; archives under 16 MiB exempt); refused before "
        "decompressing")
    memory_cap_gib: float = _setting(
        0.0, _number(0.0, 1e9), "GiB a learner may allocate for its fit (0: the memory "
        "available when it starts); above it the fit streams or is refused")
    learner_cache_mib: int = _setting(
        1024, _number(0, 1 << 30, integer=True), "MiB of node learners (encoded shards) one "
        "process keeps between rounds; the rest are rebuilt per message (same results)")

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> NodeSettings:
        """The settings of ``node_config`` (other keys are other parts' business); a bad
        value raises :class:`NodeConfigError` naming the key."""
        kwargs = {}
        for f in fields(cls):
            key = f.name.replace("_", "-")
            if key not in node_config:
                continue
            value = node_config[key]
            if isinstance(f.default, float) and isinstance(value, int) and not isinstance(
                    value, bool):
                value = float(value)
            problem = f.metadata["check"](value)
            if problem:
                raise NodeConfigError(f"node-config key '{key}' = {value!r} is invalid: "
                                      f"expected {problem}")
            kwargs[f.name] = value
        return cls(**kwargs)
