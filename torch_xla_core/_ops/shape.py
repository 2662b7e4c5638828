"""View and shape aten ops. Views share their base's storage in the core
(csrc/trace/tensor.h), so in-place writes through them reach the base; their
wrappers carry torch's strides and storage offset (computed by the core from
the view chain), so torch's contiguous()/reshape() copy where CPU's do.
as_strided indexes the whole storage, as on CPU."""
import functools

import torch

from .._tracing import tensor as _tensor
from .._tracing.tensor import OP, XlaTensor, wrapped_op, lazy_view, wrapped_view, wrap
from . import XLA, Arg, aten, code, convert, impl, mapping, type_name
from .complex import root_as


def _dim(d, rank):
    r = max(rank, 1)
    if not -r <= d < r:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {d})")
    return d % r


def reshape_view(x, shape):
    """x reshaped: a view where strides allow it, else (internal callers) a copy."""
    return wrapped_view(OP.reshape, x._lt, (shape,))


# A view torch's strides cannot express (the core would copy) is not the
# mapping's call: view's handler raises, reshape's copies.
mapping(aten.view.default, aten._unsafe_view.default, aten.reshape.default, op="reshape", operands=(0,),
        ranks=(XLA,), attrs=(Arg(1),), view=True)


@impl(aten.view.default)
def view(x, size):
    r = wrapped_view(OP.reshape, x, (size,))  # the core infers a -1
    if x._lt.is_view and not r._lt.is_view:  # the core copied: strides do not allow a view
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                           "dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
    return r


@impl(aten._unsafe_view.default, aten.reshape.default, aten._reshape_alias.default)
def reshape(x, size, *_stride):
    return wrapped_view(OP.reshape, x, (size,))  # a copy where strides do not allow a view


@impl(aten.view.dtype)
def view_dtype(x, dtype):
    """x's bytes read as dtype: a view (core op bitcast); element sizes may
    differ, under torch's conditions on the last dim, strides and offset."""
    if dtype == x.dtype:
        return wrapped_view(OP.alias, x._lt, ())
    if x.is_complex() or dtype.is_complex:
        raise NotImplementedError(f"view(dtype={dtype}) of a {x.dtype} xla tensor: bitcasts from or to complex "
                                  f"dtypes are not supported (StableHLO's bitcast_convert takes no complex type); "
                                  f"use torch.view_as_real / view_as_complex")
    a, b = x.element_size(), torch.empty((), dtype=dtype).element_size()
    if a != b:
        what = f"to view {type_name(x.dtype)} as {type_name(dtype)} (different element sizes)"
        if x.dim() == 0:
            raise RuntimeError(f"self.dim() cannot be 0 {what}")
        if x.stride(-1) != 1:
            raise RuntimeError(f"self.stride(-1) must be 1 {what}, but got {x.stride(-1)}")
        if a < b:
            k = b // a
            if x.shape[-1] % k:
                raise RuntimeError(f"self.size(-1) must be divisible by {k} {what}, but got {x.shape[-1]}")
            if x.storage_offset() % k:
                raise RuntimeError(f"self.storage_offset() must be divisible by {k} {what}, but got "
                                   f"{x.storage_offset()}")
            for i in range(x.dim() - 1):
                if x.stride(i) % k:
                    raise RuntimeError(f"self.stride({i}) must be divisible by {k} {what}, but got {x.stride(i)}")
    return wrapped_view(OP.bitcast, x._lt, (code(dtype),))


alias = mapping(aten.alias.default, aten.detach.default, aten.lift_fresh.default, op="alias", ranks=(XLA,),
                view=True)


@impl(aten.permute.default)
def permute(x, dims):
    r = x.dim()
    return wrapped_view(OP.permute, x._lt, ([_dim(d, r) for d in dims],))


mapping(aten.t.default, op="permute", ranks=(2,), attrs=([1, 0],), view=True)


@impl(aten.t.default, aten.numpy_T.default)
def t(x):
    if x.dim() > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {x.dim()}D")
    if x.dim() < 2:
        return alias(x)
    return wrapped_view(OP.permute, x._lt, ([1, 0],))


@impl(aten.transpose.int)
def transpose(x, d0, d1):
    r = x.dim()
    if r == 0:
        return alias(x)
    p = list(range(r))
    d0, d1 = _dim(d0, r), _dim(d1, r)
    p[d0], p[d1] = p[d1], p[d0]
    return wrapped_view(OP.permute, x._lt, (p,))


