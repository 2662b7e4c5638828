"""Order statistics and searches on the device, built from core ops (sort,
gather, cumsum, scatter) through ordinary torch calls on xla tensors:
median / nanmedian / mode, searchsorted (and so isin's sorting path),
histogram / histogramdd, nonzero_static.

Every output shape here is known from the input shapes, so nothing leaves
the device. NaN orders after every number, as in torch's sort: median
propagates it, nanmedian skips it. searchsorted compares each value with
the whole sorted row (a [..., values, row] comparison summed over the row):
no loop, memory proportional to values x row length."""
import torch

from . import aten, impl
from .dtype_rules import INTEGRAL


def _dim(d, rank):
    r = max(rank, 1)
    if not -r <= d < r:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-r}, {r - 1}], but got {d})")
    return d % r


def _nonempty(name, x, d):
    if x.dim() and x.shape[d] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")


# ---- median, nanmedian, mode --------------------------------------------------

def _median_dim(name, x, dim, keepdim, ignore_nan):
    d = _dim(dim, x.dim())
    _nonempty(name, x, d)
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    s, i = torch.sort(x, dim=d, stable=True)
    n = x.shape[d]
    if x.is_floating_point():
        nnan = torch.isnan(x).sum(d, keepdim=True)
        if ignore_nan:  # the lower middle of the numbers (NaN when all are NaN)
            k = torch.clamp(torch.div(n - nnan - 1, 2, rounding_mode="floor"), min=0)
        else:  # a NaN, where there is one
            k = torch.where(nnan > 0, n - nnan, (n - 1) // 2)
    else:
        shape = list(x.shape)
        shape[d] = 1
        k = torch.full(shape, (n - 1) // 2, dtype=torch.int64, device=x.device)
    v, idx = s.gather(d, k), i.gather(d, k)
    if not keepdim:
        v, idx = v.squeeze(d), idx.squeeze(d)
    return v, idx


def _median_all(x, ignore_nan):
    if x.numel() == 0:
        return torch.full((), float("nan"), dtype=x.dtype, device=x.device)
    return _median_dim("median", x.reshape(-1), 0, False, ignore_nan)[0]


@impl(aten.median.default)
def median(x):
    return _median_all(x, False)


@impl(aten.nanmedian.default)
def nanmedian(x):
    return _median_all(x, True)


@impl(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median_dim("median", x, dim, keepdim, False)


@impl(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median_dim("median", x, dim, keepdim, True)


@impl(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value along dim (the smallest of those tied) and the
    last index holding it, as CPU eager."""
    d = _dim(dim, x.dim())
    _nonempty("mode", x, d)
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    xt = x.movedim(d, -1)
    s = torch.sort(xt, dim=-1, stable=True)[0]
    counts = (s.unsqueeze(-1) == s.unsqueeze(-2)).sum(-1)  # [..., n]: occurrences of s[j]
    best = counts.argmax(-1, keepdim=True)                   # first maximum: the smallest value
    v = s.gather(-1, best)
    pos = torch.arange(xt.shape[-1], device=x.device)
    idx = torch.where(xt == v, pos, -1).amax(-1, keepdim=True)
    v, idx = v.movedim(-1, d), idx.movedim(-1, d)
    if not keepdim:
        v, idx = v.squeeze(d), idx.squeeze(d)
    return v, idx


# ---- searchsorted ---------------------------------------------------------------

def _before(a, v, right):
    """a sorts before v (right: or equal), NaN ordering last."""
    r = (a <= v) if right else (a < v)
    if a.is_floating_point() or (isinstance(v, torch.Tensor) and v.is_floating_point()):
        nv = torch.isnan(v)
        r = (r | nv) if right else (r | (nv & ~torch.isnan(a)))
    return r


def _searchsorted(seq, values, out_int32, right, side, sorter):
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of left "
                               "while right was True")
        right = side == "right"
    if seq.dim() == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive dimension, but got 0 "
                           "dimension")
    if seq.dim() > 1 and (values.dim() != seq.dim() or values.shape[:-1] != seq.shape[:-1]):
        raise RuntimeError(f"torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                           f"dimensions of boundaries tensor and input value tensor must match, but we got "
                           f"boundaries tensor {list(seq.shape)} and input value tensor {list(values.shape)}")
    if sorter is not None:
        if sorter.shape != seq.shape:
            raise RuntimeError(f"torch.searchsorted(): boundary and sorter must have the same size, but got "
                               f"boundary tensor {list(seq.shape)}and got sorter tensor {list(sorter.shape)}")
        seq = seq.gather(-1, sorter)
    s = seq if seq.dim() == 1 else seq.unsqueeze(-2)     # [*B, 1, M]
    cmp = _before(s, values.unsqueeze(-1), right)        # [*B, K, M]
    return cmp.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


@impl(aten.searchsorted.Tensor)
def searchsorted(seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(seq, values, out_int32, right, side, sorter)


@impl(aten.searchsorted.Scalar)
def searchsorted_scalar(seq, value, *, out_int32=False, right=False, side=None, sorter=None):
    v = torch.full((), value, dtype=seq.dtype, device=seq.device)
    return _searchsorted(seq, v, out_int32, right, side, sorter)


@impl(aten.bucketize.Tensor)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    if boundaries.dim() != 1:
        raise RuntimeError(f"bucketize: boundaries tensor must be 1 dimension, but got dim({boundaries.dim()})")
    return _searchsorted(boundaries, values, out_int32, right, None, None)


# ---- histograms ------------------------------------------------------------------

def _edges(x, bins, rng):
    """Per-dim bin edges of points x [N, D] for bin counts `bins`, over
    `rng` (flat [lo0, hi0, lo1, hi1, ...]) or the data's extent ([0, 1] for no points), widened by
    0.5 each side where it is a single point, as CPU eager does."""
    D = len(bins)
    if rng is not None:
        if len(rng) != 2 * D:
            raise RuntimeError(f"torch.histogramdd: for a {D}-dimensional histogram, range should have {2 * D} "
                               f"elements, but got {len(rng)}")
        lo = torch.tensor([float(rng[2 * i]) for i in range(D)], dtype=x.dtype).to(x.device)
        hi = torch.tensor([float(rng[2 * i + 1]) for i in range(D)], dtype=x.dtype).to(x.device)
    elif x.shape[0] == 0:
        lo = torch.zeros(D, dtype=x.dtype, device=x.device)
        hi = torch.ones(D, dtype=x.dtype, device=x.device)
    else:
        lo, hi = x.amin(0), x.amax(0)
    same = lo == hi
    lo, hi = torch.where(same, lo - 0.5, lo), torch.where(same, hi + 0.5, hi)
    out = []
    for i, b in enumerate(bins):
        if b <= 0:
            raise RuntimeError(f"torch.histogramdd(): bins must be > 0, but got {b} for dimension {i}")
        steps = torch.arange(b + 1, dtype=x.dtype, device=x.device)
        # linspace(lo, hi, b + 1), computed as torch's CPU linspace does (from both ends)
        step = (hi[i] - lo[i]) / b
        half = (b + 1) // 2
        out.append(torch.where(steps < half, lo[i] + step * steps, hi[i] - step * (b - steps)))
    return out


def _hist(x, edges, weight, density):
    """histogramdd of points x [N, D] over per-dim edge tensors."""
    D = len(edges)
    sizes = [e.shape[0] - 1 for e in edges]
    flat = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
    inside = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
    for i, e in enumerate(edges):
        xi = x[:, i]
        b = _searchsorted(e, xi, False, True, None, None) - 1          # e[b] <= x < e[b + 1]
        b = torch.where(xi == e[-1], sizes[i] - 1, b)                   # the last edge closes the last bin
        inside = inside & (xi >= e[0]) & (xi <= e[-1])
        flat = flat * sizes[i] + torch.clamp(b, 0, max(sizes[i] - 1, 0))
    total = 1
    for s in sizes:
        total *= s
    flat = torch.where(inside, flat, total)  # outside the edges: a spare slot, dropped
    w = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if weight is None else weight.reshape(-1)
    hist = torch.zeros(total + 1, dtype=x.dtype, device=x.device).index_add(0, flat, w)[:total].reshape(sizes)
    if density:
        hist = hist / hist.sum()
        for i, e in enumerate(edges):
            shape = [1] * D
            shape[i] = sizes[i]
            hist = hist / (e[1:] - e[:-1]).reshape(shape)
    return hist


def _points(x, D):
    return x.reshape(-1, D) if D else x.reshape(-1, 1)


@impl(aten._histogramdd_bin_edges.default, refuses=INTEGRAL)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):
    return _edges(_points(x, x.shape[-1]), list(bins), range)


@impl(aten._histogramdd_from_bin_cts.default, refuses=INTEGRAL)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):
    pts = _points(x, x.shape[-1])
    return _hist(pts, _edges(pts, list(bins), range), weight, density)


@impl(aten._histogramdd_from_bin_tensors.default, refuses=INTEGRAL)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _hist(_points(x, x.shape[-1]), list(bins), weight, density)


@impl(aten.histogram.bin_ct, refuses=INTEGRAL)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    pts = x.reshape(-1, 1)
    edges = _edges(pts, [bins], range)
    return _hist(pts, edges, weight, density), edges[0]


@impl(aten.histogram.bins_tensor, refuses=INTEGRAL)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    return _hist(x.reshape(-1, 1), [bins], weight, density), bins.clone()


# ---- nonzero_static ----------------------------------------------------------------

@impl(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    """The first `size` coordinates of nonzero elements ([size, x.dim()]),
    rows past the count filled with fill_value: a static shape."""
    if size < 0:
        raise RuntimeError(f"nonzero_static: 'size' must be an non-negative integer, but got {size}")
    n, r = x.numel(), x.dim()
    flat = (x.reshape(-1) != 0)
    pos = torch.cumsum(flat, 0) - 1  # among the nonzeros
    slot = torch.where(flat & (pos < size), pos, size)
    src = torch.arange(n, dtype=torch.int64, device=x.device)
    found = torch.full((size + 1,), -1, dtype=torch.int64, device=x.device).index_put((slot,), src)[:size]
    cols = []
    rem = found
    for s in reversed(list(x.shape)):
        cols.append(torch.remainder(rem, s) if s else rem)
        rem = torch.div(rem, s, rounding_mode="floor") if s else rem
    coords = torch.stack(cols[::-1], 1) if r else torch.zeros(size, 0, dtype=torch.int64, device=x.device)
    return torch.where((found < 0).unsqueeze(1), fill_value, coords)
