"""Indexing aten ops -> the core ops of csrc/ops/index.cpp: advanced indexing
(index, index_put, index_select/add/copy/fill), gather and the scatter family,
masked writes (x[mask] = v, masked_scatter), embedding's backward, cumsum and
cumprod, sort/topk, tril/triu and diagonal.

Data-dependent shapes: reading x[mask], masked_select and nonzero need the
mask's values on the host, so they materialize the mask (a sync of its graph)
and are counted as `data_dependent::<op>` in metrics. Writing through a mask
(x[mask] = v, masked_scatter, and x[mask]'s backward) stays on the device.

Index values: negative indices wrap where torch wraps them (advanced
indexing). Out-of-range indices raise torch's error: at once for host index
tensors, and for device ones at the sync that computes them (a deferred
check, see _tracing/checks.py) for index, index_put, index_select, gather, the
scatter family, index_add/copy/fill and embedding."""
import math

import torch

from .._tracing import checks as _checks, tensor as _tensor
from .. import metrics
from .._runtime.dtypes import code
from .._tracing.tensor import OP, XlaTensor, lazy_op, lazy_view, wrap, wrapped_op
from . import aten, call, impl
from .factory import full
from .dtype_rules import refusal

_INDEX_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def _dim(d, rank):
    r = max(rank, 1)
    if not -r <= d < r:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {d})")
    return d % r


def _host_nonzero(mask, op):
    """nonzero() of a mask, on the host ([n, mask.dim()] int64 CPU tensor)."""
    if isinstance(mask, XlaTensor):
        metrics.counter_add("data_dependent::" + op)
        mask = _tensor.to_cpu(mask)
    return torch.nonzero(mask)


def _index_lt(i, op=None, low=None, high=None, exc=IndexError):
    """The core operand of an integer index tensor (uploading host tensors).
    With op: indices must lie in [low, high), else exc naming op (checked on
    the host for host tensors, deferred to the sync for device ones)."""
    msg = f"{op}: index out of range: indices must lie in [{low}, {high})"
    if isinstance(i, XlaTensor):
        if op is not None:
            _checks.require(_checks.out_of_range(i._lt, low, high), msg, exc)
        return i._lt
    if op is not None and i.numel() and bool(((i < low) | (i >= high)).any()):
        raise exc(msg)
    return _tensor.from_cpu(i)._lt


def _check_mask(x, mask, d):
    for j, s in enumerate(mask.shape):
        if d + j >= x.dim() or x.shape[d + j] != s:
            raise IndexError(f"The shape of the mask {list(mask.shape)} at index {j} does not match the shape of "
                             f"the indexed tensor {list(x.shape)} at index {d + j}")


def _selects_nothing(indices) -> bool:
    """Whether integer index tensors broadcast to an empty shape (no mask
    among them): the result is empty and none of their values is used."""
    ints = [i.shape for i in indices if i is not None]
    if not ints or any(i.dtype in (torch.bool, torch.uint8) for i in indices if i is not None):
        return False
    try:
        return math.prod(torch.broadcast_shapes(*ints)) == 0
    except RuntimeError:  # shapes that do not broadcast: the core op says so
        return False


def _indices(x, indices, op):
    """aten's Optional[Tensor] index list -> (dims, index operands); boolean
    masks become their nonzero() coordinates (a host sync)."""
    n = sum(1 if i is None else max(i.dim(), 1) if i.dtype in (torch.bool, torch.uint8) else 1 for i in indices)
    if n > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()} (got {n})")
    dims, lts = [], []
    d = 0
    # as CPU: no index is read, none is checked (nothing selected, or nothing to select from: case 1:6964)
    check = None if _selects_nothing(indices) or x.numel() == 0 else op
    for i in indices:
        if i is None:
            d += 1
            continue
        if i.dtype not in _INDEX_DTYPES:
            raise IndexError(f"{op}: tensors used as indices must be long, int, byte or bool tensors, got {i.dtype}")
        if i.dtype in (torch.bool, torch.uint8):
            if i.dim() == 0:
                raise NotImplementedError(f"{op}: a 0-d boolean index is not supported on the xla device")
            _check_mask(x, i, d)
            nz = _host_nonzero(i, op)
            for j in range(i.dim()):
                dims.append(d + j)
                lts.append(_tensor.from_cpu(nz[:, j].contiguous())._lt)
            d += i.dim()
        else:
            dims.append(d)
            lts.append(_index_lt(i, check, -x.shape[d], x.shape[d]))
            d += 1
    empty = [e for e in dims if x.shape[e] == 0]
    if empty and all(math.prod(lt.shape) for lt in lts):  # (the core refuses it too, as a RuntimeError)
        raise IndexError(f"{op}: index is out of bounds for dimension {empty[0]} with size 0")
    return dims, lts


