"""Matrix products -> the core `dot` op (stablehlo.dot_general)."""
import torch
from torch._decomp import decomposition_table

from .._runtime.dtypes import code
from .._tracing.tensor import XlaTensor, OP, lazy_op, wrapped_op, wrap
from . import XLA, aten, convert, impl, mapping, type_name

_DOT, _ADD, _MUL = OP.dot, OP.add, OP.mul
_MM = ([], [], [1], [0])
_BMM = ([0], [0], [2], [1])


def _check_dtypes(name, a, b):
    if a.dtype != b.dtype:
        raise RuntimeError(f"{name}: expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}")


def _check(name, rank):
    """torch's errors for the calls of mm/bmm its mapping or the core refuse."""
    def check(a, b):
        if a.dim() != rank or b.dim() != rank:
            raise RuntimeError(f"{name}: expected {rank}D tensors, got {a.dim()}D and {b.dim()}D")
        _check_dtypes(name, a, b)
    return check


mm = mapping(aten.mm.default, op="dot", ranks=(2, 2), attrs=_MM, check=_check("mm", 2))
bmm = mapping(aten.bmm.default, op="dot", ranks=(3, 3), attrs=_BMM, check=_check("bmm", 3))


def integral_scalars(dtype, beta, alpha):
    """torch's addmm family on integer tensors takes beta and alpha as that
    integer type (truncated: alpha=2.7 multiplies by 2), so the result stays
    integral."""
    if dtype.is_floating_point or dtype.is_complex:
        return beta, alpha
    return int(beta), int(alpha)


def _scaled_sum(c, p, beta, alpha):
    if alpha != 1:
        p = lazy_op(_MUL, (p, alpha), ())
    if beta == 0:
        return wrap(p)
    cv = c
    if beta != 1:
        cv = lazy_op(_MUL, (cv, beta), ())
    return wrapped_op(_ADD, (cv, p), ())


_HALF = (torch.float16, torch.bfloat16)


def product_sum(c, a, b, dims, beta, alpha):
    """beta * c + alpha * dot(a, b; dims). Half-precision operands of one
    dtype compute it in float32 and round once, as torch's CPU kernels do
    (the dot's float32 product, not its product rounded to bf16 and then the
    sum rounded again: that differed from CPU in ~26% of a bf16 baddbmm's
    elements)."""
    if a.dtype in _HALF and b.dtype == a.dtype and isinstance(c, XlaTensor) and c.dtype == a.dtype:
        f32 = torch.float32
        p = lazy_op(_DOT, (a._lt, b._lt), tuple(dims) + (code(f32),))
        return convert(_scaled_sum(convert(c, f32), p, beta, alpha), a.dtype)
    return _scaled_sum(c, lazy_op(_DOT, (a._lt, b._lt), dims), *integral_scalars(a.dtype, beta, alpha))


# addmm(c, a, b) is one dot node: the product plus c (half precision: added in float32, rounded once). Its
# handler takes beta and alpha.
mapping(aten.addmm.default, op="dot", operands=(1, 2, 0), ranks=(2, 2, XLA), attrs=_MM)


@impl(aten.addmm.default)
def addmm(c, a, b, *, beta=1, alpha=1):
    if (a.shape[1] == 0 and a.shape[0] * b.shape[1] and isinstance(beta, float) and beta != 0
            and not (c.dtype.is_floating_point or c.dtype.is_complex)):  # CPU scales c alone then: c.mul_(beta)
        raise RuntimeError(f"addmm: result type Float can't be cast to the desired output type "
                           f"{type_name(c.dtype)} (an integer result with a float beta and an empty inner "
                           f"dimension, as torch's kernel); pass an integer beta")
    if beta == 1 and alpha == 1 and type(c) is XlaTensor:
        return wrapped_op(_DOT, (a, b, c), _MM)  # one node: the product plus c
    _check_dtypes("addmm", a, b)
    return product_sum(c, a, b, _MM, beta, alpha)


@impl(aten.baddbmm.default)
def baddbmm(c, a, b, *, beta=1, alpha=1):
    _check_dtypes("baddbmm", a, b)
    return product_sum(c, a, b, _BMM, beta, alpha)


@impl(aten.addr.default)
def addr(c, v1, v2, *, beta=1, alpha=1):
    """torch's decomposition (an outer product, scaled and added); half
    precision computes it in float32 and rounds once, as CPU (rounding the
    product, then the sum, was 1.1x bf16 tolerance from float64 on an
    OpInfo sample where CPU is 0.16x)."""
    d = decomposition_table[aten.addr.default]
    if c.dtype in (torch.float16, torch.bfloat16) and v1.dtype == v2.dtype == c.dtype:
        return d(c.float(), v1.float(), v2.float(), beta=beta, alpha=alpha).to(c.dtype)
    return d(c, v1, v2, beta=beta, alpha=alpha)


@impl(aten.dot.default)
def dot(a, b):
    if a.dim() != 1 or b.dim() != 1:
        raise RuntimeError(f"1D tensors expected, but got {a.dim()}D and {b.dim()}D tensors")
    return wrapped_op(_DOT, (a._lt, b._lt), ([], [], [0], [0]))


@impl(aten.vdot.default)
def vdot(a, b):
    """sum(conj(a) * b): dot with a conjugated first operand (the same as dot for real a)."""
    if a.is_complex():
        a = wrapped_op(OP.conj, (a._lt,), ())
    return dot(a, b)


@impl(aten.mv.default)
def mv(a, b):
    return wrapped_op(_DOT, (a._lt, b._lt), ([], [], [1], [0]))


# ---- cdist (p-norm distances between row sets; torch's small-size path) ----

@impl(aten._cdist_forward.default)
def cdist_forward(x1, x2, p, compute_mode=None):
    d = (x1.unsqueeze(-2) - x2.unsqueeze(-3)).abs()          # [..., P, R, M]
    if p == 0:
        return (d != 0).to(x1.dtype).sum(-1)
    if p == float("inf"):
        return d.amax(-1)
    if p == 1:
        return d.sum(-1)
    return d.pow(p).sum(-1).pow(1.0 / p)


@impl(aten._cdist_backward.default)
def cdist_backward(grad, x1, x2, p, dist):
    """d dist[i, j] / d x1[i] (torch calls it again with the roles swapped for x2)."""
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)               # [..., P, R, M]
    g, dist_ = grad.unsqueeze(-1), dist.unsqueeze(-1)
    if p == 0:
        return torch.zeros_like(x1)
    if p == 1:
        w = diff.sign()
    elif p == float("inf"):
        w = diff.sign() * (diff.abs() == dist_).to(diff.dtype)
    elif p < 1:
        w = torch.where(dist_ == 0, 0.0, diff.sign() * diff.abs().pow(p - 1) * dist_.pow(1 - p))
        w = torch.where(diff == 0, 0.0, w)
    else:
        w = torch.where(dist_ == 0, 0.0, diff * diff.abs().pow(p - 2) / dist_.pow(p - 1))
    return (g * w).sum(-2)
