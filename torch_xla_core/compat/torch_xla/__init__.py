"""torch_xla's top-level functions (torch_xla.device(), devices(), sync(),
step(), compile(), launch(), manual_seed()) over torch_xla_core, and its
submodules (core, runtime, debug, distributed, experimental, utils) as
attributes, as `import torch_xla` gives them."""
import contextlib
import functools

import torch
import torch.distributed as _dist

from ..._tracing import random as _random
from ... import metrics as _metrics
from ..._runtime import runtime as _runtime
from . import runtime
from . import core, debug, distributed, experimental, test, utils  # noqa: F401  (torch_xla.core.xla_model, ...)
from .core import xla_model as _xm
from .distributed import xla_multiprocessing

xm = _xm  # torch_xla exports it too (torch_xla.xm.mark_step())

__all__ = ["device", "devices", "real_devices", "device_count", "sync", "step", "compile", "launch",
           "manual_seed"]


def device(index: int = None) -> torch.device:
    """The xla device `index` (xla:0 when None), as torch_xla.device()."""
    return _xm.xla_device(index)


def devices() -> list:
    """Every xla device of this process: [torch.device('xla:0'), ...]."""
    return [torch.device("xla", i) for i in range(_runtime.device_count())]


def real_devices() -> list:
    """The devices by platform name: ['CPU:0', 'CPU:1', ...] (torch_xla's 'TPU:0' form)."""
    return [f"{runtime.device_type()}:{i}" for i in range(_runtime.device_count())]


def device_count() -> int:
    """torch_xla.device_count(): the xla devices this process drives."""
    return _runtime.device_count()


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """Compiles (once per graph) and runs everything traced so far; counts
    "MarkStep" (torch_xla.sync)."""
    _xm.mark_step(wait=wait, reset_scope=reset_scope)


@contextlib.contextmanager
def step():
    """A training step: syncs on entry (what was traced before is not part of
    the step) and on exit, also when the block raises (torch_xla.step)."""
    sync()
    try:
        yield
    finally:
        sync()


def compile(f=None, full_graph: bool = False, name: str = None, num_different_graphs_allowed: int = None):
    """torch_xla.compile: f(*args) runs as one step (synced before and
    after), usable as a decorator with or without arguments. full_graph=True
    raises when the step is cut into more than one graph; name labels it in
    errors. (For tracing once and replaying, use txc.compile.)"""
    if f is None:
        return functools.partial(compile, full_graph=full_graph, name=name,
                                 num_different_graphs_allowed=num_different_graphs_allowed)
    label = name or getattr(f, "__name__", "f")

    @functools.wraps(f)
    def run(*args, **kwargs):
        sync()
        before = _metrics.counters().get("execute", 0)
        try:
            out = f(*args, **kwargs)
        finally:
            sync()
        graphs = _metrics.counters().get("execute", 0) - before
        if full_graph and graphs > 1:
            raise RuntimeError(f"torch_xla.compile({label}, full_graph=True): the step ran as {graphs} graphs; "
                               f"something read a tensor's value on the host inside it (.item(), print, `if t:`)")
        return out
    return run


def launch(fn, args=(), start_method: str = "spawn", debug_single_process: bool = False) -> None:
    """torch_xla.launch: fn(index, *args) in each process: under torchrun,
    this process's local rank; else xmp.spawn's processes (one here, as
    torch_xla_core drives every local device from one process)."""
    if _dist.is_torchelastic_launched():
        fn(_xm.get_local_ordinal(), *args)
    else:
        xla_multiprocessing.spawn(fn, args=args, nprocs=1 if debug_single_process else None,
                                  start_method=start_method)


def manual_seed(seed, device=None) -> None:
    """Seeds the xla RNG (and torch's CPU generator, as torch.manual_seed)."""
    torch.manual_seed(int(seed))
    _random.manual_seed(int(seed))
