"""torch_xla.distributed.spmd (xs) over torch_xla_core.sharding."""
from .xla_sharded_tensor import XLAShard, XLAShardedTensor  # noqa: F401
from .xla_sharding import (HybridMesh, XLAPatchedLinear, xla_patched_nn_linear_forward, MarkShardingFunction, Mesh, ShardingSpec, ShardingType,  # noqa: F401
                           clear_sharding, get_1d_mesh, get_global_mesh, mark_sharding,
                           mark_sharding_with_gradients, set_global_mesh, wrap_as_sharded_tensor, wrap_if_sharded)
from . import xla_sharding  # noqa: F401