@impl(aten.index.Tensor, aten._unsafe_index.Tensor)
@_checks.staged
def index(x, indices):
    dims, lts = _indices(x, indices, "index")
    if not dims:
        return wrapped_op(OP.alias, (x._lt,), ())
    return wrapped_op(OP.index, (x._lt, *lts), (dims,))


def _mask_put(x, mask, values, d, accumulate):
    """x with x[..., mask, ...] = values (mask on dims d.., values broadcast to
    the indexing result [*x[:d], K, *x[d+m:]] with K unknown)."""
    m = mask.dim()
    _check_mask(x, mask, d)
    pre, post = list(x.shape[:d]), list(x.shape[d + m:])
    r = len(pre) + 1 + len(post)
    vshape = list(values.shape) if isinstance(values, torch.Tensor) else []
    if len(vshape) > r:
        raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {vshape} cannot be broadcast to "
                           f"indexing result of shape {pre + ['K'] + post}")
    vshape = [1] * (r - len(vshape)) + vshape
    k = vshape[d]
    target = pre + [k] + post
    for a, b in zip(vshape, target):
        if a != b and a != 1:
            raise RuntimeError(f"index_put: shape mismatch: value tensor of shape {list(values.shape)} cannot be "
                               f"broadcast to indexing result of shape {pre + ['K'] + post}")
    v = _tensor.core_operand(values)
    if not isinstance(values, XlaTensor) or values.dtype != x.dtype:
        v = lazy_op(OP.convert, (v,), (code(x.dtype),))
    if vshape != list(values.shape if isinstance(values, torch.Tensor) else []):
        v = lazy_op(OP.reshape, (v,), (vshape,))
    if vshape != target:
        v = lazy_op(OP.expand, (v,), (target,))
    mk = mask._lt if mask.dtype == torch.bool else lazy_op(OP.convert, (mask._lt,), (code(torch.bool),))
    return wrapped_op(OP.mask_put, (x._lt, mk, v), (d, bool(accumulate)))


@impl(aten.index_put.default, aten._unsafe_index_put.default)
@_checks.staged
def index_put(x, indices, values, accumulate=False):
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(given) == 1 and isinstance(given[0][1], XlaTensor) and given[0][1].dtype in (torch.bool, torch.uint8) \
            and given[0][1].dim() > 0 and x.dim() > 0:
        # x[mask] = v: stays on the device (no need to know how many are set).
        return _mask_put(x, given[0][1], values, given[0][0], accumulate)
    dims, lts = _indices(x, indices, "index_put")
    if not dims:
        return _assign_all(x, values, accumulate)
    v = _tensor.core_operand(values)
    return wrapped_op(OP.index_put, (x._lt, v, *lts), (dims, bool(accumulate)))


def _assign_all(x, values, accumulate):
    """index_put with no index tensors: every element."""
    if accumulate:
        return call(aten.add.Tensor, x, values)
    r = wrapped_op(OP.convert, (_tensor.core_operand(values),), (code(x.dtype),))
    return wrapped_op(OP.expand, (r._lt,), (list(x.shape),)) if tuple(r.shape) != tuple(x.shape) else r


@impl(aten.index_select.default)
@_checks.staged
def index_select(x, dim, index):
    if index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if index.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"index_select(): Expected dtype int32/int64 for index but got: {index.dtype}")
    d = _dim(dim, x.dim())
    if x.dim() and x.shape[d] == 0 and index.numel():  # no index is in range: CPU's IndexError (case 1:1039)
        raise IndexError(f"index_select(): index out of range in self: dimension {d} has size 0")
    lt = _index_lt(index, "index_select", 0, x.shape[d] if x.dim() else 1)
    if index.dim() == 0:
        lt = lazy_op(OP.reshape, (lt,), ([1],))
    if x.dim() == 0:
        r = wrapped_op(OP.index, (lazy_op(OP.reshape, (x._lt,), ([1],)), lt), ([0],))
        return wrapped_op(OP.reshape, (r._lt,), ([],))
    return wrapped_op(OP.index, (x._lt, lt), ([d],))


