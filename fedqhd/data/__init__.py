"""Private trajectory shards: collection, partitioning across clients, validated I/O.

See :mod:`fedqhd.data.shard` for the file schema and ``docs/data.md`` for an
overview. ``fedqhd data generate|inspect`` (:mod:`fedqhd.commands.data`) writes and
checks shard folders for deployments; :func:`shards_from_arrays` (``fedqhd data
import``) turns a user's own transition arrays into shards.
"""

from fedqhd.data.arrays import IMPORT_KIND, episode_ids_from_flags, shards_from_arrays
from fedqhd.data.collect import BEHAVIOUR_KIND, collect_shard
from fedqhd.data.partition import (
    CACHE_ENV_VAR,
    PARTITIONS,
    client_shard,
    default_cache_dir,
    generate_client_shard,
    partition_settings,
    shard_filename,
    shard_seed,
)
from fedqhd.data.shard import (
    ARRAY_SCHEMA,
    FORMAT_VERSION,
    MAX_COMPRESSION_RATIO,
    MAX_TRANSITIONS,
    VALUE_CHECKS,
    Shard,
    ShardError,
    ShardLimits,
    load_shard,
    pooled,
    save_shard,
)

__all__ = [
    "ARRAY_SCHEMA",
    "BEHAVIOUR_KIND",
    "CACHE_ENV_VAR",
    "FORMAT_VERSION",
    "IMPORT_KIND",
    "MAX_COMPRESSION_RATIO",
    "MAX_TRANSITIONS",
    "PARTITIONS",
    "Shard",
    "ShardError",
    "ShardLimits",
    "VALUE_CHECKS",
    "client_shard",
    "collect_shard",
    "default_cache_dir",
    "episode_ids_from_flags",
    "generate_client_shard",
    "load_shard",
    "partition_settings",
    "pooled",
    "save_shard",
    "shard_filename",
    "shard_seed",
    "shards_from_arrays",
]
