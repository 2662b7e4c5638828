"""Factorizations and solves on the device: Cholesky, LU (solve, inv, det,
slogdet, lu_unpack), triangular solves, QR (geqrf, householder_product,
ormqr), SVD, eigh, matrix_exp, pinv, matrix_sqrth and polar (torch >= 2.14),
addbmm.

Each aten overload torch's dispatcher hands us maps to one function of
_lapack_jax.py, carried into the lazy graph by kernels.call_jax as one
`jax_call` node and lowered by jax for the runtime's platform (LAPACK custom
calls on CPU, cuSOLVER/cuBLAS on GPU). Backward is torch's own autograd
formulas, which call these overloads and other lowered ops.

Errors: torch.linalg.cholesky/inv/solve/lu_factor raise when the input is
not positive-definite/singular; the device only knows at the sync, so
`_linalg_check_errors` (and check_errors=True) registers a deferred check
(_checks.require) that raises torch.linalg.LinAlgError at the sync that
computes it. The `_ex` variants return `info` and never raise.

Known limit (upstream): XLA:CPU hangs executing one program that holds ~20
independent LAPACK potrf calls on 8x64x64 batches (plain jax.jit of the same
function hangs too); a few per program, as a training step has, run fine."""
import torch

from .._tracing import checks as _checks
from .._runtime import runtime
from .._tracing.tensor import XlaTensor
from ..kernels.call_jax import call_jax
from . import _lapack_jax as lapack
from .linalg import integral_scalars, product_sum
from . import aten, functional_of, handler, impl, out_variant

_FLOATS = (torch.float32, torch.float64)


def _jx(fn, *args, **static):
    """fn's results as xla tensors; no autograd here (torch's formulas do it)."""
    return call_jax(fn, *args, _differentiable=False, **static)


def _float(name, *ts):
    for t in ts:
        if t.dtype not in _FLOATS:
            raise RuntimeError(f"{name}: the xla device computes this op in float32 or float64, got {t.dtype}; "
                               f"convert the input with .float() or .double() first")
    if len({t.dtype for t in ts}) > 1:
        raise RuntimeError(f"{name}: Expected all inputs to have the same dtype, but got "
                           f"{', '.join(str(t.dtype) for t in ts)}")


def _matrices(name, a, square=False, what="A"):
    if a.dim() < 2:
        raise RuntimeError(f"{name}: The input tensor {what} must have at least 2 dimensions.")
    if square and a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"{name}: {what} must be batches of square matrices, but they are "
                           f"{a.shape[-2]} by {a.shape[-1]} matrices")
    _float(name, a)


# ---- errors known at the sync -----------------------------------------------------

def _reason(api):
    if "cholesky" in api:
        return "The factorization could not be completed because the input is not positive-definite"
    if "inv" in api:
        return "The inversion could not be completed because the input matrix is singular (a zero diagonal element of U)"
    if "solve" in api:
        return "The solver failed because the input matrix is singular."
    if "lu_factor" in api:
        return ("U has a zero on its diagonal and using it on lu_solve would result in a division by zero. If you "
                "still want to perform the factorization, consider calling linalg.lu(A, pivot) or "
                "linalg.lu_factor_ex(A, pivot)")
    if "svd" in api or "eig" in api:
        return ("The algorithm failed to converge because the input matrix is ill-conditioned or has too many "
                "repeated singular values")
    return "The computation failed (LAPACK info != 0)"


def _require_ok(info, api):
    """Deferred: raise torch.linalg.LinAlgError at the sync if any info != 0."""
    _checks.require((info != 0)._lt, f"{api}: {_reason(api)}", torch.linalg.LinAlgError)


@impl(aten._linalg_check_errors.default)
@_checks.staged
def linalg_check_errors(info, api_name, *, is_matrix):
    if not isinstance(info, XlaTensor):
        return aten._linalg_check_errors.default(info, api_name, is_matrix=is_matrix)
    if info.numel():
        _require_ok(info, api_name)


# ---- Cholesky ---------------------------------------------------------------------

def _cholesky(name, a, upper):
    _matrices(name, a, square=True)
    return _jx(lapack.cholesky_ex, a, upper=bool(upper), platform=runtime.platform())


@impl(aten.linalg_cholesky_ex.default)
@_checks.staged
def linalg_cholesky_ex(a, *, upper=False, check_errors=False):
    L, info = _cholesky("linalg.cholesky", a, upper)
    if check_errors:
        _require_ok(info, "linalg.cholesky")
    return L, info


@impl(aten.cholesky.default)
@_checks.staged
def cholesky(a, upper=False):
    L, info = _cholesky("cholesky", a, upper)
    _require_ok(info, "cholesky")
    return L