def _put_along(op, x, dim, index, source, accumulate, low=0, exc=RuntimeError):
    if index.dim() > 1:
        raise IndexError(f"{op}_(): Index is supposed to be a vector")
    n = x.shape[_dim(dim, x.dim())] if x.dim() else 1
    lt = _index_lt(index, op, -n if low is None else low, n, exc)
    if index.dim() == 0:
        lt = lazy_op(OP.reshape, (lt,), ([1],))
    src = _tensor.core_operand(source)
    if x.dim() == 0:
        r = wrapped_op(OP.index_put, (lazy_op(OP.reshape, (x._lt,), ([1],)), lazy_op(OP.reshape, (src,), ([1],)), lt),
                ([0], accumulate))
        return wrapped_op(OP.reshape, (r._lt,), ([],))
    d = _dim(dim, x.dim())
    if isinstance(source, torch.Tensor) and source.dim() == x.dim() - 1 and index.dim() == 0:
        src = lazy_op(OP.reshape, (src,), ([*source.shape[:d], 1, *source.shape[d:]],))
    return wrapped_op(OP.index_put, (x._lt, src, lt), ([d], accumulate))


@impl(aten.index_add.default)
@_checks.staged
def index_add(x, dim, index, source, *, alpha=1):
    if x.numel() == 0 and index.dim() <= 1:
        if x.dim() == 1 and index.numel():  # CPU's 1-D kernel checks each index: none is in range (case 1:391)
            raise IndexError("index_add(): index out of range in self: the tensor has no elements")
        return wrapped_op(OP.alias, (x._lt,), ())  # CPU's kernel adds nothing and reads no index (case 0:281)
    if alpha != 1:
        source = call(aten.mul.Tensor, source, alpha)
    return _put_along("index_add", x, dim, index, source, True)


@impl(aten.index_copy.default)
@_checks.staged
def index_copy(x, dim, index, source):
    return _put_along("index_copy", x, dim, index, source, False, exc=IndexError)


def _full_scalar(value, dtype):
    """A 0-d constant (complex values included) as a LazyTensor."""
    return full([], value, dtype)._lt


