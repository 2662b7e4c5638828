"""torch_xla_core: PyTorch on XLA through a C++ lazy-tensor core.

    import torch, torch_xla_core as txc
    dev = txc.device()                 # torch.device("xla:0")
    y = model.to(dev)(x.to(dev))       # traced, not run
    txc.sync()                         # compiled once per graph, then cached

Training helpers in torch_xla's names: mark_step (= sync), optimizer_step
(gradients averaged across processes, then step), wait_device_ops,
collectives (all_reduce, all_gather, ...: torch_xla_core.distributed);
txc.amp (autocast("xla")), txc.data.DeviceLoader, txc.profiler.trace,
txc.metrics.short_report().
"""
import importlib

import jax
import torch

from ._version import __version__  # noqa: F401  (txc.__version__; the build reads _version.py)
from . import config  # txc.config: every TXC_* setting and its value (python -m torch_xla_core.config)
from ._runtime import torch_compat as _compat

_compat.check_torch()  # a torch outside the supported range: an ImportError naming it and the range

from . import _install  # noqa: E402

_install.install()  # the device, the dispatch table, the autograd engine, autocast, serialization, ...

from . import _C, debug, metrics  # noqa: E402,F401  (txc.metrics, ...)
from ._execution import compile_cache, executor, recompiles  # noqa: E402,F401  (txc.executor, ...)
from ._tracing import checks as _checks, tensor as _tensor  # noqa: E402,F401
from ._runtime import runtime  # noqa: E402,F401  (txc.runtime)

# torch_xla's global dtype flags (deprecated there in 2.6) change every
# tensor's dtype behind the program's back; we do not honour them, and say so.
_LEGACY_DTYPE_FLAGS = {
    "XLA_USE_BF16": "convert the model and inputs with .to(torch.bfloat16), or use "
                    "torch.autocast('xla', dtype=torch.bfloat16)",
    "XLA_DOWNCAST_BF16": "convert with .to(torch.bfloat16), or use torch.autocast('xla', dtype=torch.bfloat16)",
    "XLA_USE_FP16": "convert with .to(torch.float16), or use torch.autocast('xla', dtype=torch.float16) "
                    "with torch.amp.GradScaler('xla')",
    "XLA_USE_32BIT_LONG": "create index tensors as torch.int32 where 32 bits suffice",
}
for _flag, _instead in _LEGACY_DTYPE_FLAGS.items():
    if config.get(_flag) not in (None, "0"):
        import warnings
        warnings.warn(f"{_flag} is set but torch_xla_core ignores it (torch_xla deprecated it in 2.6): tensors keep "
                      f"their dtypes. Instead, {_instead}.", FutureWarning, stacklevel=2)

from . import amp, memory, offload, scan  # noqa: E402,F401  (txc.memory, txc.offload, txc.scan)
from ._features import serialization  # noqa: E402  (txc.serialization; txc.save below)

save = serialization.save  # torch_xla's xm.save: every process calls it, process 0 writes


def device(index: int = 0) -> torch.device:
    """The xla device `index` (torch.device("xla:0") by default)."""
    n = runtime.device_count()
    if not 0 <= index < n:
        raise ValueError(f"xla device index {index} is out of range: {n} device(s) on {runtime.platform()}")
    return torch.device("xla", index)


def device_count() -> int:
    """The number of xla devices this process drives (xla:0 .. xla:N-1)."""
    return runtime.device_count()


def world_size() -> int:
    """The number of processes (torchrun, torch_xla_core.launch, srun; 1 when run alone)."""
    runtime.backend()
    return jax.process_count()


def global_ordinal() -> int:
    """This process's rank among all processes (0 when run alone)."""
    runtime.backend()
    return jax.process_index()


def local_ordinal() -> int:
    """This process's rank among the processes on this machine."""
    return runtime.local_ordinal()


def sync(wait: bool = False) -> None:
    """Compiles (once per graph) and runs everything traced so far; with
    wait=True, also blocks until the device has finished."""
    _tensor.sync_lazy(None, wait=wait)


def mark_step(wait: bool = False) -> None:
    """torch_xla's name for sync(): ends the step being traced."""
    sync(wait=wait)


def wait_device_ops() -> None:
    """Blocks until the device has finished all work launched so far (the
    pending graph is not run: call sync() first for that)."""
    runtime.wait_all()


# torch_xla's collectives and process helpers (xm.all_reduce, xm.optimizer_step, xm.rendezvous,
# xmp.spawn, ...): torch_xla_core/distributed. optimizer_step reduces the gradients across processes
# (their mean) before stepping; with one process it is optimizer.step().
from .distributed import (all_gather, all_reduce, all_to_all, collective_permute, mesh_reduce,  # noqa: E402,F401
                          optimizer_step, reduce_gradients, reduce_scatter, rendezvous, spawn)
from ._runtime.build_info import build_info, get_cmake_dir, get_include  # noqa: E402
from .replay import compile  # noqa: E402,A001  (txc.compile: trace once, replay)
from ._runtime.peers import PeerLostError  # noqa: E402  (a peer process died: raised in the call that waited)
from ._runtime import peers  # noqa: E402,F401  (txc.peers: the job's processes, PeerLostError's source)
from . import data, profiler, sharding  # noqa: E402
from ._features import dynamo, hf_scan  # noqa: E402,F401  (torch.compile(backend="torch_xla_core"): _install.py)


def __getattr__(name: str):
    # txc.checkpoint (CheckpointManager) loads on first use: it imports
    # torch.distributed.checkpoint, ~1.7 s that `import torch_xla_core` need not pay
    if name == "checkpoint":
        return importlib.import_module(f"{__name__}.checkpoint")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
