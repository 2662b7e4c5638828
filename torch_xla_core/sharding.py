"""GSPMD sharding in torch_xla's names: a Mesh of xla devices with named
axes, mark_sharding(tensor, mesh, partition_spec) to lay a tensor out over
it, and XLA's SPMD partitioner does the rest (torch_xla_core/_execution/spmd.py).

The public face of torch_xla_core/_execution/sharding.py (the implementation: read it there)."""
from ._execution.sharding import (Mesh, ShardingSpec, mark_sharding, get_sharding, local_shards, local_shard_values,
                                  clear_sharding, load_local_shards, Shard, set_global_mesh, get_global_mesh)  # noqa: F401

__all__ = ["Mesh", "ShardingSpec", "mark_sharding", "get_sharding", "local_shards", "local_shard_values", "clear_sharding", "load_local_shards", "Shard", "set_global_mesh", "get_global_mesh"]
