"""The jax side of the device linear algebra (see linalg_lapack.py): one
module-level function per factorization or solve, written with jax.lax.linalg
(which jax lowers to LAPACK custom calls on CPU and cuSOLVER/cuBLAS ones on
GPU) and carried into the lazy graph by kernels.call_jax. Each takes arrays
positionally and its settings as keywords, and returns what torch's aten
overload returns, in torch's conventions (LU pivots 1-based int32, `info`
int32 per matrix, empty placeholders where torch returns them)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_LA = lax.linalg
from jax._src.lax import linalg as _LAX  # geqrf is not re-exported by jax.lax.linalg
from jax.scipy.linalg import expm


def _mT(x):
    return jnp.swapaxes(x, -1, -2)


def _bcast(a, b, b_tail):
    """a (..., m, n) and b (..., *b_tail) with their batch dims broadcast."""
    batch = jnp.broadcast_shapes(a.shape[:-2], b.shape[:b.ndim - b_tail])
    return (jnp.broadcast_to(a, batch + a.shape[-2:]), jnp.broadcast_to(b, batch + b.shape[b.ndim - b_tail:]))


# ---- Cholesky -----------------------------------------------------------------------

def _potrf(a, upper, platform):
    """LAPACK/cuSOLVER potrf as jax lowers it, but keeping `info` (jax's own
    cholesky replaces a failed factor by NaN and drops info)."""
    nb = a.ndim - 2
    col_major = tuple(range(nb)) + (a.ndim - 1, a.ndim - 2)
    outs = (jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:-2], jnp.int32))
    if platform == "cpu":
        from jax._src.lib import lapack  # lazy: CPU only (jaxlib's LAPACK kernels)
        target, attrs = lapack.prepare_lapack_call("potrf_ffi", a.dtype), {"uplo": np.uint8(ord("U" if upper else "L"))}
    else:
        target, attrs = f"{'hip' if platform == 'rocm' else 'cu'}solver_potrf_ffi", {"lower": not upper}
    call = jax.ffi.ffi_call(target, outs, input_layouts=[col_major], output_layouts=[col_major, None],
                            input_output_aliases={0: 0})
    return call(a, **attrs)


def cholesky_ex(a, *, upper, platform):
    """(L, info) of torch.linalg.cholesky_ex: L lower (upper: U = L^H), the
    factor LAPACK computed (partial where info > 0), the other triangle zero."""
    if a.size == 0:  # (the custom call does not take empty operands)
        return a, jnp.zeros(a.shape[:-2], jnp.int32)
    if platform not in ("cpu", "cuda", "rocm"):
        # no potrf kernel (TPU): jax's cholesky gives NaN where it failed; info
        # then says "failed" as n, not the order of the first bad minor
        L = _LA.cholesky(_mT(a) if upper else a, symmetrize_input=False)
        ok = jnp.all(jnp.isfinite(L), axis=(-2, -1))
        info = jnp.where(ok, 0, a.shape[-1]).astype(jnp.int32)
        return (_mT(L) if upper else L), info
    f, info = _potrf(a, upper, platform)
    return (jnp.triu(f) if upper else jnp.tril(f)), info


# ---- LU -----------------------------------------------------------------------------

def _lu(a):
    """(LU, 0-based pivots, permutation, info) with info as LAPACK's getrf:
    the first (1-based) zero on U's diagonal, else 0."""
    lu, piv, perm = _LA.lu(a)
    if min(a.shape[-2:]) == 0 or a.size == 0:
        return lu, piv, perm, jnp.zeros(a.shape[:-2], jnp.int32)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    first = jnp.argmax(zero, axis=-1).astype(jnp.int32) + 1
    return lu, piv, perm, jnp.where(jnp.any(zero, axis=-1), first, 0).astype(jnp.int32)


def lu_factor_ex(a):
    """(LU, pivots 1-based int32, info) of torch.linalg.lu_factor_ex."""
    lu, piv, _, info = _lu(a)
    return lu, piv.astype(jnp.int32) + 1, info


def _perm_matrix(perm, m, dtype):
    """P with A = P @ L @ U when A[perm] = L @ U: P[perm[i], i] = 1."""
    return _mT(jax.nn.one_hot(perm, m, dtype=dtype))


def _unpack(lu, m, n):
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    return L, U


