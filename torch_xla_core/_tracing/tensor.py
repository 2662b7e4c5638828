"""The xla tensor: a wrapper subclass whose payload is a C++ LazyTensor.
Every aten op on xla tensors reaches __torch_dispatch__, which is C++
(csrc/py/dispatch.cpp): it looks the overload up in the dispatch table
(_ops.HANDLERS: aten overload -> a _C.Mapping declared with _ops.mapping(),
run in C++, or a function that calls core ops; else torch._decomp's
decompositions, else a counted, warned CPU fallback) and runs it.
Also: wrapping/unwrapping, uploads, materialization (sync, to_cpu).

This module is the tracing layer (ARCHITECTURE.md, "Layers"): it knows
nothing of the layers above it. Running a graph is the execution layer's
(executor.py), which plugs its sync in here when it loads (bind_executor);
the dispatch table is the ops layer's; pickling (__reduce_ex__) is bound
by serialization.py (bind_pickling)."""
import warnings

import torch
import torch.utils._pytree as pytree
from torch.utils._mode_utils import no_dispatch

from .. import _C
from . import checks as _checks, trace_context as _trace_context
from .._runtime import dtypes as _dtypes, runtime

DEVICE = None  # torch.device("xla", 0), set by configure() (called at import: _install.py)


class _OpIds:
    def __init__(self, ids):
        self.__dict__.update(ids)


OP = _OpIds(_C.op_ids())
# The core's three ways to make values (csrc/py/wrapper.cpp): a new value,
# a view sharing a storage, an xla tensor sharing a LazyTensor's storage.
# Each comes as the xla tensor the user sees (wrapped_*) and as the bare
# LazyTensor (lazy_*), cheaper for intermediate values that only feed other ops.
# The ops layer (_ops/) and the features/kernels above build their values with these.
wrapped_op = _C.op      # (op id, operands, attrs) -> XlaTensor: a new value
wrapped_view = _C.view  # (op id, base, attrs) -> XlaTensor: a view of base, sharing its storage
wrap = _C.wrap          # LazyTensor -> XlaTensor sharing its storage


def lazy_op(op, operands, attrs=()):
    """wrapped_op's value as a LazyTensor (no wrapper): for intermediate values."""
    return _C.op(op, operands, attrs, True)


def lazy_view(op, base, attrs=()):
    """wrapped_view's value as a LazyTensor."""
    return _C.view(op, base, attrs, True)


_make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
_TENSOR_DATA = torch._C.TensorBase.data
_TORCH = _dtypes.TORCH

# The core's device numbers besides a device's index (csrc/ir/node.h):
ANY_DEVICE = _C.ANY_DEVICE    # a value that joins a graph on any device: Python numbers, constants, the RNG state
ALL_DEVICES = _C.ALL_DEVICES  # a GraphCut over every device's values (a sync of all live tensors)


class XlaTensor(torch.Tensor):
    """A tensor on the xla device. Its value is traced lazily (see _lt)."""

    __slots__ = ("_lt",)  # the core's LazyTensor: a slot is quicker to set and read than __dict__
    __torch_function__ = torch._C._disabled_torch_function_impl

    # __torch_dispatch__(func, types, args, kwargs): _ops.HANDLERS[func](*args, **kwargs)
    # (a Mapping runs in C++); a builtin, so no Python frame per op.
    __torch_dispatch__ = staticmethod(_C.torch_dispatch)

    def __repr__(self, *, tensor_contents=None):
        cpu = to_cpu(self)
        s = torch._tensor_str._str(cpu)
        extra = f", device='{self.device}'"
        if self.grad_fn is not None:
            extra += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            extra += ", requires_grad=True"
        return s[:-1] + extra + ")"

    def __format__(self, format_spec):
        # as torch.Tensor.__format__ (which formats only its own class's 0-d
        # tensors): a 0-d tensor formats as its Python number
        if self.dim() == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def tolist(self):
        return to_cpu(self).tolist()

    # `t.data = other` (and Module._apply's `param.data = fn(param)`, as in
    # `model.to(dev).bfloat16()`): torch's setter swaps the TensorImpl's
    # metadata (shape, dtype, storage); the payload lives in _lt, which must
    # follow, or the tensor would keep its old value under the new metadata.
    @property
    def data(self):
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new):
        _TENSOR_DATA.__set__(self, new)  # torch's checks (same device type, ...) and metadata
        self._lt = new._lt  # now an alias of new, as torch's set_data makes it

    def numpy(self, *, force=False):
        if self.requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use tensor.detach().numpy() instead.")
        return to_cpu(self).numpy()


