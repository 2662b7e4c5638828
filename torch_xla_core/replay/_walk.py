"""The step walk of txc.compile: every tensor a step's call can read (its
arguments, the modules, optimizers and tensors among them or among the
globals and closure variables its code reads), where each lives (an input
slot: kind, owner, key) and the signature a replay is guarded by (the
tensors' part in one C++ pass: csrc/py/replay.cpp)."""
import types
from itertools import repeat

import torch

from .. import _C
from .._tracing.tensor import XlaTensor

SCALARS = (bool, int, float, str, type(None))
# Torch's tensor getters (.grad, .requires_grad, is_contiguous()) on a subclass first look up its
# __torch_function__ by name, per call: with XlaTensor's and Parameter's disabled anyway, the walk and the
# signature read them with subclass torch functions off (~0.1-0.3 µs a tensor, ~1300 tensors a step).
# Torch function modes still apply.
plain_getters = torch._C.DisableTorchFunctionSubclass
_ARG, _GROUP = _C.replay_slot_kinds["arg"], _C.replay_slot_kinds["group"]  # input slot kinds made here
                                                                         # (csrc/py/replay.cpp makes the others)


class Walk:
    __slots__ = ("sig", "kinds", "owners", "keys", "tensors", "refusal", "views")

    def __init__(self, views=False):
        self.views = views  # every input view is read through its chain (Compiled's inner), lone ones too
        self.sig = []
        # per input slot where it lives (csrc/py/replay.cpp's Where): its kind (_ARG .. _GROUP), owner, key
        self.kinds, self.owners, self.keys = [], [], []
        self.tensors = []   # the tensor (or None) at each slot
        self.refusal = None

    def tensor(self, t, kind, owner, key):
        # the tensors' part of the signature is made in one pass (signature())
        self.kinds.append(kind)
        self.owners.append(owner)
        self.keys.append(key)
        self.tensors.append(t)

    def signature(self):
        """The guard: what the walk saw, and per tensor slot (_C.replay_signature,
        csrc/py/replay.cpp) None or the value's dims and dtype, requires_grad,
        the first slot holding the same buffer or storage (aliasing among
        inputs) and, for a view sharing its storage, its view ops, storage
        dims, strides and offset (it reads that storage). None when an input
        is not an xla tensor (then self.refusal says which)."""
        with plain_getters():
            tensor_sig, bad = _C.replay_signature(self.tensors, XlaTensor, self.views)
        if tensor_sig is None:
            t = self.tensors[bad]
            self.refusal = self.refusal or f"a {t.device.type} tensor {list(t.shape)} is an input; move it to xla"
            return None
        return tuple(self.sig), tensor_sig

    def value(self, v, where, seen):
        if isinstance(v, torch.Tensor):
            self.tensor(v, _ARG, where, None)
        elif isinstance(v, SCALARS):
            self.sig.append((type(v), v))
        elif isinstance(v, torch.nn.Module):
            self.module(v, seen)
        elif isinstance(v, torch.optim.Optimizer):
            self.optimizer(v, seen)
        elif isinstance(v, (tuple, list)):
            self.sig.append((type(v), len(v)))
            for i, x in enumerate(v):
                self.value(x, where + (i,), seen)
        elif isinstance(v, dict):
            self.sig.append((dict, tuple(v)))
            for k, x in v.items():
                self.value(x, where + (k,), seen)
        elif isinstance(v, (torch.dtype, torch.device, torch.Size, types.FunctionType, types.ModuleType, type)):
            self.sig.append((type(v), v))
        elif isinstance(v, torch.optim.lr_scheduler.LRScheduler):  # its step() runs on every call (_schedulers.py)
            self.sig.append(("scheduler", id(v)))
        else:
            self.refusal = self.refusal or (f"an argument of type {type(v).__name__} cannot be guarded; pass "
                                            f"tensors, modules, optimizers, numbers and containers of them")
            self.sig.append(("?", id(v)))

    def module(self, m, seen):
        # per submodule (Module.modules() order, each once): its number/string attributes (training, and
        # those the forward may read), its hooks, its parameters with their grads and its buffers
        _C.replay_walk_module(m, seen, self.sig, self.kinds, self.owners, self.keys, self.tensors)

    def optimizer(self, opt, seen):
        if id(opt) in seen:
            self.sig.append(("seen", id(opt)))
            return
        seen.add(id(opt))
        self.sig.append(("optimizer", id(opt)))
        for gi, g in enumerate(opt.param_groups):
            for k, v in g.items():
                if k == "params":
                    self.sig.append(tuple(id(p) for p in v))
                elif isinstance(v, torch.Tensor):
                    self.sig.append(k)
                    self.tensor(v, _GROUP, g, k)
                else:
                    self.sig.append((k, v if isinstance(v, (SCALARS, tuple)) else id(v)))
            # per parameter its state's keys; xla tensors are input slots, anything else is guarded by value
            _C.replay_walk_state(g["params"], opt.state, self.sig, self.kinds, self.owners, self.keys,
                                 self.tensors, XlaTensor, _state_value)