@impl(aten.expand.default)
def expand(x, size, *, implicit=False):
    size = list(size)
    off = len(size) - x.dim()
    if off < 0:
        raise RuntimeError(f"expand: the number of sizes provided ({len(size)}) must be greater or equal to "
                           f"the number of dimensions in the tensor ({x.dim()})")
    for i, s in enumerate(size):
        if s == -1:
            if i < off:
                raise RuntimeError("expand: -1 is not allowed in a leading, non-existing dimension")
            size[i] = x.shape[i - off]
    if size == list(x.shape):
        return alias(x)
    return wrapped_view(OP.expand, x._lt, (size,))


@impl(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def squeeze(x, dim=None):
    r = x.dim()
    if dim is None:
        dims = set(range(r))
    elif isinstance(dim, int):
        dims = {_dim(dim, r)}
    else:
        dims = {_dim(d, r) for d in dim}
    keep = [i for i, s in enumerate(x.shape) if not (i in dims and s == 1)]
    return wrapped_view(OP.reshape, x._lt, ([x.shape[i] for i in keep], keep))  # keep: torch's strides


@impl(aten.unsqueeze.default)
def unsqueeze(x, dim):
    d = _dim(dim, x.dim() + 1)
    shape = list(x.shape)
    shape.insert(d, 1)
    return wrapped_view(OP.reshape, x._lt, (shape, d))  # d: torch's strides for the new dim


@impl(aten.select.int)
def select(x, dim, index):
    if x.dim() == 0:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    d = _dim(dim, x.dim())
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(x.shape)} at dimension {dim}")
    return wrapped_view(OP.select, x._lt, (d, index % n))


def _slice_bounds(n, start, end, step):
    start = 0 if start is None else start
    end = n if end is None else end
    if start < 0:
        start += n
    if end < 0:
        end += n
    start = min(max(start, 0), n)
    end = min(max(end, start), n)
    return start, end


@impl(aten.slice.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    d = _dim(dim, x.dim())
    if step <= 0:
        raise ValueError("slice step must be positive")
    s, e = _slice_bounds(x.shape[d], start, end, step)
    if s == 0 and e == x.shape[d] and step == 1:
        return alias(x)
    return wrapped_view(OP.slice, x._lt, (d, s, e, step))


@impl(aten.narrow.default)
def narrow(x, dim, start, length):
    return slice_(x, dim, start, start + length)


@impl(aten.split.Tensor)
def split(x, split_size, dim=0):
    d = _dim(dim, x.dim())
    n = x.shape[d]
    if n == 0:
        return [alias(x)]
    return [slice_(x, d, i, min(i + split_size, n)) for i in range(0, n, max(split_size, 1))]


@impl(aten.split_with_sizes.default)
def split_with_sizes(x, sizes, dim=0):
    d = _dim(dim, x.dim())
    if sum(sizes) != x.shape[d]:
        raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {x.shape[d]} "
                           f"(input tensor's size at dimension {d}), but got split_sizes={list(sizes)}")
    out, i = [], 0
    for s in sizes:
        out.append(slice_(x, d, i, i + s))
        i += s
    return out


@impl(aten.unbind.int)
def unbind(x, dim=0):
    d = _dim(dim, x.dim())
    return [select(x, d, i) for i in range(x.shape[d])]


@impl(aten.cat.default)
def cat(tensors, dim=0):
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    # 1-d empty tensors are skipped (torch's legacy rule) but still promote the result's dtype (case 1:2625)
    ts = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)]
    dt = functools.reduce(torch.promote_types, (t.dtype for t in tensors)) if len(ts) < len(tensors) else None
    if not ts:
        return convert(alias(tensors[0]), dt)  # (all skipped: dt is set)
    d = _dim(dim, ts[0].dim())
    if len(ts) == 1:
        r = wrapped_op(OP.alias, (ts[0]._lt,), ())
    else:
        r = wrapped_op(OP.concat, tuple(_tensor.core_operand(t) for t in ts), (d,))
    return r if dt is None else convert(r, dt)


@impl(aten.stack.default)
def stack(tensors, dim=0):
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at "
                               f"entry 0 and {list(t.shape)} at entry {i}")
    d = _dim(dim, tensors[0].dim() + 1)
    return cat([unsqueeze(t, d) for t in tensors], d)


