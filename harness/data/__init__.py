"""Token data: shard formats (shards), the training stream (stream), the built-in synthetic corpus (synthetic)."""

from harness.data.shards import DataError, ShardInfo, inspect_shard, resolve_shards, write_shard

__all__ = ["DataError", "ShardInfo", "inspect_shard", "resolve_shards", "write_shard"]
