"""torch_xla.distributed: spmd (GSPMD sharding), parallel_loader,
xla_multiprocessing (spawn), fsdp.utils."""
from . import fsdp, parallel_loader, spmd, xla_multiprocessing  # noqa: F401