def core_operand(x):
    """The core operand for x: a LazyTensor, a Python number, or (number, dtype)
    for a 0-d CPU tensor."""
    if type(x) is XlaTensor:
        return x._lt
    if isinstance(x, XlaTensor):
        return x._lt
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.device.type == "cpu":
            try:
                return (x.item(), _dtypes.code(x.dtype))
            except _dtypes.UnsupportedDtype as e:  # RuntimeError: torch's operators swallow TypeError
                raise RuntimeError(str(e.at("a 0-d CPU tensor operand"))) from None
        raise device_error(x)
    return x


def device_error(other: torch.Tensor) -> RuntimeError:
    """torch's error for an op over an xla tensor and `other` (on another device)."""
    return RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                        f"{DEVICE} and {other.device}! Move the tensor with .to('xla').")


def device_mismatch(args, kwargs):
    """For a handler that failed with AttributeError (it read `_lt` of a tensor
    that is not an xla tensor; called from C++): the device error, or None."""
    for a in list(args) + list((kwargs or {}).values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and not isinstance(t, XlaTensor):
                return device_error(t)
    return None


def _operand_fallback(x):
    """Core operand for what the core does not take directly (called from C++)."""
    r = core_operand(x)
    if r is x:
        raise TypeError(f"unsupported operand of type {type(x).__name__} for an xla op")
    return r


def configure(device) -> None:
    global DEVICE
    DEVICE = device
    _C.configure_wrapper(XlaTensor, _make_wrapper_subclass, list(_TORCH), device, _operand_fallback)


# --- the execution layer's hooks ---------------------------------------------
_sync = None         # executor.sync(lts, wait): runs pending graphs
_use_devices = None  # _use_devices(): a value lives on a device other than xla:0
_recording = None    # executor.recording_session(): a txc.compile recording under way, which sees host reads
                     # and uploads (replay/_session.py), or None


def bind_executor(sync, use_devices, recording_session) -> None:
    """Called by executor.py when it loads: how this layer runs graphs, and
    how it finds a txc.compile recording under way."""
    global _sync, _use_devices, _recording
    _sync, _use_devices, _recording = sync, use_devices, recording_session


def bind_pickling(reduce_ex, deepcopy, copy) -> None:
    """Called by serialization.py when it installs: XlaTensor's pickling
    (torch.save, pickle), copy.deepcopy and copy.copy, which belong to the
    features layer above this one."""
    XlaTensor.__reduce_ex__, XlaTensor.__deepcopy__, XlaTensor.__copy__ = reduce_ex, deepcopy, copy


def op(name: str, *operands, attrs=()) -> XlaTensor:
    """Applies core op `name`; returns the wrapped result."""
    return wrapped_op(getattr(OP, name), operands, attrs)


def from_cpu(t: torch.Tensor, device_index: int = 0, user: bool = False) -> XlaTensor:
    """Uploads a CPU tensor to xla device `device_index` (ANY_DEVICE: device 0,
    as a value that may join a graph on any device, such as the RNG state); the
    result is device data (a graph parameter). user: the user's own data
    (`cpu_tensor.to("xla")`, `torch.tensor(..., device="xla")`), not a value
    an op handler derived from shapes, numbers or values read (a recording
    of txc.compile tells them apart: replay/_session.py)."""
    code = _dtypes.code(t.dtype)
    if device_index > 0:
        _use_devices()
    buf = runtime.to_device(t, max(device_index, 0))
    session = _recording()
    if session is not None:
        session.upload(t, buf, user)
    return wrap(_C.from_data(buf, code, list(t.shape), device_index))


def index_of(t: XlaTensor) -> int:
    """The xla device index of an xla tensor."""
    return t.device.index or 0


def place_on(t: XlaTensor, device_index) -> XlaTensor:
    """A factory's fresh result (made without a device) on xla device
    `device_index` (None: left free to join any device's graph)."""
    if device_index is None:
        return t
    _C.place_on(t._lt, device_index)
    if not device_index:
        return t  # its wrapper already says xla:0
    _use_devices()
    return wrap(t._lt)


def move(t: XlaTensor, device_index: int) -> XlaTensor:
    """A copy of t on xla device `device_index` (its value is computed first
    if pending); t itself when it is there already."""
    if index_of(t) == device_index:
        return t
    _use_devices()
    buf = runtime.move(materialize(t), device_index)
    return wrap(_C.from_data(buf, _dtypes.code(t.dtype), list(t.shape), device_index))


def sync_lazy(lts=None, wait=False) -> None:
    """Computes the pending values of the given LazyTensors' storages (default:
    every live one): torch_xla_core/_execution/executor.py. Refused inside a scan body
    being traced (_trace_context)."""
    _trace_context.check_sync()
    _sync(lts, wait)


def whole_storage(t: XlaTensor):
    """t's storage as a LazyTensor when t is all of it (itself or aliases of
    it, as nn.Parameter makes), else None."""
    lt = t._lt
    if not lt.is_view:
        return lt
    return lt.root() if all(v == "alias" for v in lt.view_ops) else None


def storage_buffer(t: XlaTensor):
    """The device buffer of t's value: its storage's own when t is all of a
    computed storage (no copy, no launch), else materialize(t)."""
    if not isinstance(t, XlaTensor):
        raise ValueError(f"expected an xla tensor, got a tensor on {t.device}")
    lt = whole_storage(t)
    if lt is not None and lt.is_data:
        return lt.data
    return materialize(t)


def materialize(t: XlaTensor):
    """The device buffer holding t's current value (computing it if pending)."""
    session = _recording()
    if session is not None:
        return session.read(t)
    lt = t._lt
    if lt.is_data:
        _checks.verify()  # a value is read: checks computed with it raise now (as a sync would)
        return lt.data
    if lt.is_view:
        lt = lazy_op(OP.alias, (lt,), ())  # a storage of its own holding the view's value
    sync_lazy([lt], wait=True)
    return lt.data


def to_cpu(t: XlaTensor) -> torch.Tensor:
    buf = materialize(t)
    r = runtime.to_host(buf)
    s = getattr(buf, "sharding", None)
    if r.shape != t.shape and s is not None and len(s.device_set) > 1:
        r = r[tuple(slice(0, n) for n in t.shape)]  # laid out unevenly over a mesh: padded (sharding.py)
    return r


def set_meta(t: XlaTensor, shape, stride=None, storage_offset=0) -> None:
    """Changes a tensor's shape, strides (default: contiguous) and storage
    offset in place (t_, squeeze_, as_strided_, resize_, out= and friends);
    the caller sets t._lt to a value that has them."""
    with no_dispatch():
        # Taking a fresh wrapper's metadata (torch's .data setter, not
        # XlaTensor.data's, which would take its missing _lt too) works for
        # any size: the wrapper's placeholder storage is too small for
        # as_strided_ to grow.
        if stride is None:
            meta = _make_wrapper_subclass(XlaTensor, list(shape), dtype=t.dtype, device=t.device)
        else:
            meta = _make_wrapper_subclass(XlaTensor, list(shape), list(stride), storage_offset, dtype=t.dtype, device=t.device)
        _TENSOR_DATA.__set__(t, meta)


def note_op(inputs, outputs) -> None:
    """For ops that build IR without an aten call (kernels.call_jax): lets a
    body trace under way (a scan body: _trace_context) see the xla tensors
    they read and make, as its dispatch mode sees aten ops' (so closed-over
    weights become captures with gradients)."""
    trace = _trace_context.current()
    if trace is not None:  # the innermost trace (an enclosing one sees the whole loop as one op)
        trace.mode.see_inputs(xla_leaves(inputs))
        trace.mode.see_outputs(xla_leaves(outputs))


def xla_leaves(tree) -> list:
    """The xla tensors among a pytree's leaves."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, XlaTensor)]


_warned = set()


def warn_once(key, msg) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(msg, stacklevel=3)
