"""Reduction aten ops -> core reductions (csrc/ops/reduce.cpp)."""
import torch
from torch._decomp import decomposition_table

from .._runtime import torch_compat as _compat
from .._runtime.dtypes import code
from .._tracing.tensor import OP, wrapped_op
from . import XLA, Arg, aten, impl, mapping


def _axes(x, dim):
    """dim as a list (None: []); a dim out of range is torch's IndexError
    (norm(p=0, dim=3) sums over dim 3). The core normalizes the rest
    (None/[] = all, negatives, order)."""
    axes = [] if dim is None else [dim] if isinstance(dim, int) else dim
    r = max(x.dim(), 1)
    for d in axes:
        if not -r <= d < r:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {d})")
    return axes


def _check_dims(x, dim=None, *args, **kwargs):
    """A sum mapping's check: words a refused dim as torch does."""
    _axes(x, dim)


def _reduce(name, x, dim, keepdim, dtype=None, extra=()):
    axes = _axes(x, dim)
    if name in ("sum", "mean", "prod"):
        return wrapped_op(getattr(OP, name), (x,), (axes, bool(keepdim), code(dtype) if dtype is not None else -1))
    return wrapped_op(getattr(OP, name), (x,), (axes, bool(keepdim)) + extra)


@impl(aten.sum.default)
def sum_(x, *, dtype=None):
    return _reduce("sum", x, None, False, dtype)


# sum over dims: attributes (dims, keepdim, dtype code -1: the default); its
# handler takes dtype= and dim=None.
mapping(aten.sum.dim_IntList, op="sum", ranks=(XLA,), attrs=(Arg("dim"), Arg("keepdim"), -1), check=_check_dims)


@impl(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return _reduce("sum", x, dim, keepdim, dtype)


@impl(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    return _reduce("mean", x, dim, keepdim, dtype)


@impl(aten.prod.default, aten.prod.dim_int)
def prod(x, dim=None, keepdim=False, *, dtype=None):
    return _reduce("prod", x, dim, keepdim, dtype)


# Reductions without an identity (max, min, argmax, ...) refuse an empty
# reduced dim as torch does: IndexError naming the dim, or, for a reduction
# over all dims of an empty tensor, an error asking for a dim.
def _no_identity(name, x, dim, normalize=True):
    """dim: None or [] (all dims), an int, or a list of ints (as given)."""
    dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
    rank = x.dim()
    if not dims:
        if x.numel() != 0:
            return
        if name in ("argmax", "argmin"):
            raise IndexError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0.")
        raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                           f"Specify the reduction dim with the 'dim' argument.")
    r = max(rank, 1)
    for d in dims:
        if not -r <= d < r:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {d})")
        if rank and x.shape[d] == 0:
            shown = d % rank if normalize else d
            raise IndexError(f"{name}{'' if name == 'aminmax' else '()'}: Expected reduction dim {shown} "
                             f"to have non-zero size.")


def _empty_complex(name, x, dim, keepdim):
    """amax/amin of a complex tensor with no elements: CPU returns the empty
    result (its complex refusal is in the kernel, which never runs; case
    1:6785); None for any other input."""
    if not (x.is_complex() and x.numel() == 0):
        return None
    shape = _reduce(name, torch.real(x), dim, keepdim).shape
    return wrapped_op(OP.full, (), (0.0, code(x.dtype), list(shape)))


