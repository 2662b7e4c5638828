"""Sharded checkpoints through torch.distributed.checkpoint (DCP), as
torch_xla's SPMDSavePlanner / SPMDLoadPlanner: each process writes only the
pieces of the xla tensors that lie on its own devices, and reads back only
the pieces its devices need, in whatever layout the tensors it loads into
have now (another mesh or partition spec: resharding on load).

The public face of torch_xla_core/_features/distributed_checkpoint.py (the implementation: read it there)."""
from ._features.distributed_checkpoint import SPMDSavePlanner, SPMDLoadPlanner, AtomicFileSystemWriter, StagedTensor  # noqa: F401

__all__ = ["SPMDSavePlanner", "SPMDLoadPlanner", "AtomicFileSystemWriter", "StagedTensor"]