def linalg_lu(a):
    """(P, L, U) of torch.linalg.lu."""
    m, n = a.shape[-2:]
    lu, _, perm, _ = _lu(a)
    L, U = _unpack(lu, m, n)
    return _perm_matrix(perm, m, a.dtype), L, U


def _permutation(piv, m):
    """The permutation (0-based, int32) that the 1-based LAPACK pivots apply."""
    return _LA.lu_pivots_to_permutation(piv.astype(jnp.int32) - 1, m)


def lu_unpack(lu, piv, *, unpack_data, unpack_pivots):
    """(P, L, U) of torch.lu_unpack; what is not unpacked is an empty tensor."""
    m, n = lu.shape[-2:]
    empty = jnp.zeros((0,), lu.dtype)
    L, U = _unpack(lu, m, n) if unpack_data else (empty, empty)
    if unpack_pivots:
        perm = _permutation(piv, m) if piv.shape[-1] else jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32),
                                                                          piv.shape[:-1] + (m,))
        P = _perm_matrix(perm, m, lu.dtype)
    else:
        P = empty
    return P, L, U


def _take_rows(b, perm):
    return jnp.take_along_axis(b, perm[..., :, None], axis=-2)


def _put_rows(b, perm):
    """x with x[perm[i]] = b[i] (the inverse of _take_rows)."""
    inv = jnp.argsort(perm, axis=-1)
    return _take_rows(b, inv)


def _lu_solve_left(lu, perm, b, adjoint):
    """A X = B (A^T X = B with adjoint) for A = P L U (real A)."""
    if not adjoint:
        y = _take_rows(b, perm)
        y = _LA.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True)
        return _LA.triangular_solve(lu, y, left_side=True, lower=False)
    y = _LA.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True)
    y = _LA.triangular_solve(lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True)
    return _put_rows(y, perm)


def lu_solve(lu, piv, b, *, left, adjoint):
    """torch.linalg.lu_solve: X with A X = B (left) or X A = B, A^H with adjoint."""
    n = lu.shape[-1]
    lu, b = _bcast(lu, b, 2)
    piv = jnp.broadcast_to(piv, lu.shape[:-2] + piv.shape[-1:])
    perm = _permutation(piv, n)
    if left:
        return _lu_solve_left(lu, perm, b, adjoint)
    return _mT(_lu_solve_left(lu, perm, _mT(b), not adjoint))


def solve_ex(a, b, *, left, vector):
    """(X, LU, pivots, info) of torch's _linalg_solve_ex (B a batch of vectors if `vector`)."""
    lu, piv, perm, info = _lu(a)
    if vector:
        b = b[..., None]
    luB, bB = _bcast(lu, b, 2)
    permB = jnp.broadcast_to(perm, luB.shape[:-2] + perm.shape[-1:])
    x = _lu_solve_left(luB, permB, bB, False) if left else _mT(_lu_solve_left(luB, permB, _mT(bB), True))
    if vector:
        x = x[..., 0]
    return x, lu, piv.astype(jnp.int32) + 1, info


def inv_ex(a):
    """(A^-1, info) of torch.linalg.inv_ex."""
    lu, _, perm, info = _lu(a)
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    return _lu_solve_left(lu, perm, eye, False), info


def _det_parts(a):
    lu, piv, perm, _ = _lu(a)
    d = jnp.diagonal(lu, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.arange(piv.shape[-1], dtype=piv.dtype), axis=-1)
    parity = jnp.where(swaps % 2 == 1, -1, 1).astype(a.dtype)
    return lu, piv.astype(jnp.int32) + 1, d, parity


def det(a):
    """(det, LU, pivots) of torch's _linalg_det."""
    lu, piv, d, parity = _det_parts(a)
    return parity * jnp.prod(d, axis=-1), lu, piv


def slogdet(a):
    """(sign, log|det|, LU, pivots) of torch's _linalg_slogdet."""
    lu, piv, d, parity = _det_parts(a)
    sign = parity * jnp.prod(jnp.sign(d), axis=-1)
    return sign, jnp.sum(jnp.log(jnp.abs(d)), axis=-1), lu, piv


# ---- triangular solves --------------------------------------------------------------

def solve_triangular(a, b, *, upper, left, unitriangular):
    """torch.linalg.solve_triangular: X with A X = B (left) or X A = B."""
    a, b = _bcast(a, b, 2)
    return _LA.triangular_solve(a, b, left_side=left, lower=not upper, unit_diagonal=unitriangular)


