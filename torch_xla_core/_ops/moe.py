"""Mixture-of-experts aten ops on xla tensors: histc, bincount and
_grouped_mm (F.grouped_mm / torch._grouped_mm), built from core ops (through
torch ops on xla tensors, so they stay in the graph: no sync, no fallback).

histc(x, bins, min, max): float inputs count like torch's CPU kernel (bin
from the linear position, then corrected against linspace(min, max, bins+1)
edges; the last bin includes max; values outside [min, max] and NaN are not
counted; min == max means the data's own range, widened by 1 if that is
empty). Integer inputs (which torch's CPU kernel refuses, but `transformers`
passes int32 expert ids on accelerators) count like torch's CUDA kernel:
bin = (v - min) * bins // (max - min) in int64, result in the input dtype.

bincount(x, weights, minlength): the result's length is max(x) + 1 or
minlength, a value only the device knows. With minlength > 0 the result has
exactly minlength bins, and a deferred check (see _tracing/checks.py) raises at the
sync if some value is >= minlength (torch would return a longer result:
pass a larger minlength). With minlength == 0 the length is read from the
device: a visible sync, counted as `data_dependent::bincount` in metrics.

_grouped_mm(a, b, offs): torch's convention: offs are CUMULATIVE end offsets
(int32, one per group) along the grouped dim; rows past offs[-1] are zero.
  a [M, K] x b [E, K, N] (offs [E]) -> [M, N]    rows offs[e-1]:offs[e] use b[e]
  a [K, M] x b [M, N]    (offs [E]) -> [E, K, N] out[e] = a[:, g_e] @ b[g_e, :]
  a [E, M, K] x b [E, K, N] (no offs) -> [E, M, N] (bmm)
(3-D x 2-D with offs raises: none of the MoE forward/backward paths use it.)
The first two are what an MoE forward and its backward (torch's own
GroupedMmBackward0) call. They compute densely over groups (each row against
every expert, masked): E times the work, exact, and one fixed graph for any
routing. torch_xla_core.kernels.grouped_matmul is the kernel path."""
import torch

from .._tracing import checks as _checks, tensor as _tensor
from .. import metrics
from .._tracing.tensor import XlaTensor
from . import aten, impl, impl_by_name


def _lt_scalar_check(x, bound, message):
    """Deferred check: some element of x is >= bound."""
    _checks.require((x >= bound)._lt, message, RuntimeError)


# ---- histc --------------------------------------------------------------------------

def _range(x, lo, hi):
    """(lo, hi) as 0-d tensors of x's dtype: the given range, or the data's."""
    if lo == hi:
        if x.numel() == 0:
            lo_t = torch.zeros((), dtype=x.dtype, device=x.device)
            hi_t = lo_t
        else:
            lo_t, hi_t = x.min(), x.max()
        empty = lo_t == hi_t
        return torch.where(empty, lo_t - 1, lo_t), torch.where(empty, hi_t + 1, hi_t)
    full = lambda v: torch.full((), v, dtype=x.dtype, device=x.device)  # noqa: E731
    return full(lo), full(hi)