@impl(aten.cholesky_solve.default)
def cholesky_solve(b, l, upper=False):
    _matrices("cholesky_solve", b, what="b")
    _matrices("cholesky_solve", l, square=True, what="u")
    _float("cholesky_solve", b, l)
    return _jx(lapack.cholesky_solve, b, l, upper=bool(upper))


@impl(aten.cholesky_inverse.default)
def cholesky_inverse(l, upper=False):
    _matrices("cholesky_inverse", l, square=True, what="input")
    return _jx(lapack.cholesky_inverse, l, upper=bool(upper))


# ---- LU family --------------------------------------------------------------------

@impl(aten.linalg_lu_factor_ex.default)
@_checks.staged
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    _matrices("linalg.lu_factor", a)
    if not pivot:
        raise RuntimeError("linalg.lu_factor: LU without pivoting is not implemented on the xla device; "
                           "use pivot=True")
    LU, piv, info = _jx(lapack.lu_factor_ex, a)
    if check_errors:
        _require_ok(info, "linalg.lu_factor")
    return LU, piv, info


@impl(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    _matrices("linalg.lu", a)
    if not pivot:
        raise RuntimeError("linalg.lu: LU without pivoting is not implemented on the xla device; use pivot=True")
    return _jx(lapack.linalg_lu, a)


@impl(aten.lu_unpack.default)
def lu_unpack(lu, piv, unpack_data=True, unpack_pivots=True):
    _matrices("lu_unpack", lu, what="LU_data")
    if piv.dtype != torch.int32:
        raise RuntimeError(f"lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype, "
                           f"got {piv.dtype}")
    return _jx(lapack.lu_unpack, lu, piv, unpack_data=bool(unpack_data), unpack_pivots=bool(unpack_pivots))


@impl(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, piv, b, *, left=True, adjoint=False):
    _matrices("linalg.lu_solve", lu, square=True, what="LU")
    _matrices("linalg.lu_solve", b, what="B")
    _float("linalg.lu_solve", lu, b)
    n = lu.shape[-1]
    if b.shape[-2 if left else -1] != n:
        raise RuntimeError(f"linalg.lu_solve: Incompatible shapes of A and B for the equation "
                           f"{'AX = B' if left else 'XA = B'} ({n}x{n} and {b.shape[-2]}x{b.shape[-1]})")
    return _jx(lapack.lu_solve, lu, piv, b, left=bool(left), adjoint=bool(adjoint))


@impl(aten._linalg_solve_ex.default)
@_checks.staged
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    _matrices("linalg.solve", a, square=True)
    _float("linalg.solve", a, b)
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    r = _jx(lapack.solve_ex, a, b, left=bool(left), vector=vector)
    if check_errors:
        _require_ok(r[3], "linalg.solve")
    return r


@impl(aten.linalg_inv_ex.default)
@_checks.staged
def linalg_inv_ex(a, *, check_errors=False):
    _matrices("linalg.inv", a, square=True)
    inv, info = _jx(lapack.inv_ex, a)
    if check_errors:
        _require_ok(info, "linalg.inv")
    return inv, info


def _det_operand(a):
    """torch factors A^T when A is contiguous (det(A^T) = det(A)), and its
    backward formulas (linalg_det_backward, slogdet_backward) read LU that way."""
    return a.mT if a.is_contiguous() else a


@impl(aten._linalg_det.default)
def linalg_det(a):
    _matrices("linalg.det", a, square=True)
    return _jx(lapack.det, _det_operand(a))


@impl(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    _matrices("linalg.slogdet", a, square=True)
    return _jx(lapack.slogdet, _det_operand(a))


# ---- triangular solves ------------------------------------------------------------

@impl(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    _matrices("linalg.solve_triangular", a, square=True)
    _matrices("linalg.solve_triangular", b, what="B")
    _float("linalg.solve_triangular", a, b)
    return _jx(lapack.solve_triangular, a, b, upper=bool(upper), left=bool(left), unitriangular=bool(unitriangular))


@impl(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    _matrices("triangular_solve", a, square=True)
    _matrices("triangular_solve", b, what="b")
    _float("triangular_solve", b, a)
    return _jx(lapack.triangular_solve, b, a, upper=bool(upper), transpose=bool(transpose),
               unitriangular=bool(unitriangular))


# ---- QR, Householder --------------------------------------------------------------

@impl(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), "
                           f"'r', or 'complete'")
    _matrices("linalg.qr", a)
    return _jx(lapack.qr, a, mode=mode)


@impl(aten.geqrf.default)
def geqrf(a):
    _matrices("geqrf", a)
    return _jx(lapack.geqrf, a)


@impl(aten.linalg_householder_product.default)
def linalg_householder_product(a, tau):
    _matrices("householder_product", a)
    _float("householder_product", a, tau)
    m, n = a.shape[-2:]
    if not (m >= n >= tau.shape[-1]):
        raise RuntimeError(f"torch.linalg.householder_product: expected input.shape[-2] >= input.shape[-1] >= "
                           f"tau.shape[-1], got {m}, {n}, {tau.shape[-1]}")
    return _jx(lapack.householder_product, a, tau)


@impl(aten.ormqr.default)
def ormqr(a, tau, c, left=True, transpose=False):
    _matrices("ormqr", a)
    _float("ormqr", a, tau, c)
    return _jx(lapack.ormqr, a, tau, c, left=bool(left), transpose=bool(transpose))


# ---- spectral ---------------------------------------------------------------------

@impl(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    _matrices("linalg.svd", a)
    return _jx(lapack.svd, a, full_matrices=bool(full_matrices), compute_uv=bool(compute_uv))


@impl(aten._linalg_eigh.default)
def linalg_eigh(a, UPLO="L", compute_v=True):
    if UPLO not in ("L", "U"):
        raise RuntimeError(f"linalg.eigh: Expected UPLO argument to be 'L' or 'U', but got {UPLO}")
    _matrices("linalg.eigh", a, square=True)
    return _jx(lapack.eigh, a, lower=UPLO == "L", compute_v=bool(compute_v))


@impl(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    _matrices("linalg.matrix_exp", a, square=True)
    return _jx(lapack.matrix_exp, a)


# ---- composites (torch ops over the above) ----------------------------------------

def _atol_rtol(a, atol, rtol):
    """torch's get_atol_rtol: rtol defaults to eps * max(m, n), or 0 where atol > 0."""
    dt = torch.float64 if a.dtype == torch.float64 else torch.float32
    if atol is None:
        atol_t = torch.zeros((), dtype=dt, device=a.device)
    else:
        atol_t = atol.to(a.device, dt) if isinstance(atol, torch.Tensor) else torch.full((), atol, dtype=dt,
                                                                                           device=a.device)
    if rtol is not None:
        rtol_t = rtol.to(a.device, dt) if isinstance(rtol, torch.Tensor) else torch.full((), rtol, dtype=dt,
                                                                                          device=a.device)
    else:
        default = torch.finfo(a.dtype).eps * max(a.shape[-1], a.shape[-2])
        rtol_t = torch.full((), default, dtype=dt, device=a.device)
        if atol is not None:
            rtol_t = torch.where(atol_t > 0, torch.zeros_like(rtol_t), rtol_t)
    return atol_t, rtol_t


@impl(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    _matrices("linalg.pinv", a)
    if a.numel() == 0:
        return torch.empty(a.shape[:-2] + (a.shape[-1], a.shape[-2]), dtype=a.dtype, device=a.device)
    atol_t, rtol_t = _atol_rtol(a, atol, rtol)
    if not hermitian:
        u, s, vh = aten._linalg_svd.default(a, False, True)
        max_val = s.narrow(-1, 0, 1)
        tol = torch.maximum(atol_t.unsqueeze(-1), rtol_t.unsqueeze(-1) * max_val)
        s_inv = torch.where(s > tol, s.reciprocal(), torch.zeros((), dtype=s.dtype, device=s.device)).to(a.dtype)
        return torch.matmul(vh.mH * s_inv.unsqueeze(-2), u.mH)
    w, v = aten._linalg_eigh.default(a, "L", True)
    s_abs = w.abs()
    max_val = s_abs.amax(-1, keepdim=True)
    tol = torch.maximum(atol_t.unsqueeze(-1), rtol_t.unsqueeze(-1) * max_val)
    s_inv = torch.where(s_abs > tol, w.reciprocal(), torch.zeros((), dtype=w.dtype, device=w.device)).to(a.dtype)
    return torch.matmul(v * s_inv.unsqueeze(-2), v.mH)


@impl(aten.linalg_matrix_sqrth.default)
def linalg_matrix_sqrth(a):
    """torch >= 2.14: the principal square root of symmetric positive-definite
    matrices (lower triangle read), as torch computes it from eigh:
    V diag(sqrt(max(w, 0))) V^H (a negative eigenvalue counts as 0, as CPU)."""
    _matrices("linalg.matrix_sqrth", a, square=True)
    w, v = aten._linalg_eigh.default(a, "L", True)
    return torch.matmul(v * w.clamp_min(0).sqrt().unsqueeze(-2), v.mH)


@impl(aten.linalg_polar.default)
def linalg_polar(a):
    """torch >= 2.14: the polar decomposition A = U H (m >= n) from the thin
    SVD A = W diag(s) Vh, as torch's CPU kernel: U = W Vh, H = Vh^H diag(s) Vh."""
    _matrices("linalg.polar", a)
    m, n = a.shape[-2:]
    if m < n:
        raise RuntimeError(f"linalg.polar: input must have at least as many rows as columns, but got {m} by {n} "
                           f"matrices")
    w, s, vh = aten._linalg_svd.default(a, False, True)
    return torch.matmul(w, vh), torch.matmul(vh.mH * s.unsqueeze(-2), vh)


@impl(aten.addbmm.default)
def addbmm(c, b1, b2, *, beta=1, alpha=1):
    if b1.dim() != 3 or b2.dim() != 3:
        raise RuntimeError(f"addbmm: batch1 must be a 3D tensor, batch2 must be a 3D tensor (got {b1.dim()}D and "
                           f"{b2.dim()}D)")
    if b1.dtype.is_floating_point and b1.dtype == b2.dtype and b1.shape[0] == b2.shape[0] \
            and b1.shape[2] == b2.shape[1]:
        # one dot contracting batch and k: one rounding (bmm then a sum over
        # the batch rounded each product to bf16 first, and was two programs);
        # in half precision also the scaling and the sum, in float32 (CPU's
        # kernel rounds once per batch: addmm_ into the result batch by batch)
        return product_sum(c, b1, b2, ([], [], [0, 2], [0, 1]), beta, alpha)
    p = torch.bmm(b1, b2)
    p = p.sum(0, dtype=p.dtype)  # int32 stays int32, as torch's kernel (a plain sum of int32 is int64)
    beta, alpha = integral_scalars(p.dtype, beta, alpha)
    if alpha != 1:
        p = p * alpha
    if beta == 0:  # torch ignores c then (NaN included)
        return p
    return (c * beta if beta != 1 else c) + p


_LSTSQ_DRIVERS = ("gels", "gelsy", "gelsd", "gelss")


@impl(aten.linalg_lstsq.default)
def linalg_lstsq(a, b, rcond=None, *, driver=None):
    """torch.linalg.lstsq with the CPU's outputs per driver (default gelsy):
    rank for gelsy/gelsd/gelss, singular values for gelsd/gelss, residuals
    for m > n except with gelsy (gelsd/gelss: only if every matrix has full
    rank, which is read from the device: an output shape that depends on the
    data, as torch's own kernel reads it)."""
    _matrices("torch.linalg.lstsq", a)
    _float("torch.linalg.lstsq", a, b)
    driver = driver or "gelsy"
    if driver not in _LSTSQ_DRIVERS:
        raise RuntimeError(f"torch.linalg.lstsq: parameter `driver` should be one of {_LSTSQ_DRIVERS}")
    m, n = a.shape[-2:]
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    if b.shape[-1 if vector else -2] != m:
        raise RuntimeError(f"torch.linalg.lstsq: input.size(-2) should match other.size(-2) ({m} vs "
                           f"{b.shape[-1 if vector else -2]})")
    if rcond is None:
        rcond = torch.finfo(a.dtype).eps * max(m, n)
    x, res, rank, s = _jx(lapack.lstsq, a, b, rcond=float(rcond), vector=vector)
    def empty(dtype=a.dtype):  # a new tensor each: autograd marks outputs one by one
        return torch.empty(0, dtype=dtype, device=a.device)
    rank = rank.to(torch.int64) if driver != "gels" else empty(torch.int64)
    sv = s if driver in ("gelsd", "gelss") else empty()
    if m > n and driver != "gelsy" and (driver == "gels" or bool((rank == n).all().item())):
        return x, res, rank, sv
    return x, empty(), rank, sv


# torch.linalg.matrix_rank(x, out=o): torch's composite kernel for the out=
# overloads, given a tensor subclass, rebinds its C++ `result` to a new sum
# instead of writing it, so `o` kept its old values (torch 2.13,
# linalg_matrix_rank_out). A composite kernel runs above __torch_dispatch__;
# one registered on the xla device's autograd key comes first: it runs the
# functional overload and writes o, as the other out= overloads do (out_variant).
def _matrix_rank_out_kernel(func):
    h = None

    def kernel(*args, **kwargs):
        nonlocal h
        if h is None:
            h = out_variant(handler(functional_of(func)), func)
        return h(*args, **kwargs)
    return kernel


_LIB = torch.library.Library("aten", "IMPL")
for _ov in ("out", "out_tol_tensor", "atol_rtol_tensor_out", "atol_rtol_float_out"):
    _LIB.impl(f"linalg_matrix_rank.{_ov}", _matrix_rank_out_kernel(getattr(aten.linalg_matrix_rank, _ov)),
              "AutogradPrivateUse1")
