"""Assorted aten ops built from core ops through ordinary torch calls on xla
tensors: take / put (flat indexing), index_reduce, allclose, resize_,
_efficientzerotensor (autograd's zero gradients), the functional copy and
repeat_interleave with a known output_size (without one, its shape depends
on the repeats' values: a counted CPU fallback); _has_same_storage_numel
(forward-mode AD's check when it makes a dual tensor: storage metadata).

take/put index the flattened tensor, negative indices wrapping; indices out
of range raise torch's error at the sync (the deferred checks of
index/index_put). index_reduce is scatter_reduce with the index spread along
`dim`."""
import torch

from .._tracing import checks as _checks, tensor as _tensor
from . import aten, fallback, impl, type_name
from .factory import register
from .elementwise import copy_


# ---- take / put ---------------------------------------------------------------

@impl(aten.take.default)
def take(x, index):
    if index.dtype != torch.int64:
        raise RuntimeError(f"take(): Expected a long tensor for index, but got {index.dtype}")
    if x.numel() == 0:
        if index.numel():
            raise IndexError("take(): tried to take from an empty tensor")
        return torch.zeros(index.shape, dtype=x.dtype, device=x.device)
    return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)


@impl(aten.put.default)
def put(x, index, source, accumulate=False):
    if index.dtype != torch.int64:
        raise RuntimeError(f"put(): Expected a long tensor for index, but got {index.dtype}")
    if source.dtype != x.dtype:
        raise RuntimeError(f"put(): self ({x.dtype}) and source ({source.dtype}) must have the same scalar type")
    if index.numel() != source.numel():
        raise RuntimeError(f"put(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")
    if index.numel() == 0:
        return x.clone()
    if x.numel() == 0:
        raise IndexError("put(): tried to put into an empty tensor")
    flat = x.reshape(-1).index_put((index.reshape(-1),), source.reshape(-1), accumulate=accumulate)
    return flat.reshape(x.shape)


# ---- index_reduce -------------------------------------------------------------

@impl(aten.index_reduce.default)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if reduce not in ("prod", "mean", "amax", "amin"):
        raise RuntimeError(f"index_reduce(): Expected reduce to be one of prod, mean, amax or amin but got "
                           f"{reduce}.")
    if index.dim() > 1:
        raise IndexError("index_reduce_(): Index is supposed to be a vector")
    if not x.is_floating_point() and reduce == "mean":
        raise NotImplementedError("index_reduce(reduce='mean') of integer tensors is not supported on the xla "
                                  "device (torch rounds with floor division)")
    if x.dim() == 0:
        return index_reduce(x.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce,
                            include_self=include_self).reshape(())
    d = dim % x.dim()
    src = source if source.dim() else source.reshape(1)
    shape = [1] * src.dim()
    shape[d] = -1
    idx = index.reshape(-1).reshape(shape).expand(src.shape)
    return x.scatter_reduce(d, idx, src, reduce, include_self=include_self)


# ---- allclose ------------------------------------------------------------------

@impl(aten.allclose.default)
def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    if a.dtype != b.dtype:
        raise RuntimeError(f"{type_name(a.dtype)} did not match {type_name(b.dtype)}")
    return bool(torch.isclose(a, b, rtol, atol, equal_nan).all().item())


# ---- resize_ --------------------------------------------------------------------

def resized(x, shape):
    """x's value laid out as `shape`: the leading elements in order, zeros past
    the end (torch leaves new elements uninitialized)."""
    shape = [int(s) for s in shape]
    n = 1
    for s in shape:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {shape}")
        n *= s
    flat = x.reshape(-1)
    if n < flat.numel():
        flat = flat[:n]
    elif n > flat.numel():
        flat = torch.cat([flat, torch.zeros(n - flat.numel(), dtype=x.dtype, device=x.device)])
    return flat.reshape(shape)


@impl(aten.resize_.default)
def resize_(x, size, *, memory_format=None):
    if tuple(size) == tuple(x.shape):
        return x
    r = resized(x, size)
    _tensor.set_meta(x, r.shape)
    x._lt = r._lt
    return x


@impl(aten.resize_as_.default)
def resize_as_(x, other, *, memory_format=None):
    return resize_(x, other.shape)


# ---- zero tensors ------------------------------------------------------------------

def _zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # autograd's "known zero" gradients (sgn, ...): plain zeros on the device
    return torch.zeros(size, dtype=dtype if dtype is not None else torch.get_default_dtype(),
                       device=device if device is not None else "xla")


register("_efficientzerotensor", _zeros)


# ---- functional copy ------------------------------------------------------------------

@impl(aten.copy.default)
def copy(x, src, non_blocking=False):
    """x's shape, dtype and device holding src's values (torch's decompositions
    emit it, e.g. linspace with tensor bounds)."""
    if isinstance(x, _tensor.XlaTensor):
        return copy_(x.clone(), src)
    return x.clone().copy_(_tensor.to_cpu(src) if isinstance(src, _tensor.XlaTensor) else src)


# ---- repeat_interleave -------------------------------------------------------------

_repeat_fallback = None


@impl(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size=None):
    """Index i repeated repeats[i] times: position j holds the number of
    running totals of repeats that are <= j."""
    global _repeat_fallback
    if repeats.dim() > 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if output_size is None:  # the length is the repeats' sum: data-dependent
        if _repeat_fallback is None:
            _repeat_fallback = fallback(aten.repeat_interleave.Tensor)
        return _repeat_fallback(repeats)
    if repeats.dtype not in (torch.int32, torch.int64):
        raise RuntimeError("repeats has to be Long or Int tensor")
    _checks.require((repeats < 0)._lt, "repeat_interleave: repeats can not be negative", RuntimeError)
    total = torch.cumsum(repeats.to(torch.int64), 0)
    if repeats.numel():
        _checks.require((total[-1] != int(output_size))._lt, "repeat_interleave: allocated size does not match "
                        "required size (output_size must be the sum of repeats)", RuntimeError)
    pos = torch.arange(int(output_size), dtype=torch.int64, device=repeats.device)
    return (total.unsqueeze(0) <= pos.unsqueeze(1)).sum(1)


# ---- storage metadata -----------------------------------------------------------

@impl(aten._has_same_storage_numel.default)
def _has_same_storage_numel(a, b):
    """as ATen: the storages hold the same number of elements of each tensor's dtype (no data read)."""
    return a.untyped_storage().nbytes() // a.element_size() == b.untyped_storage().nbytes() // b.element_size()