@impl(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
@_checks.staged
def index_fill(x, dim, index, value):
    v = _full_scalar(value, x.dtype) if not isinstance(value, torch.Tensor) \
        else lazy_op(OP.convert, (_tensor.core_operand(value),), (code(x.dtype),))
    return _put_along("index_fill", x, dim, index, wrap(v), False, low=None, exc=IndexError)  # negatives wrap


# ---- gather / scatter -------------------------------------------------------

def _index64(op, index):
    """index as int64 (CPU takes int32 indices too, and an empty index of any dtype)."""
    if index.dtype == torch.int64:
        return index
    if index.dtype == torch.int32 or index.numel() == 0:
        return wrapped_op(OP.convert, (index._lt,), (code(torch.int64),))
    raise RuntimeError(f"{op}(): Expected dtype int32/int64 for index")


@impl(aten.gather.default)
@_checks.staged
def gather(x, dim, index, *, sparse_grad=False):
    index = _index64("gather", index)
    if index.numel() == 0:  # CPU: an empty result of index's shape, whatever the ranks
        return wrapped_op(OP.full, (), (0.0, code(x.dtype), list(index.shape)))
    if x.dim() == 0 or index.dim() == 0:
        if x.dim() > 1 or index.dim() > 1:
            raise RuntimeError("gather(): Index tensor must have the same number of dimensions as input tensor")
        _dim(dim, 0)
        _index_lt(index, "gather", 0, x.numel(), RuntimeError)
        r = wrapped_op(OP.gather, (lazy_op(OP.reshape, (x._lt,), ([x.numel()],)),
                                   lazy_op(OP.reshape, (index._lt,), ([index.numel()],))), (0,))
        return wrapped_op(OP.reshape, (r._lt,), (list(index.shape),))
    d = _dim(dim, x.dim())
    _index_lt(index, "gather", 0, x.shape[d], RuntimeError)
    return wrapped_op(OP.gather, (x._lt, index._lt), (d,))


def _scatter(op, x, dim, index, src, reduce="none", include_self=True):
    index = _index64(op, index)
    _index_lt(index, op, 0, x.shape[_dim(dim, x.dim())] if x.dim() else 1, RuntimeError)  # range check
    if isinstance(src, torch.Tensor):
        s = _tensor.core_operand(src)
        if src.dtype != x.dtype and isinstance(src, XlaTensor):
            raise RuntimeError(f"{op}(): Expected self.dtype to be equal to src.dtype")
    else:
        s = _full_scalar(src, x.dtype)
    if x.dim() == 0 or index.dim() == 0:
        one = lambda t, n: lazy_op(OP.reshape, (t,), ([n],))  # noqa: E731
        n = 1 if not isinstance(src, torch.Tensor) or src.dim() == 0 else src.numel()
        r = wrapped_op(OP.scatter, (one(x._lt, 1), one(index._lt, index.numel()), one(s, n)),
                       (0, reduce, bool(include_self)))
        return wrapped_op(OP.reshape, (r._lt,), ([],))
    return wrapped_op(OP.scatter, (x._lt, index._lt, s), (_dim(dim, x.dim()), reduce, bool(include_self)))


_OLD_REDUCE = {"add": "sum", "multiply": "prod"}


@impl(aten.scatter.src, aten.scatter.value)
@_checks.staged
def scatter(x, dim, index, src):
    return _scatter("scatter", x, dim, index, src)


@impl(aten.scatter.reduce, aten.scatter.value_reduce)
@_checks.staged
def scatter_reduce_old(x, dim, index, src, *, reduce):
    if reduce not in _OLD_REDUCE:
        raise RuntimeError(f"scatter(): reduce argument must be either add or multiply, got {reduce}")
    return _scatter("scatter", x, dim, index, src, _OLD_REDUCE[reduce])


@impl(aten.scatter_add.default)
@_checks.staged
def scatter_add(x, dim, index, src):
    return _scatter("scatter_add", x, dim, index, src, "sum")


@impl(aten.scatter_reduce.two)
@_checks.staged
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(f"scatter_reduce(): reduce argument must be one of sum, prod, mean, amax, amin, "
                           f"got {reduce}")
    if reduce == "mean" and x.dtype == torch.bool:  # integers: the core rounds down, as torch
        raise refusal("scatter_reduce(reduce='mean')", torch.bool)
    if reduce in ("amax", "amin") and x.is_complex() and index.numel():  # complex has no order (case 1:8897;
        # CPU's kernel raises it, so an empty index passes)
        raise refusal(f"scatter_reduce(reduce='{reduce}')", x.dtype, "a real")
    return _scatter("scatter_reduce", x, dim, index, src, reduce, include_self)


# ---- masks --------------------------------------------------------------------

@impl(aten.masked_scatter.default)
def masked_scatter(x, mask, source):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_: expected BoolTensor for mask, got {mask.dtype}")
    if source.dtype != x.dtype:
        raise RuntimeError(f"masked_scatter: expected self and source to have same dtypes but got {x.dtype} and "
                           f"{source.dtype}")
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    xl, ml = x._lt, mask._lt
    if list(x.shape) != shape:
        xl = lazy_op(OP.expand, (xl,), (shape,))
    if list(mask.shape) != shape:
        ml = lazy_op(OP.expand, (ml,), (shape,))
    if not shape:
        xl, ml, shape0 = lazy_op(OP.reshape, (xl,), ([1],)), lazy_op(OP.reshape, (ml,), ([1],)), [1]
    else:
        shape0 = shape
    n = source.numel()
    if n == 0:
        return wrapped_op(OP.alias, (xl,), ()) if shape else wrapped_op(OP.reshape, (xl,), ([],))
    src = lazy_op(OP.reshape, (source._lt,), ([n],))
    r = wrapped_op(OP.mask_put, (xl, ml, src), (0, False))
    return r if shape0 == shape else wrapped_op(OP.reshape, (r._lt,), ([],))


@impl(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad, mask, sizes):
    # out[j] = grad at the j-th set position of mask, zeros past the count.
    numel = 1
    for s in sizes:
        numel *= s
    gl, ml = grad._lt, mask._lt
    if list(mask.shape) != list(grad.shape):
        ml = lazy_op(OP.expand, (ml,), (list(grad.shape),))
    n = grad.numel()
    g = wrap(lazy_op(OP.reshape, (gl,), ([n],)))
    m = wrap(lazy_op(OP.reshape, (ml,), ([n],)))
    pos = wrapped_op(OP.cumsum, (m._lt,), (0, code(torch.int64)))
    pos = call(aten.sub.Tensor, pos, 1)
    pos = call(aten.where.self, m, pos, wrap(lazy_op(OP.full, (), (float(numel), code(torch.int64), []))))
    zeros = lazy_op(OP.full, (), (0.0, code(grad.dtype), [numel]))
    r = wrapped_op(OP.index_put, (zeros, g._lt, pos._lt), ([0], True))
    return wrapped_op(OP.reshape, (r._lt,), (list(sizes),))


@impl(aten.masked_select.default)
def masked_select(x, mask):
    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_select: expected BoolTensor for mask, got {mask.dtype}")
    shape = list(torch.broadcast_shapes(x.shape, mask.shape))
    xe = x if list(x.shape) == shape else wrapped_op(OP.expand, (x._lt,), (shape,))
    me = mask if list(mask.shape) == shape else wrapped_op(OP.expand, (mask._lt,), (shape,))
    if not shape:
        xe, me = wrapped_op(OP.reshape, (xe._lt,), ([1],)), wrapped_op(OP.reshape, (me._lt,), ([1],))
    nz = _host_nonzero(me, "masked_select")
    xf = lazy_op(OP.reshape, (xe._lt,), ([xe.numel()],))
    flat = nz[:, 0]
    for j in range(1, nz.shape[1]):
        flat = flat * me.shape[j] + nz[:, j]
    return wrapped_op(OP.index, (xf, _tensor.from_cpu(flat.contiguous())._lt), ([0],))


@impl(aten.nonzero.default)
def nonzero(x):
    return _tensor.from_cpu(_host_nonzero(x, "nonzero"))


@impl(aten.argwhere.default)
def argwhere(x):
    return nonzero(x)


# ---- embedding -------------------------------------------------------------

@impl(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    if indices.dtype not in (torch.int64, torch.int32):
        raise RuntimeError(f"embedding_dense_backward: indices must be int64 or int32, got {indices.dtype}")
    pad = padding_idx if padding_idx >= 0 else -1
    if scale_grad_by_freq:
        ones = lazy_op(OP.full, (), (1.0, code(grad.dtype), [*indices.shape, 1]))
        counts = lazy_op(OP.embedding_backward, (ones, indices._lt), (num_weights, -1))  # [num_weights, 1]
        per = wrapped_op(OP.index, (counts, indices._lt), ([0],))  # [*indices, 1]
        grad = call(aten.div.Tensor, grad, per)
    return wrapped_op(OP.embedding_backward, (grad._lt, indices._lt), (num_weights, pad))


# ---- cumulative ops, sort ---------------------------------------------------

def _cum(opid, x, dim, dtype):
    return wrapped_op(opid, (x._lt,), (_dim(dim, x.dim()), code(dtype) if dtype is not None else -1))


@impl(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    return _cum(OP.cumsum, x, dim, dtype)


@impl(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    return _cum(OP.cumprod, x, dim, dtype)


def _cumext(opid, x, dim):
    """cummax/cummin: running extreme and the (last) index where it was reached."""
    if x.dim() == 0:
        _dim(dim, 0)
        return wrapped_op(OP.alias, (x._lt,), ()), wrap(lazy_op(OP.full, (), (0.0, code(torch.int64), [])))
    d = _dim(dim, x.dim())
    v = wrapped_op(opid, (x._lt,), (d, code(x.dtype)))
    # the extreme was reached at i where x[i] == running[i] (or x[i] is NaN);
    # the index for j is the last such i <= j: a running max of those i.
    hit = call(aten.eq.Tensor, x, v)
    if x.is_floating_point():
        hit = call(aten.logical_or.default, hit, call(aten.ne.Tensor, x, x))
    pos = wrap(lazy_op(OP.iota, (), (code(torch.int64), list(x.shape), d)))
    pos = call(aten.where.self, hit, pos, wrap(lazy_op(OP.full, (), (-1.0, code(torch.int64), []))))
    return v, wrapped_op(OP.cummax, (pos._lt,), (d, code(torch.int64)))


@impl(aten.cummax.default)
def cummax(x, dim):
    return _cumext(OP.cummax, x, dim)


@impl(aten.cummin.default)
def cummin(x, dim):
    return _cumext(OP.cummin, x, dim)


def _sort(x, dim, descending):
    if x.dim() == 0:
        _dim(dim, 0)
        return wrapped_op(OP.alias, (x._lt,), ()), wrap(lazy_op(OP.full, (), (0.0, code(torch.int64), [])))
    d = _dim(dim, x.dim())
    return (wrapped_op(OP.sort, (x._lt,), (d, bool(descending), 0)),
            wrapped_op(OP.sort, (x._lt,), (d, bool(descending), 1)))


@impl(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)


@impl(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)  # always stable


@impl(aten.argsort.default)
def argsort(x, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@impl(aten.argsort.stable)
def argsort_stable(x, *, stable, dim=-1, descending=False):
    return _sort(x, dim, descending)[1]


@impl(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    if x.dtype == torch.bool:  # as torch's CPU and CUDA kernels
        raise RuntimeError("topk does not support bool dtypes: convert the input to an integer dtype first")
    if x.dim() == 0:
        if k not in (0, 1):
            raise RuntimeError("topk(): selected index k out of range")
        v, i = _sort(x, dim, largest)
        return v, i
    d = _dim(dim, x.dim())
    if not 0 <= k <= x.shape[d]:
        raise RuntimeError("topk(): selected index k out of range")
    v, i = _sort(x, d, largest)
    return (wrapped_op(OP.slice, (v._lt,), (d, 0, k, 1)), wrapped_op(OP.slice, (i._lt,), (d, 0, k, 1)))


@impl(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    d = _dim(dim, x.dim())
    n = x.shape[d] if x.dim() else 1
    if n == 0:
        raise IndexError(f"kthvalue(): Expected reduction dim {d} to have non-zero size.")
    if not 1 <= k <= n:
        raise IndexError(f"kthvalue(): selected number k out of range for dimension {dim}")
    v, i = _sort(x, d, False)
    if x.dim() == 0:
        return v, i
    v, i = wrapped_op(OP.select, (v._lt,), (d, k - 1)), wrapped_op(OP.select, (i._lt,), (d, k - 1))
    if keepdim:
        shape = list(x.shape)
        shape[d] = 1
        v, i = wrapped_op(OP.reshape, (v._lt,), (shape,)), wrapped_op(OP.reshape, (i._lt,), (shape,))
    return v, i


# ---- triangles, diagonals ---------------------------------------------------

@impl(aten.tril.default)
def tril(x, diagonal=0):
    if x.dim() < 2:
        raise RuntimeError("tril: input tensor must have at least 2 dimensions")
    return wrapped_op(OP.tri, (x._lt,), (diagonal, False))


@impl(aten.triu.default)
def triu(x, diagonal=0):
    if x.dim() < 2:
        raise RuntimeError("triu: input tensor must have at least 2 dimensions")
    return wrapped_op(OP.tri, (x._lt,), (diagonal, True))


def _diag_attrs(x, offset, dim1, dim2):
    d1, d2 = _dim(dim1, x.dim()), _dim(dim2, x.dim())
    if d1 == d2:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    return (offset, d1, d2)


@impl(aten.diagonal.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    if x.dim() < 2:
        raise RuntimeError(f"diagonal(): expected a tensor of at least 2 dimensions, got {x.dim()}")
    return wrap(lazy_view(OP.diagonal, x._lt, _diag_attrs(x, offset, dim1, dim2)))


@impl(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return wrapped_op(OP.diagonal_scatter, (x._lt, src._lt), _diag_attrs(x, offset, dim1, dim2))


@impl(aten.diagonal_backward.default)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    zeros = wrapped_op(OP.full, (), (0.0, code(grad.dtype), list(input_sizes)))
    return diagonal_scatter(zeros, grad, offset, dim1, dim2)
