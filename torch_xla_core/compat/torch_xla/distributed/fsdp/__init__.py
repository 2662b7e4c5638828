"""torch_xla.distributed.fsdp: only utils.apply_xla_patch_to_nn_linear (FSDP
itself is torch_xla's; with torch_xla_core shard parameters with
distributed.spmd's mark_sharding)."""
from . import utils  # noqa: F401
