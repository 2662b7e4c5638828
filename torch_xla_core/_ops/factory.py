"""Tensor factories. Those with a device argument and no tensor input reach
the PrivateUse1 ("xla") kernels registered here; *_like and new_* reach
__torch_dispatch__ like any op."""
import functools
import math

import torch
from torch._decomp import decomposition_table

from .._runtime import torch_compat as _compat
from .._tracing import device as _device, tensor as _tensor
from .._runtime.dtypes import UnsupportedDtype, code
from .._tracing.tensor import OP, lazy_op, wrapped_op, wrap
from . import aten, full, impl
from .elementwise import copy_

_lib = torch.library.Library("aten", "IMPL")


def _dt(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


def _check_device(device):
    if device is not None and torch.device(device).type != "xla":
        raise RuntimeError(f"expected an xla device, got {device}")


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # The contents of an empty tensor are unspecified; zeros are the cheapest
    # well-defined choice (a constant, folded by XLA).
    return full(size, 0, _dt(dtype))


def strided(t, size, stride):
    """t (a fresh contiguous value) reporting the requested strides, as
    torch's empty_strided does; the values are unspecified either way."""
    stride = [int(s) for s in stride]
    if len(stride) != len(size):
        raise RuntimeError(f"mismatch in length of strides and shape: {len(stride)} strides for {len(size)} "
                           f"dims")
    if stride != list(t.stride()):
        lt = t._lt
        _tensor.set_meta(t, t.shape, stride)
        t._lt = lt
    return t


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return strided(full(size, 0, _dt(dtype)), size, stride)


def _full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None and isinstance(fill_value, complex):
        dtype = torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64
    if dtype is None:
        dtype = (torch.bool if isinstance(fill_value, bool) else torch.int64 if isinstance(fill_value, int)
                 else torch.get_default_dtype())
    return full(size, fill_value, dtype)


_INT64 = torch.iinfo(torch.int64)


def _arange(start, end=None, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.arange as ATen computes it. Checked on the real bounds: finite,
    a nonzero step whose sign agrees with end - start. An integer dtype takes
    its bounds and step truncated to integers (arange(-0.9, 2.1, 2, dtype=int64)
    steps from 0 by 2); its length is ceil((end - start) / step) over the real
    values ([0, 2]), except an int64 one on torch 2.11-2.13, which counts it
    over the truncated ones ([0]; _compat.ARANGE_INT64_TRUNCATED_LENGTH)."""
    if end is None:
        start, end = 0, start
    integer_args = all(isinstance(a, int) for a in (start, end, step))
    if dtype is None:
        dtype = torch.int64 if integer_args else torch.get_default_dtype()
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"arange: unsupported range: {start} -> {end}")
    if not math.isfinite(step):
        raise RuntimeError(f"arange: step must be finite but got {step}")
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError(f"arange: upper bound and lower bound inconsistent with step sign (start {start}, end "
                           f"{end}, step {step})")
    length_of = (start, end, step)
    if not (dtype.is_floating_point or dtype.is_complex):
        for x in length_of:
            if not _INT64.min <= x <= _INT64.max:
                raise RuntimeError(f"arange: value {x} cannot be converted to type int64_t without overflow")
        start, end, step = int(start), int(end), int(step)
        if integer_args or (dtype == torch.int64 and _compat.ARANGE_INT64_TRUNCATED_LENGTH):
            if step == 0:  # torch 2.11-2.13's kernel divides by it (SIGFPE)
                raise RuntimeError(f"arange: step {length_of[2]} truncates to 0 for {dtype}; step must be nonzero")
            length_of = (start, end, step)
    a, b, c = length_of
    n = max(-((a - b) // c) if all(isinstance(x, int) for x in length_of) else math.ceil((b - a) / c), 0)
    i = lazy_op(OP.iota, (), (code(dtype if dtype.is_floating_point else torch.int64), [n], 0))
    r = lazy_op(OP.add, (lazy_op(OP.mul, (i, step), ()), start), ()) if (start != 0 or step != 1) else i
    t = wrap(r)
    if t.dtype != dtype:
        t = wrapped_op(OP.convert, (t._lt,), (code(dtype),))
    return t


def _scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return full([], s, _dt(dtype))


def _named(op):
    """Decorates a factory: an unsupported dtype (complex) names `op`."""
    def deco(fn):
        @functools.wraps(fn)
        def h(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except UnsupportedDtype as e:
                raise e.at(op) from None
        return h
    return deco


def register(name, fn):
    """Registers fn as the xla (PrivateUse1) kernel of factory `name`: the
    result lies on the device asked for (an index that is no device is
    refused first), and an unsupported dtype
    (complex) is reported naming the factory."""
    named = _named("aten::" + name)(fn)

    def kernel(*args, **kwargs):
        i = _device.index(kwargs.get("device"))
        return _tensor.place_on(named(*args, **kwargs), 0 if i is None else i)
    _lib.impl(name, kernel, "PrivateUse1")


@impl(aten.linspace.default)
def linspace(start, end, steps, **kwargs):
    """torch's decomposition, with the bounds of an integer dtype truncated
    first, as ATen's kernel takes them: linspace(-3.5, 10, 6, dtype=int64)
    steps from -3 ([-3, 0, 2, 4, 7, 10])."""
    dtype = kwargs.get("dtype")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        start, end = int(start), int(end)
    return decomposition_table[aten.linspace.default](start, end, steps, **{k: v for k, v in kwargs.items() if v is not None})


def _tri_indices(fn):
    """triu_indices / tril_indices: a function of the shape alone, computed on
    the host and uploaded (a small constant)."""
    def make(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
        return _tensor.from_cpu(fn(row, col, offset, dtype=torch.int64 if dtype is None else dtype))
    return make


for _name, _fn in [
    ("triu_indices", _tri_indices(torch.triu_indices)),
    ("tril_indices", _tri_indices(torch.tril_indices)),
    ("empty.memory_format", _empty),
    ("empty_strided", _empty_strided),
    ("full", _full),
    ("arange", lambda end, **kw: _arange(0, end, 1, **kw)),
    ("arange.start", lambda start, end, **kw: _arange(start, end, 1, **kw)),
    ("arange.start_step", _arange),
    ("scalar_tensor", _scalar_tensor),
]:
    register(_name, _fn)


@impl(aten.empty_like.default, aten.zeros_like.default)
@_named("aten::empty_like")
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    if device is not None and torch.device(device).type != "xla":
        return torch.zeros(x.shape, dtype=dtype or x.dtype, device=device)
    return placed_like(full(x.shape, 0, dtype or x.dtype), x, device)


@impl(aten.ones_like.default)
@_named("aten::ones_like")
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return placed_like(full(x.shape, 1, dtype or x.dtype), x, device)


@impl(aten.full_like.default)
@_named("aten::full_like")
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return placed_like(full(x.shape, fill_value, dtype or x.dtype), x, device)


@impl(aten.new_empty.default, aten.new_zeros.default)
@_named("aten::new_empty")
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return placed_like(full(size, 0, dtype or x.dtype), x, device)


@impl(aten.new_ones.default)
@_named("aten::new_ones")
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return placed_like(full(size, 1, dtype or x.dtype), x, device)


@impl(aten.new_full.default)
@_named("aten::new_full")
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return placed_like(full(size, fill_value, dtype or x.dtype), x, device)


@impl(aten.new_empty_strided.default)
@_named("aten::new_empty_strided")
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return strided(placed_like(full(size, 0, dtype or x.dtype), x, device), size, stride)


def placed_like(r, x, device):
    """A *_like/new_* result on `device`, default x's device."""
    i = _device.index(device)
    return _tensor.place_on(r, _tensor.index_of(x) if i is None else i)


def _copy_from(src, dst, non_blocking=False):
    # Reached with the Python key excluded (e.g. torch.tensor(..., device="xla")):
    # CPU's copy_ hands the copy to the destination's backend.
    if isinstance(dst, _tensor.XlaTensor):
        return copy_(dst, src)
    dst.copy_(_tensor.to_cpu(src))
    return dst


@impl(aten._copy_from_and_resize.default)
def _copy_from_and_resize(src, dst):
    if tuple(dst.shape) != tuple(src.shape):
        _tensor.set_meta(dst, src.shape)
        if isinstance(dst, _tensor.XlaTensor):  # a fresh value of the new shape, then the copy
            dst._lt = full(src.shape, 0, dst.dtype)._lt
    return _copy_from(src, dst)


_lib.impl("_copy_from", _copy_from, "PrivateUse1")
_lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
