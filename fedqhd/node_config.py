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

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedqhd.data.shard import MAX_COMPRESSION_RATIO, MAX_TRANSITIONS, VALUE_CHECKS
from fedqhd.settings import KeyedSettings, SettingError, choice, number, setting

__all__ = ["NodeConfigError", "NodeSettings"]


class NodeConfigError(ValueError):
    """A node-config key has a bad value; the message names the key and the valid range."""


@dataclass(frozen=True)
class NodeSettings(KeyedSettings):
    """Node-config keys (field ``foo_bar`` is key ``foo-bar``) with their defaults."""

    value_check: str = setting(
        "refuse", choice(VALUE_CHECKS),
        "shard values far outside the env's bounds (docs/data.md): refuse, warn (a warning "
        "and the reply metric value-flags) or off")
    max_shard_transitions: int = setting(
        MAX_TRANSITIONS, number(1, 2**62, integer=True),
        "most rows a shard file may declare (checked before loading)")
    max_compression_ratio: float = setting(
        MAX_COMPRESSION_RATIO, number(1.0, 1e12), "most a shard archive may expand "
        "(uncompressed / file size; archives under 16 MiB exempt); refused before "
        "decompressing")
    memory_cap_gib: float = setting(
        0.0, number(0.0, 1e9), "GiB a learner may allocate for its fit (0: the memory "
        "available when it starts); above it the fit streams or is refused")
    learner_cache_mib: int = setting(
        1024, number(0, 1 << 30, integer=True), "MiB of node learners (encoded shards) one "
        "process keeps between rounds; the rest are rebuilt per message (same results)")

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> NodeSettings:
        """The settings of ``node_config`` (other keys are other parts' business); a bad
        value raises :class:`NodeConfigError` naming the key."""
        try:
            return cls.from_keys(node_config)
        except SettingError as exc:
            raise NodeConfigError(f"node-config {exc}") from None
