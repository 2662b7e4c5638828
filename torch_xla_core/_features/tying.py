"""Module.to("xla") keeps tied parameters tied. torch moves a module's
parameters one module at a time; for CPU -> CUDA it rebinds each Parameter's
data in place (set_data), so a Parameter shared by two modules (tied input
and output embeddings) stays one object. Our tensors are a Python subclass,
which set_data cannot take, so torch makes a new Parameter per module and a
shared one would silently become two, trained apart (Adam then differs from
CPU). This wraps nn.Module._apply: at the outermost call it notes which
modules share a Parameter (or buffer) and, after the move, binds them all to
the first one's moved tensor again when it is an xla tensor. With torch's
swap_module_params_on_conversion on, a move to xla takes torch's default
path (a CPU Parameter cannot be swapped with an xla one)."""
import collections
import threading

import torch
from .._tracing.tensor import XlaTensor

_local = threading.local()
_orig_apply = None


def _shared(root):
    groups = collections.defaultdict(list)
    for mod in root.modules():
        for table in (mod._parameters, mod._buffers):
            for name, t in table.items():
                if t is not None:
                    groups[id(t)].append((table is mod._parameters, mod, name))
    return [g for g in groups.values() if len(g) > 1]


def _apply(self, fn, *args, **kwargs):
    if getattr(_local, "inside", False):
        return _orig_apply(self, fn, *args, **kwargs)
    groups = _shared(self)
    _local.inside = True
    try:
        try:
            out = _orig_apply(self, fn, *args, **kwargs)
        except RuntimeError as e:
            # torch.__future__.set_swap_module_params_on_conversion(True): swap_tensors cannot turn a CPU
            # Parameter into an xla one (the class layouts differ: XlaTensor keeps `_lt` in a slot), and fails
            # at the first tensor moved, before any other moved; torch's default path moves them instead
            if "Couldn't swap" not in str(e) or not torch.__future__.get_swap_module_params_on_conversion():
                raise
            torch.__future__.set_swap_module_params_on_conversion(False)
            try:
                out = _orig_apply(self, fn, *args, **kwargs)
            finally:
                torch.__future__.set_swap_module_params_on_conversion(True)
    finally:
        _local.inside = False
    for g in groups:
        is_param, mod, name = g[0]
        first = (mod._parameters if is_param else mod._buffers)[name]
        if not isinstance(first, XlaTensor):
            continue  # not moved to xla: torch kept (or broke) the tie as it does elsewhere
        for is_param, mod, name in g[1:]:
            (mod._parameters if is_param else mod._buffers)[name] = first
    return out


def install() -> None:
    global _orig_apply
    if _orig_apply is None:
        _orig_apply = torch.nn.Module._apply
        torch.nn.Module._apply = _apply
