"""FSDP2 (torch.distributed.fsdp.fully_shard) on xla tensors. Everything it
asks of a device is met elsewhere: the device module's Stream and Event
(_tracing/device.py: one in-order stream, so its waits are no-ops), all_gather_single
and reduce_scatter_single on the "xla" backend (backend.py, in the step's
graph, with completed Works), DTensor on an "xla" DeviceMesh (backend.py,
funcol.py). One thing is done here: FSDP2 frees a module's unsharded
parameters after use by resizing their storage to 0 bytes and resizes it
back before the next all-gather (_fsdp_param.free_storage / alloc_storage),
and an xla tensor's storage is a placeholder (its value lives in the lazy
graph), so torch's resize_ raises. For xla tensors the two functions act on
the lazy storage instead:

- free: the storage drops its value and holds a failed one ("freed by
  FSDP2"), which no sync computes and which raises, naming FSDP2, when read
  (as reading a 0-byte storage fails in torch). The graphs already traced
  from the gathered value keep it as they need it; once they have run,
  nothing holds the unsharded parameter's device buffer (DDP-sized memory
  otherwise held between steps: the step's sync would compute it as an
  output and keep it).
- alloc: a freed storage holds a fresh value again (zeros, a constant that
  costs no buffer), which the all-gather's copy-out then overwrites whole
  before any use.

The two functions are replaced when torch's module loads (an import hook,
_Finder), whatever the order of imports; a torch without them leaves the
hook inert, and FSDP2 then raises torch's own storage error. FSDP2's own
ops (fsdp::all_gather_copy_in, split_with_sizes_copy, chunk_cat and torch
2.15's chunk_cat_mixed_dtype: copies
into and out of the flat collective buffers) get handlers that do what
torch's device kernels do, traced into the step's graph; torch 2.15's
fsdp::record_grad_output_stream (orders a device free after a stream's
reads) is a no-op, as torch's default: a PJRT buffer is freed only when the
graphs that read it are done."""
import functools
import importlib.abc
import importlib.machinery
import sys

import torch

from .. import _C
from .._tracing import tensor as _tensor
from .._ops import impl_by_name

_TARGETS = {"torch.distributed.fsdp._fully_shard._fsdp_param": ("free_storage", "alloc_storage"),
            "torch.distributed.fsdp._fully_shard._fsdp_param_group": ("alloc_storage",)}

FREED = ("FSDP2 freed this unsharded parameter after its module's forward/backward (its storage resized to 0 "
         "bytes, as torch frees it); it holds a value again at the module's next all-gather. Read the module's "
         "parameters (the sharded DTensors) instead, or use reshard_after_forward=False to keep it")


def _placeholder(tensor, root):
    """A fresh value for tensor's storage: zeros (a constant: no buffer, and
    nothing read from the value it replaces)."""
    return torch.zeros(root.shape, dtype=tensor.dtype, device=tensor.device)._lt


def free(tensor) -> None:
    """FSDP2's free_storage for an xla tensor: its storage holds a failed
    value (FREED) instead of its value, so no sync computes or keeps it."""
    root = tensor._lt.root()  # the whole storage
    if root.op == "error":
        return
    root.assign(_placeholder(tensor, root))  # (a cut skips device data: give it a pending value to fail)
    _C.GraphCut([root]).poison([0], FREED)


def alloc(tensor) -> None:
    """FSDP2's alloc_storage for an xla tensor: a freed storage holds a
    value again (zeros, overwritten by the all-gather's copy-out)."""
    root = tensor._lt.root()  # the whole storage
    if root.op == "error":
        root.assign(_placeholder(tensor, root))


_XLA_VERSIONS = {"free_storage": free, "alloc_storage": alloc}


def _on_xla(fn):
    name = fn.__name__

    @functools.wraps(fn)
    def storage_op(tensor):
        if isinstance(tensor, _tensor.XlaTensor):
            _XLA_VERSIONS[name](tensor)
        else:
            fn(tensor)

    storage_op.txc_on_xla = True
    return storage_op


def _patch(module) -> None:
    for name in _TARGETS[module.__name__]:
        fn = getattr(module, name, None)
        if fn is not None and not getattr(fn, "txc_on_xla", False):
            setattr(module, name, _on_xla(fn))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds torch's FSDP2 modules as the path finder does, and patches each
    right after it runs (before a sibling imports its names)."""

    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def install() -> None:
    """Patches FSDP2's storage functions now if loaded, else when they load."""
    for name in _TARGETS:
        if name in sys.modules:
            _patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


@impl_by_name("fsdp::all_gather_copy_in")
def all_gather_copy_in(inputs, output, split_sizes, input_numel, rank):
    """This rank's parameters copied into its slice of the flat all-gather
    buffer: (the slice, the buffer)."""
    part = output.narrow(0, input_numel * rank, input_numel)
    with torch.no_grad():
        for dst, src in zip(torch.split(part, list(split_sizes)), inputs):
            dst.copy_(src.reshape(-1))
    return part, output


@impl_by_name("fsdp::split_with_sizes_copy")
def split_with_sizes_copy(output, split_sizes, dim=0, *, out):
    """The gathered buffer copied out into each parameter's tensor."""
    with torch.no_grad():
        for dst, src in zip(out, torch.split(output, list(split_sizes), dim)):
            dst.copy_(src.reshape(dst.shape))


@impl_by_name("fsdp::chunk_cat")
@impl_by_name("fsdp::chunk_cat_mixed_dtype")  # torch 2.15's, for gradients of several dtypes
def chunk_cat(tensors, dim, num_chunks, *, out):
    """The gradients, each cut in num_chunks along dim, catenated chunk by
    chunk into the reduce-scatter's flat input (torch._chunk_cat), each cast
    to out's dtype."""
    parts = []
    for t in tensors:
        t = t.to(out.dtype)
        pad = -t.shape[dim] % num_chunks  # torch pads each tensor's dim to a multiple of num_chunks
        if pad:
            t = torch.cat([t, t.new_zeros(*t.shape[:dim], pad, *t.shape[dim + 1:])], dim)
        parts.append(t.reshape(*t.shape[:dim], num_chunks, -1))
    with torch.no_grad():
        out.copy_(torch.cat(parts, dim + 1).reshape(out.shape))


@impl_by_name("fsdp::record_grad_output_stream")  # torch 2.15
def record_grad_output_stream(buffer, stream_id, device_index, device_type):
    """Nothing to order: without it the op would run as a CPU fallback, a
    sync per reduce-scatter."""