@impl(aten.histc.default)
@_checks.staged
def histc(x, bins=100, min=0, max=0):
    if bins <= 0:
        raise RuntimeError(f"torch.histc(): bins must be > 0, but got {bins} for dim 0")
    if x.dtype == torch.bool or x.is_complex():
        raise RuntimeError(f"torch.histc: input tensor and bins tensors should have the same dtype, got "
                           f"{x.dtype} (histc of {x.dtype} tensors is not supported)")
    if min > max:
        raise RuntimeError(f"torch.histc(): max must be larger than min, but got min {min} and max {max}")
    if min != min or max != max or min in (float("inf"), float("-inf")) or max in (float("inf"), float("-inf")):
        raise RuntimeError(f"torch.histc(): range of [{min}, {max}] is not finite")
    flat = x.reshape(-1)
    if not flat.is_floating_point():
        lo, hi = _range(flat, int(min), int(max))
        v = flat.long()
        lo, hi = lo.long(), hi.long()
        inside = (v >= lo) & (v <= hi)
        pos = torch.div((v - lo) * bins, hi - lo, rounding_mode="floor")
        pos = pos.clamp(0, bins - 1)
        ones = inside.to(x.dtype)
    else:
        lo, hi = _range(flat, float(min), float(max))
        inside = (flat >= lo) & (flat <= hi)  # NaN: false
        # torch CPU: linear position, then one step of correction against the edges
        pos = ((flat - lo) / (hi - lo) * bins).nan_to_num(0.0).clamp(0, bins - 1).long()
        i = torch.arange(bins + 1, device=x.device)
        step = (hi - lo) / bins
        half = (bins + 1) // 2  # linspace fills the first half from the start, the rest from the end
        edges = torch.where(i < half, lo + step * i.to(x.dtype), hi - step * (bins - i).to(x.dtype))
        pos = pos - (flat < edges[pos]).long()
        pos = pos + ((flat >= edges[pos + 1]) & (pos < bins - 1)).long()
        pos = pos.clamp(0, bins - 1)
        ones = inside.to(x.dtype)
    out = torch.zeros(bins, dtype=x.dtype, device=x.device)
    return out.scatter_add(0, torch.where(inside, pos, 0), ones)


# ---- bincount -----------------------------------------------------------------------

@impl(aten.bincount.default)
@_checks.staged
def bincount(x, weights=None, minlength=0):
    if x.dim() != 1 or x.is_floating_point() or x.dtype == torch.bool:
        raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (got a {x.dim()}-d "
                           f"{x.dtype} tensor)")
    if minlength < 0:
        raise RuntimeError(f"bincount(): minlength should be >= 0, got {minlength}")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != x.shape[0]):
        raise RuntimeError("bincount(): weights should be 1-d and have the same length as input")
    out_dtype = torch.int64 if weights is None else (
        weights.dtype if weights.dtype in (torch.float32, torch.float64) else torch.float64)
    if weights is not None and out_dtype == torch.float64 and weights.dtype != torch.float64:
        out_dtype = torch.float64
    if x.numel():
        _checks.require((x < 0)._lt, "bincount: input contains negative values; bincount counts non-negative "
                        "integers only", RuntimeError)
    if minlength > 0:
        n = minlength
        if x.numel():
            _lt_scalar_check(x, minlength, f"bincount: a value is >= minlength={minlength}, so torch's result would "
                             f"have more than {minlength} bins and this fixed-size result drops counts; pass a "
                             f"minlength larger than the largest value")
    else:
        # The length is data: read max(x) from the device (a visible, counted sync).
        metrics.counter_add("data_dependent::bincount")
        n = int(_tensor.to_cpu(x.max()).item()) + 1 if x.numel() else 0
    src = torch.ones_like(x, dtype=out_dtype) if weights is None else weights.to(out_dtype)
    out = torch.zeros(n, dtype=out_dtype, device=x.device)
    if n == 0 or x.numel() == 0:
        return out
    return out.scatter_add(0, x.long().clamp(0, n - 1), src)


# ---- grouped matmul -----------------------------------------------------------------

def _group_masks(offs, m, e, device):
    """[E, M] float-free bool mask: row r belongs to group g iff offs[g-1] <= r < offs[g]."""
    r = torch.arange(m, device=device, dtype=torch.int32)
    end = offs.to(torch.int32)
    start = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), end[:-1]])
    return (r[None, :] >= start[:, None]) & (r[None, :] < end[:, None])


