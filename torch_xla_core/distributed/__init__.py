"""Data parallelism across processes, as PyTorch and torch_xla users write
it: torch_xla's collectives (all_reduce, all_gather, reduce_scatter,
all_to_all, collective_permute, reduce_gradients, optimizer_step: in the
step's graph, collectives.py), its host meeting points (rendezvous,
mesh_reduce) and xmp.spawn (processes.py), torch.distributed's "xla"
backend (backend.py: DDP, dist.all_reduce & co.) and torch's functional
collectives on xla tensors (funcol.py: DTensor's redistribute and ops;
device_mesh and distribute_tensor for an "xla" mesh, which torch leaves
to torch_xla; FSDP2's fully_shard: _fsdp.py). Importing torch_xla_core
installs the backend and the handlers (install())."""
from . import _fsdp, backend, funcol  # noqa: F401  (_fsdp, funcol: their handlers register at import)
from .collectives import (REDUCE_AND, REDUCE_MAX, REDUCE_MIN, REDUCE_MUL, REDUCE_OR, REDUCE_SUM,  # noqa: F401
                          all_gather, all_reduce, all_to_all, collective_permute, device_mesh, distribute_tensor,
                          optimizer_step, reduce_gradients, reduce_scatter, world_size)
from .processes import barrier, mesh_reduce, rendezvous, spawn  # noqa: F401


def install() -> None:
    """torch.distributed's "xla" backend and xla:// init method; FSDP2 on xla (_fsdp.py)."""
    backend.install()
    _fsdp.install()
