"""torch_xla.core.xla_model (xm) over torch_xla_core: devices, steps, the
RNG seed, saving, step closures, process ordinals; the collectives,
optimizer_step, rendezvous and mesh_reduce are torch_xla_core.distributed's."""
import contextlib
import threading

import torch
import torch.utils._pytree as pytree

from ...._tracing import random as _random, tensor as _tensor
from .... import metrics
from ...._features import serialization
from ...._runtime import runtime
from ...._tracing.tensor import XlaTensor
from .. import runtime as _xr
from ..utils import utils as _utils
from . import xla_env_vars  # noqa: F401

# torch_xla's collectives and optimizer_step (the gradients' mean across processes, then the step)
from ....distributed import (REDUCE_AND, REDUCE_MAX, REDUCE_MIN, REDUCE_MUL, REDUCE_OR, REDUCE_SUM,  # noqa: F401,E402
                             all_gather, all_reduce, all_to_all, collective_permute, mesh_reduce, optimizer_step,
                             reduce_gradients, reduce_scatter, rendezvous)

_closures = threading.local()


def xla_device(n: int = None, devkind: str = None) -> torch.device:
    """The xla device n (xla:0 when None); devkind, when given, must be this platform's."""
    if devkind is not None and devkind.upper() != runtime.platform().upper():
        raise RuntimeError(f"xla_device: no {devkind} device here; this process runs on "
                           f"{runtime.platform().upper()} (PJRT_DEVICE)")
    n = 0 if n is None else int(n)
    count = runtime.device_count()
    if not 0 <= n < count:
        raise RuntimeError(f"xla_device: device index {n} is out of range: {count} xla device(s) on "
                           f"{runtime.platform().upper()} (TXC_NUM_CPU_DEVICES=N gives the CPU platform N)")
    return torch.device("xla", n)


def get_xla_supported_devices(devkind: str = None, max_devices: int = None) -> list:
    """['xla:0', 'xla:1', ...]: this process's devices (at most max_devices)."""
    if devkind is not None and devkind.upper() != runtime.platform().upper():
        return []
    n = runtime.device_count()
    if max_devices is not None:
        n = min(n, max_devices)
    return [f"xla:{i}" for i in range(n)]


def xla_device_hw(device) -> str:
    """The hardware type of an xla device: 'CPU', 'CUDA' or 'TPU'."""
    device = torch.device(device)
    if device.type != "xla":
        raise RuntimeError(f"xla_device_hw: {device} is not an xla device")
    return runtime.platform().upper()


def is_xla_tensor(tensor) -> bool:
    """Whether tensor is a torch.Tensor on an xla device."""
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "xla"


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Ends the step: compiles (once per graph) and runs what was traced,
    then runs the step closures; counts "MarkStep"."""
    metrics.counter_add("mark_step")
    _tensor.sync_lazy(None, wait=wait)
    _run_step_closures()


def wait_device_ops(devices=()) -> None:
    """Blocks until the device has finished the work launched so far."""
    runtime.wait_all()


def set_rng_state(seed: int, device=None) -> None:
    """Seeds the xla device RNG."""
    _random.manual_seed(int(seed))


def get_rng_state(device=None) -> int:
    """The xla RNG's seed."""
    return _random.initial_seed()


@contextlib.contextmanager
def fork_rng(device=None, enabled: bool = True):
    """The xla RNG's seed and state are restored when the block ends (what it
    draws or seeds inside does not leak out)."""
    if not enabled:
        yield
        return
    seed, state = _random.initial_seed(), _random.get_rng_state()
    try:
        yield
    finally:
        _random.manual_seed(seed)
        _random.set_rng_state(state)


def send_cpu_data_to_device(datas, device, input_sharding=None):
    """Every CPU tensor in `datas` (a pytree; a DataWrapper's get_tensors(),
    rebuilt with its from_tensors) moved to `device`; input_sharding (a
    spmd.ShardingSpec) lays them out. As torch_xla: a lone tensor comes back
    in a list, anything else as the same structure."""
    def move(x):
        if isinstance(x, _utils.DataWrapper):
            return x.from_tensors([move(t) for t in x.get_tensors()])
        if isinstance(x, torch.Tensor) and not isinstance(x, XlaTensor):
            x = x.to(device)
            if input_sharding is not None:
                input_sharding.apply(x)
        return x
    if type(datas) is torch.Tensor:
        datas = [datas]
    return pytree.tree_map(move, datas)


def add_step_closure(closure, args=(), run_async: bool = False) -> None:
    """Runs closure(*args) after the next mark_step() (torch_xla's step
    closures: reading values on the host once the step's graph has run)."""
    if not hasattr(_closures, "pending"):
        _closures.pending = []
    _closures.pending.append((closure, tuple(args)))


def _run_step_closures() -> None:
    pending = getattr(_closures, "pending", None)
    if pending:
        _closures.pending = []
        for fn, args in pending:
            fn(*args)


def save(data, file_or_path, master_only: bool = True, global_master: bool = False) -> None:
    """torch.save of xla tensors (written as CPU tensors): every process
    calls it, process 0 writes (each machine's first with global_master=False
    when there are several machines)."""
    serialization.save(data, file_or_path, master_only=master_only, global_master=global_master)


def unlazy(tensors) -> None:
    """Computes the given tensors now."""
    _tensor.sync_lazy([t._lt for t in tensors])


# the process ordinals, as torch_xla's xm reads them from its runtime module
world_size = xrt_world_size = _xr.world_size
get_ordinal = _xr.global_ordinal
get_local_ordinal = _xr.local_ordinal


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process has rank 0 on its machine (local=True) or in the job."""
    return (get_local_ordinal() if local else get_ordinal()) == 0
