"""A node's own settings: what the SuperNode's operator sets (``flower-supernode
--node-config``, or the simulation's per-node config), never the run submitter.

They protect the node and its data: how far a shard file may claim or expand before it is
refused, what to do with values far outside the env's bounds, how much memory a fit may
take, and how many encoded shards one process keeps. A run config cannot lift them. The
POOL learner's privacy settings are the node's too (:data:`PRIVACY_KEYS`, read by
:class:`fedqhd.learners.pool_federated.ClientPrivacy`): its noise source, its total
budget, the most rho one release may spend, and its consent to noise anyone can
regenerate; a run may ask for more privacy (a lower ``privacy-rho``), never less.
``partition-id``, ``num-partitions`` and ``data-dir`` say which data the node holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedqhd.data.shard import MAX_COMPRESSION_RATIO, MAX_TRANSITIONS, VALUE_CHECKS
from fedqhd.privacy.noise import NOISE_KINDS
from fedqhd.settings import KeyedSettings, SettingError, choice, flag, number, setting

__all__ = ["PRIVACY_KEYS", "NodeConfigError", "NodeSettings", "node_config_arg"]

#: the node's privacy keys, which every deployment file pins explicitly
PRIVACY_KEYS: tuple[str, ...] = ("noise", "rho-budget", "rho", "reproducible-noise")


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
    noise: str = setting(
        "opendp", choice(NOISE_KINDS), "POOL's noise: opendp (secure discrete Gaussian), "
        "numpy (experiments only, NOT secure) or none (exact counts: this node's consent to "
        "non-private releases, which a run must also be marked for)")
    rho_budget: float = setting(
        10.0, number(0.0, 1e6, lo_open=True), "total zCDP rho over every release of this "
        "node's shard, in any run (the on-disk ledger)")
    rho: float = setting(
        1.0, number(0.0, 1e6, lo_open=True), "most zCDP rho one release may spend: a run's "
        "privacy-rho above it is lowered to it")
    reproducible_noise: bool = setting(
        False, flag, "numpy noise seeded from the run's seed and partition (regenerable by "
        "anyone with the run config: epsilon = infinity); needs noise = numpy")

    @classmethod
    def of(cls, node_config: Mapping[str, Any]) -> NodeSettings:
        """The settings of ``node_config`` (other keys are other parts' business); a bad
        value raises :class:`NodeConfigError` naming the key."""
        try:
            settings: NodeSettings = cls.from_keys(node_config)
        except SettingError as exc:
            raise NodeConfigError(f"node-config {exc}") from None
        if settings.reproducible_noise and settings.noise != "numpy":
            raise NodeConfigError(f"node-config key 'reproducible-noise' = true needs 'noise' "
                                  f"= 'numpy' (got {settings.noise!r}): only numpy noise can be "
                                  "seeded")
        return settings

    def privacy(self) -> dict[str, Any]:
        """The privacy keys (:data:`PRIVACY_KEYS`) and their values."""
        values = self.to_dict()
        return {key: values[key] for key in PRIVACY_KEYS}


def node_config_arg(values: Mapping[str, Any]) -> str:
    """``values`` as ``flower-supernode --node-config`` takes them: space-separated
    ``key=value`` pairs, strings quoted (TOML), booleans ``true``/``false``."""
    def toml(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return repr(v)
    return " ".join(f"{key}={toml(value)}" for key, value in values.items())