def _check_offs(offs, groups, total, what):
    if offs.dim() != 1 or offs.dtype != torch.int32:
        raise RuntimeError(f"grouped_mm: offs must be a 1-D int32 tensor of cumulative group end offsets, got a "
                           f"{offs.dim()}-D {offs.dtype} tensor")
    if offs.shape[0] != groups:
        raise RuntimeError(f"grouped_mm: offs has {offs.shape[0]} entries but {what} has {groups} groups")
    if isinstance(offs, XlaTensor) and groups:
        bad = (offs[1:] < offs[:-1]).any() | (offs[0] < 0) | (offs[-1] > total)
        _checks.require(bad._lt, f"grouped_mm: offs must be non-decreasing cumulative offsets within [0, {total}] "
                        f"(they are end offsets, not group sizes: use torch.cumsum(sizes, 0).int())",
                        RuntimeError)


@impl(aten._grouped_mm.default)
@_checks.staged
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    if bias is not None:
        raise RuntimeError("grouped_mm: bias is not supported (torch's own kernels refuse it too); add it after")
    if a.dtype != b.dtype:
        raise RuntimeError(f"grouped_mm: expected mat_a and mat_b to have the same dtype, got {a.dtype} and {b.dtype}")
    if out_dtype is not None and out_dtype not in (a.dtype, torch.float32):
        raise RuntimeError(f"grouped_mm: out_dtype must be {a.dtype} or torch.float32, got {out_dtype}")
    odt = out_dtype or a.dtype
    if a.dim() == 2 and b.dim() == 3:
        m, k = a.shape
        e, k2, n = b.shape
        if k != k2:
            raise RuntimeError(f"grouped_mm: contraction dims differ: mat_a {list(a.shape)}, mat_b {list(b.shape)}")
        if offs is None:
            raise RuntimeError("grouped_mm: a 2-D mat_a with a 3-D mat_b needs offs (cumulative row offsets)")
        _check_offs(offs, e, m, "mat_b")
        mask = _group_masks(offs, m, e, a.device)                    # [E, M]
        ys = torch.matmul(a.to(odt)[None], b.to(odt))                 # [E, M, N]
        return (ys * mask[:, :, None].to(odt)).sum(0)
    if a.dim() == 2 and b.dim() == 2:
        k, m = a.shape
        m2, n = b.shape
        if m != m2:
            raise RuntimeError(f"grouped_mm: grouped dims differ: mat_a {list(a.shape)}, mat_b {list(b.shape)}")
        if offs is None:
            raise RuntimeError("grouped_mm: 2-D mat_a and mat_b need offs (cumulative offsets of the shared dim)")
        e = offs.shape[0] if offs.dim() == 1 else -1
        _check_offs(offs, e, m, "offs")
        mask = _group_masks(offs, m, e, a.device)                    # [E, M]
        am = a.to(odt)[None] * mask[:, None, :].to(odt)               # [E, K, M]
        return torch.matmul(am, b.to(odt))                            # [E, K, N]
    if a.dim() == 3 and b.dim() == 3:
        if offs is not None:
            raise RuntimeError("grouped_mm: 3-D mat_a and mat_b are a batched matmul and take no offs")
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise RuntimeError(f"grouped_mm: batched shapes do not fit: mat_a {list(a.shape)}, mat_b {list(b.shape)}")
        return torch.bmm(a.to(odt), b.to(odt))
    raise RuntimeError(f"grouped_mm: {a.dim()}-D mat_a with {b.dim()}-D mat_b is not supported on the xla device "
                       f"(supported: 2-D x 3-D with offs, 2-D x 2-D with offs, 3-D x 3-D)")


# transformers' opaque grouped matmul: what its MoE experts call under torch.compile (and where
# F.grouped_mm does not take the weights' dtype); as a custom op it would fall back to the CPU
# (reading every expert's weights on the host). offs are cumulative end offsets, as _grouped_mm's.

@impl_by_name("transformers::grouped_mm_fallback")
def hf_grouped_mm(input, weight, offs):
    return grouped_mm(input, weight, offs.to(torch.int32))


@impl_by_name("transformers::grouped_mm_fallback_backward")
def hf_grouped_mm_backward(input, weight, offs, grad_output):
    offs = offs.to(torch.int32)
    return grouped_mm(grad_output, weight.transpose(1, 2), offs), grouped_mm(input.t(), grad_output, offs)