@impl(aten.constant_pad_nd.default)
def constant_pad_nd(x, pad, value=0):
    r = x.dim()
    if len(pad) % 2 or len(pad) // 2 > r:
        raise RuntimeError(f"constant_pad_nd: padding length must be divisible by 2 and at most twice the "
                           f"number of dims ({r}); got {len(pad)}")
    lo, hi = [0] * r, [0] * r
    for i in range(len(pad) // 2):
        lo[r - 1 - i], hi[r - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if isinstance(value, complex):  # the imaginary part rides as a 4th attribute
        return wrapped_op(OP.pad, (x._lt,), (lo, hi, value.real, value.imag))
    return wrapped_op(OP.pad, (x._lt,), (lo, hi, float(value)))


@impl(aten.flip.default)
def flip(x, dims):
    ds = [_dim(d, x.dim()) for d in dims]
    for i, d in enumerate(ds):
        if d in ds[:i]:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
    return wrapped_op(OP.flip, (x._lt,), (ds if x.dim() else [],))  # a 0-d tensor: dim 0 or -1 flips nothing


@impl(aten.slice_scatter.default)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    d = _dim(dim, x.dim())
    s, e = _slice_bounds(x.shape[d], start, end, step)
    return wrapped_op(OP.slice_scatter, (x._lt, convert(src, x.dtype)._lt), (d, s, e, step))


@impl(aten.select_scatter.default)
def select_scatter(x, src, dim, index):
    d = _dim(dim, x.dim())
    shape = list(x.shape)
    shape[d] = 1
    src = wrapped_op(OP.reshape, (convert(src, x.dtype)._lt,), (shape,))
    i = index % x.shape[d]
    return wrapped_op(OP.slice_scatter, (x._lt, src._lt), (d, i, i + 1, 1))


@impl(aten.as_strided.default)
def as_strided(x, size, stride, storage_offset=None):
    off = x.storage_offset() if storage_offset is None else storage_offset
    if len(size) != len(stride):
        raise RuntimeError(f"as_strided: mismatch in length of strides and shape ({list(size)} vs {list(stride)})")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"as_strided: Negative strides are not supported at the moment, got strides: "
                           f"{list(stride)}")
    # Over the whole storage (x may be a view into it), as CPU's as_strided.
    return wrap(lazy_view(OP.as_strided, root_as(x._lt, x.dtype), (list(size), list(stride), off)))


@impl(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    # CPU: as_strided of a (contiguous) clone of x, overwritten with src.
    off = 0 if storage_offset is None else storage_offset
    src = convert(src, x.dtype)
    if tuple(src.shape) != tuple(size):
        src = expand(src, list(size))
    return wrapped_op(OP.as_strided_scatter, (x._lt, src._lt), (list(size), list(stride), off))


# In-place metadata changes: the wrapper's shape and strides change, and its
# value becomes a view of what it was.
def _inplace_view(fn):
    def h(x, *args, **kwargs):
        r = fn(x, *args, **kwargs)
        _tensor.set_meta(x, r.shape, r.stride(), r.storage_offset())
        x._lt = r._lt
        return x
    return h


impl(aten.t_.default)(_inplace_view(t))
impl(aten.transpose_.default)(_inplace_view(transpose))
impl(aten.squeeze_.default, aten.squeeze_.dim, aten.squeeze_.dims)(_inplace_view(squeeze))
impl(aten.unsqueeze_.default)(_inplace_view(unsqueeze))
impl(aten.as_strided_.default)(_inplace_view(as_strided))


# set_(source): self becomes an alias of source (its storage, shape, strides);
# set_(): an empty tensor. (The CPU fallback would have broken the aliasing.)
@impl(aten.set_.source_Tensor)
def set_source(x, src):
    if not isinstance(src, XlaTensor):
        raise RuntimeError(f"set_: expected source on {x.device}, got a tensor on {src.device}")
    if src.dtype != x.dtype:
        raise RuntimeError(f"set_: could not set a {x.dtype} tensor to a {src.dtype} source (the dtypes must match)")
    _tensor.set_meta(x, src.shape, src.stride(), src.storage_offset())
    x._lt = src._lt
    return x


@impl(aten.set_.default)
def set_empty(x):
    _tensor.set_meta(x, (0,))
    x._lt = torch.empty(0, dtype=x.dtype, device=x.device)._lt
    return x