def triangular_solve(b, a, *, upper, transpose, unitriangular):
    """(X, A broadcast) of torch.triangular_solve: op(A) X = B."""
    a, b = _bcast(a, b, 2)
    x = _LA.triangular_solve(a, b, left_side=True, lower=not upper, transpose_a=transpose,
                             unit_diagonal=unitriangular)
    return x, a


def cholesky_solve(b, l, *, upper):
    """torch.cholesky_solve: X with A X = B, A = L L^T (= U^T U if upper)."""
    l, b = _bcast(l, b, 2)
    if upper:
        y = _LA.triangular_solve(l, b, left_side=True, lower=False, transpose_a=True)
        return _LA.triangular_solve(l, y, left_side=True, lower=False)
    y = _LA.triangular_solve(l, b, left_side=True, lower=True)
    return _LA.triangular_solve(l, y, left_side=True, lower=True, transpose_a=True)


def cholesky_inverse(l, *, upper):
    """torch.cholesky_inverse: (L L^T)^-1 (U^T U if upper)."""
    eye = jnp.broadcast_to(jnp.eye(l.shape[-1], dtype=l.dtype), l.shape)
    return cholesky_solve(eye, l, upper=upper)


# ---- QR, Householder ----------------------------------------------------------------

def qr(a, *, mode):
    """(Q, R) of torch.linalg.qr; mode "r" returns an empty Q."""
    if mode == "r":
        r, _ = _LAX.geqrf(a)
        return jnp.zeros((0,), a.dtype), jnp.triu(r[..., :min(a.shape[-2:]), :])
    q, r = _LA.qr(a, full_matrices=mode == "complete")
    return q, r


def geqrf(a):
    """(a, tau) of torch.geqrf (LAPACK's compact Householder form)."""
    return _LAX.geqrf(a)


def householder_product(a, tau):
    """torch.linalg.householder_product (LAPACK orgqr)."""
    return _LA.householder_product(a, tau)


def ormqr(a, tau, c, *, left, transpose):
    """torch.ormqr: op(Q) C or C op(Q), Q from (a, tau)."""
    return _LA.ormqr(a, tau, c, left=left, transpose=transpose)


# ---- spectral -----------------------------------------------------------------------

def svd(a, *, full_matrices, compute_uv):
    """(U, S, Vh) of torch's _linalg_svd; without compute_uv U and Vh are empty."""
    if not compute_uv:
        s = _LA.svd(a, full_matrices=False, compute_uv=False)
        e = jnp.zeros((0,), a.dtype)
        return e, s, e
    u, s, vh = _LA.svd(a, full_matrices=full_matrices, compute_uv=True)
    return u, s, vh


def eigh(a, *, lower, compute_v):
    """(eigenvalues ascending, eigenvectors) of torch's _linalg_eigh (empty vectors without compute_v)."""
    v, w = _LA.eigh(a, lower=lower, symmetrize_input=False, sort_eigenvalues=True)
    if not compute_v:
        return w, jnp.zeros((0,), a.dtype)
    return w, v


def matrix_exp(a):
    """torch.linalg.matrix_exp (jax.scipy's scaling-and-squaring Pade)."""
    if a.size == 0:
        return a
    if a.ndim == 2:
        return expm(a)
    flat = a.reshape((int(np.prod(a.shape[:-2])),) + a.shape[-2:])
    return jax.vmap(expm)(flat).reshape(a.shape)


def lstsq(a, b, *, rcond, vector):
    """(X, |AX - B|^2 per column, rank (int32), singular values) for
    torch.linalg.lstsq: the minimum-norm solution through the SVD, singular
    values at or below rcond * s_max treated as zero (the rank)."""
    if vector:
        b = b[..., None]
    a, b = _bcast(a, b, 2)
    u, s, vh = _LA.svd(a, full_matrices=False)
    keep = s > rcond * s[..., :1] if s.shape[-1] else s > 0
    s_inv = jnp.where(keep, 1 / jnp.where(keep, s, 1), 0)
    x = _mT(vh) @ (s_inv[..., :, None] * (_mT(u) @ b))
    res = jnp.sum(jnp.square(a @ x - b), axis=-2)
    if vector:
        x = x[..., 0]
    return x, res, jnp.sum(keep, axis=-1).astype(jnp.int32), s
