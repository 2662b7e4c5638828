"""Complex numbers: aten's complex-specific ops -> core ops (csrc/ops/complex.cpp,
the complex rows of csrc/ops/elementwise.cpp).

Views stay views, as in torch: view_as_real / view_as_complex reinterpret
the buffer (writes through them reach the base, strides are torch's), and
torch's lazy conjugate and negative bits (`_conj`, `_neg_view`) are view
ops that read conj(x) / -x and write back conj(v) / -v. Our tensors never
carry the bits themselves: `is_conj()` is False and `resolve_conj()` is the
identity, with the same values as torch's.

aten.real / aten.imag are torch composites (view_as_real + select), so
`x.real.zero_()` writes through to x as on CPU."""
import math

import torch
from jax import lax

from .._runtime import runtime
from .._runtime.dtypes import CODE, UnsupportedDtype, code
from .._tracing.tensor import OP, wrapped_op, lazy_view, wrapped_view
from ..kernels.call_jax import call_jax
from . import XLA, aten, impl, mapping


@impl(aten.view_as_real.default)
def view_as_real(x):
    if not x.is_complex():
        raise RuntimeError("view_as_real is only supported for complex tensors")
    return wrapped_view(OP.view_as_real, x._lt, ())


@impl(aten.view_as_complex.default)
def view_as_complex(x):
    if x.dtype not in (torch.float32, torch.float64):
        if x.dtype == torch.float16:
            raise UnsupportedDtype(torch.complex32, "aten::view_as_complex")
        raise RuntimeError(f"view_as_complex is only supported for floating point tensors, but got a tensor of "
                           f"scalar type: {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if x.stride(-1) != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in x.stride()[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    if x.storage_offset() % 2:
        raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    return wrapped_view(OP.view_as_complex, x._lt, ())


@impl(aten._conj.default)
def conj_view(x):
    if not x.is_complex():
        return wrapped_view(OP.alias, x._lt, ())
    return wrapped_view(OP.conj_view, x._lt, ())


neg_view = mapping(aten._neg_view.default, op="neg_view", ranks=(XLA,), view=True)
# (conj_physical.default is a torch composite: it reaches us as _conj_physical)
conj_physical = mapping(aten._conj_physical.default, op="conj", ranks=(XLA,))


def _check_parts(op, a, b):
    for t in (a, b):
        if t.dtype == torch.float16:
            raise UnsupportedDtype(torch.complex32, f"aten::{op}")
    if a.dtype not in (torch.float32, torch.float64) or b.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"Expected both inputs to be Half, Float or Double tensors but got {a.dtype} and {b.dtype}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected object of scalar type {a.dtype} but got scalar type {b.dtype} for second argument")


@impl(aten.complex.default)
def complex_(real, imag):
    _check_parts("complex", real, imag)
    return wrapped_op(OP.complex, (real._lt, imag._lt), ())


@impl(aten.polar.default)
def polar(abs, angle):
    _check_parts("polar", abs, angle)
    re = wrapped_op(OP.mul, (abs._lt, wrapped_op(OP.cos, (angle._lt,), ())._lt), ())
    im = wrapped_op(OP.mul, (abs._lt, wrapped_op(OP.sin, (angle._lt,), ())._lt), ())
    return wrapped_op(OP.complex, (re._lt, im._lt), ())


@impl(aten.angle.default)
def angle(x):
    if not (x.is_floating_point() or x.is_complex()):  # torch: integers and bools give float
        x = wrapped_op(OP.convert, (x._lt,), (code(torch.get_default_dtype()),))
    return wrapped_op(OP.angle, (x._lt,), ())


@impl(aten.sgn.default)
def sgn(x):
    """x / |x| (0 where x is 0) for complex x; sign(x) for real x."""
    if not x.is_complex():
        return wrapped_op(OP.sign, (x._lt,), ())
    a = wrapped_op(OP.abs, (x._lt,), ())
    q = wrapped_op(OP.div, (x._lt, a._lt), ())
    return wrapped_op(OP.where, (wrapped_op(OP.eq, (a._lt, 0), ())._lt, 0, q._lt), ())


def _jax_eig(a, vectors):
    w, *rest = lax.linalg.eig(a, compute_left_eigenvectors=False, compute_right_eigenvectors=vectors)
    return (w, rest[0]) if vectors else w


def _eig(op, a, vectors):
    """linalg.eig through jax (LAPACK geev on CPU, as torch's CPU kernel: the
    same eigenvector normalization), one node of the graph (call_jax)."""
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise RuntimeError(f"{op}: A must be batches of square matrices, but they are "
                           f"{a.shape[-2] if a.dim() > 1 else a.numel()} by {a.shape[-1] if a.dim() else 1} matrices")
    if a.dtype not in (torch.float32, torch.float64, torch.complex64, torch.complex128):
        raise RuntimeError(f"{op}: Expected a floating point or complex tensor as input. Got {a.dtype}")
    try:
        return call_jax(_jax_eig, a, vectors, _differentiable=False)
    except NotImplementedError as e:
        raise NotImplementedError(
            f"{op} is not supported on the xla device on platform '{runtime.platform()}': jax implements a "
            f"nonsymmetric eigendecomposition only on some platforms ({e}). Compute it on the CPU "
            f"(torch.linalg.eig(A.cpu())) or use torch.linalg.eigh for a symmetric/Hermitian A.") from None


@impl(aten.linalg_eig.default)
def linalg_eig(a):
    return _eig("linalg.eig", a, True)


@impl(aten._linalg_eigvals.default, aten.linalg_eigvals.default)
def linalg_eigvals(a):
    return _eig("linalg.eigvals", a, False)


def root_as(lt, dtype):
    """The whole storage of LazyTensor lt (its root) read as `dtype`, a view:
    for as_strided over a view_as_real/view_as_complex view, whose strides
    count elements of the view's dtype, not of the storage's. Writes through
    the result reach the storage."""
    root = lt.root()
    have = root.dtype
    if have == CODE[dtype]:
        return root
    n = math.prod(root.shape)
    if dtype.is_complex:  # a real storage of 2n floats read as n complex numbers
        if n % 2:
            raise RuntimeError(f"as_strided: a {dtype} view of a storage of {n} real elements (an odd number)")
        return lazy_view(OP.view_as_complex, lazy_view(OP.reshape, root, ([n // 2, 2],)), ())
    return lazy_view(OP.reshape, lazy_view(OP.view_as_real, root, ()), ([2 * n],))