@impl(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    _no_identity("amax", x, dim, normalize=False)
    r = _empty_complex("amax", x, dim, keepdim)
    return _reduce("amax", x, dim, keepdim) if r is None else r


@impl(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    _no_identity("amin", x, dim, normalize=False)
    r = _empty_complex("amin", x, dim, keepdim)
    return _reduce("amin", x, dim, keepdim) if r is None else r


@impl(aten.max.default)
def max_(x):
    _no_identity("max", x, None)
    return _reduce("amax", x, None, False)


@impl(aten.min.default)
def min_(x):
    _no_identity("min", x, None)
    return _reduce("amin", x, None, False)


@impl(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    if dim is None and x.numel() == 0:
        raise RuntimeError("aminmax(): cannot compute aminmax over an empty dimension as the operation "
                           "has no identity.")
    _no_identity("aminmax", x, dim)
    if dim is not None and x.dim() == 0:
        dim = None  # a 0-d input reduces nothing (dim 0 or -1)
    return _reduce("amin", x, dim, keepdim), _reduce("amax", x, dim, keepdim)


def _arg(name, x, dim, keepdim):
    _no_identity(name, x, dim)
    if dim is None:
        flat = wrapped_op(OP.reshape, (x._lt,), ([x.numel()],))
        r = wrapped_op(getattr(OP, name), (flat._lt,), (0, False))
        if keepdim:
            r = wrapped_op(OP.reshape, (r._lt,), ([1] * x.dim(),))
        return r
    if x.dim() == 0:
        return wrapped_op(OP.full, (), (0.0, code(torch.int64), []))
    return wrapped_op(getattr(OP, name), (x._lt,), (dim % x.dim(), bool(keepdim)))


@impl(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    _refused_input("argmax", x)
    return _arg("argmax", x, dim, keepdim)


@impl(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    _refused_input("argmin", x)
    return _arg("argmin", x, dim, keepdim)


def _refused_input(name, x, bool_ok=False):
    """CPU's checks of argmax/argmin and max/min over a dim, before any other (cases 1:634, 1:927; complex:
    RuntimeError, as CPU's; amax/amin and max/min of all elements raise NotImplementedError, from the core)."""
    if x.dtype == torch.bool and not bool_ok:
        raise RuntimeError(f"{name}(): does not support bool input: convert it to an integer dtype first")
    if x.dtype.is_complex:
        raise RuntimeError(f"{name}(): does not support complex input")


@impl(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    _no_identity("max", x, dim)  # an empty dim first, then the dtype, as CPU (case 1:8013)
    _refused_input("max", x, bool_ok=True)
    return _reduce("amax", x, dim, keepdim), _arg("argmax", x, dim, keepdim)


@impl(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    _no_identity("min", x, dim)
    _refused_input("min", x, bool_ok=True)
    return _reduce("amin", x, dim, keepdim), _arg("argmin", x, dim, keepdim)


def _uint8_kept(r, x):
    """any/all of a uint8 tensor are uint8 (0/1) in torch, a legacy rule; bool for every other dtype."""
    return r.to(torch.uint8) if x.dtype == torch.uint8 else r


@impl(aten.any.default, aten.any.dim, aten.any.dims)
def any_(x, dim=None, keepdim=False):
    return _uint8_kept(_reduce("any", x, dim, keepdim), x)


@impl(aten.all.default, aten.all.dim, aten.all.dims)
def all_(x, dim=None, keepdim=False):
    return _uint8_kept(_reduce("all", x, dim, keepdim), x)


# torch.distributions' argument checks: a bool 0-d tensor (the caller's `if` reads it)
impl(aten._is_all_true.default)(lambda x: all_(x))
impl(aten._is_any_true.default)(lambda x: any_(x))


@impl(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    if not (x.dtype.is_floating_point or x.dtype.is_complex):  # CPU eager's check and error type (by torch version)
        raise _compat.STD_VAR_DTYPE_ERROR("std and var only support floating point and complex dtypes")
    c = 1.0 if correction is None else float(correction)
    return _reduce("var", x, dim, keepdim, extra=(c,))


@impl(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return wrapped_op(OP.sqrt, (var(x, dim, correction=correction, keepdim=keepdim)._lt,), ())


@impl(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return var(x, dim, correction=correction, keepdim=keepdim), _reduce("mean", x, dim, keepdim)


_NANSUM = decomposition_table[aten.nansum.default]


@impl(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    """torch's decomposition, but complex inputs refused as torch's kernels refuse them (case 1:2909)."""
    if x.is_complex():
        raise RuntimeError("nansum does not support complex inputs (torch's CPU and CUDA kernels refuse them "
                           "too): use torch.where(z.isnan(), 0, z).sum()")
    return _NANSUM(x, dim, keepdim, dtype=dtype)
