"""Private trajectory shards: collection, partitioning across clients, validated I/O.

See :mod:`fedqhd.data.shard` for the file schema and ``docs/data.md`` for an
overview. ``fedqhd data generate|inspect`` (:mod:`fedqhd.data.cli`) writes and
checks shard folders for deployments.
"""

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
    Shard,
    ShardError,
    load_shard,
    pooled,
    save_shard,
)

__all__ = [
    "ARRAY_SCHEMA",
    "BEHAVIOUR_KIND",
    "CACHE_ENV_VAR",
    "FORMAT_VERSION",
    "PARTITIONS",
    "Shard",
    "ShardError",
    "client_shard",
    "collect_shard",
    "default_cache_dir",
    "generate_client_shard",
    "load_shard",
    "partition_settings",
    "pooled",
    "save_shard",
    "shard_filename",
    "shard_seed",
]
