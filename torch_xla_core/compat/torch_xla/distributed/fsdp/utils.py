"""torch_xla.distributed.fsdp.utils: apply_xla_patch_to_nn_linear (nn.Linear
layers computed as einsum, so that sharded dims survive)."""
from ..spmd.xla_sharding import apply_xla_patch_to_nn_linear  # noqa: F401