def _state_value(v):
    """An optimizer state entry that is not an xla tensor, as the signature holds it."""
    if isinstance(v, torch.Tensor):  # a host value (SGD-style step counts): guarded
        return (v.dtype, tuple(v.reshape(-1).tolist()) if v.numel() <= 16 else id(v))
    return v if isinstance(v, SCALARS) else id(v)


def captured(fn):
    """(name, value) of the globals and closure variables fn's own code reads."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    out = []
    g = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in g:
            out.append((name, g[name]))
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            out.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    return out


_ARG_WHERE = []  # ("a", i) for i = 0, 1, ...: the owners of argument slots (shared tuples, never changed)


def _arguments(w, args, seen):
    """The positional arguments' part of the walk. A run of tensors among
    them gets its slots as value() would give each (kind _ARG, owner ("a",
    i), no key), a run at a time: a dynamo graph's arguments are hundreds of
    tensors (parameters, activations, grads, optimizer state)."""
    n = len(args)
    if len(_ARG_WHERE) < n:
        _ARG_WHERE.extend(("a", i) for i in range(len(_ARG_WHERE), n))
    start = 0
    for i, a in enumerate(args):
        if type(a) is not XlaTensor:
            _tensor_run(w, args, start, i)
            w.value(a, ("a", i), seen)
            start = i + 1
    _tensor_run(w, args, start, n)


def _tensor_run(w, args, start, end):
    if end > start:
        w.tensors.extend(args[start:end])
        w.kinds.extend(repeat(_ARG, end - start))
        w.owners.extend(_ARG_WHERE[start:end])
        w.keys.extend(repeat(None, end - start))


def walk(fn, args, kwargs, views=False, late=()) -> Walk:
    with plain_getters():
        return _walk(fn, args, kwargs, views, late)


def _walk(fn, args, kwargs, views, late):
    w = Walk(views)
    seen = set()
    mm = torch.nn.modules.module
    w.sig.append((torch.is_grad_enabled(), torch.get_float32_matmul_precision(), torch.get_default_dtype(),
                  torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"),
                  tuple(mm._global_forward_pre_hooks), tuple(mm._global_forward_hooks)))
    _arguments(w, args, seen)
    for k, a in kwargs.items():
        w.sig.append(k)
        w.value(a, ("k", k), seen)
    for name, v in captured(fn):
        if isinstance(v, (torch.Tensor, torch.nn.Module, torch.optim.Optimizer)):
            w.sig.append(name)
            w.value(v, ("g", name), seen)
        elif isinstance(v, (bool, int, float, str)):
            w.sig.append((name, type(v), v))
    for i, t in enumerate(late):  # Compiled._retry_late
        w.sig.append("late")
        w.value(t, ("late", i), seen)
    return w

