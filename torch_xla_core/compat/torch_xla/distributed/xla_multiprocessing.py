"""torch_xla.distributed.xla_multiprocessing (xmp): spawn, torch_xla_core.distributed's."""
from ....distributed import spawn  # noqa: F401
