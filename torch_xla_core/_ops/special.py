"""Special math functions and the elementwise ops torch's decompositions turn
into prims (acosh, log2, exp2, hypot, signbit, ...), lowered on the device:

- core ops (csrc/ops/elementwise.cpp): CHLO ops where XLA has them (lgamma,
  digamma, next_after, bessel_i1e, erfc, acosh...) and
  short StableHLO formulas (hypot, copysign, fmax, log2, exp2, ...);
- jax's own implementations (jax.lax, jax.scipy.special: i0, i0e, igamma,
  ndtri, log_ndtr, erfcx, frexp, cumlogsumexp) inlined as one jax_call node
  (kernels/call_jax.py); Hurwitz zeta and polygamma also go through jax, as
  lax.zeta (chlo.zeta) after summing the leading terms directly, which
  chlo.zeta/chlo.polygamma get wrong for small or negative arguments;
- what neither has: the orthogonal polynomials, by the recurrences torch
  uses (special_polynomials.py), Bessel J/Y/K and Airy Ai from textbook
  series, expansions and integrals (special_bessel.py), both through
  call_jax; and small
  compositions of core ops (round(decimals)).

Each aten overload is registered together with the prims overload its
torch decomposition reaches, so decompositions of other ops (mvlgamma,
kaiser_window, logaddexp2, ...) lower too. Gradients come from torch's
autograd formulas, which call these same ops (digamma's is polygamma)."""
import math

import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax

from .._runtime.dtypes import code
from .._tracing.tensor import OP, XlaTensor, lazy_op, wrapped_op
from ..kernels.call_jax import call_jax
from . import XLA, assign, aten, convert, impl, mapping
from . import special_bessel as _bessel_fns
from . import special_polynomials as _poly
from .dtype_rules import INTEGRAL, INTEGRAL_PROMOTED

prims = torch.ops.prims


def _floating(x):
    """x as a float tensor: integers and bools become the default float dtype (torch's int_to_float)."""
    if isinstance(x, XlaTensor) and not (x.is_floating_point() or x.is_complex()):
        return convert(x, torch.get_default_dtype())
    return x


# -- core ops: one mapping row per aten overload and its prims twin ----------
_U, _B = (XLA,), None  # unary: an xla tensor; binary: tensors or numbers
for _core_name, _ranks, _overloads in [
    ("acosh", _U, (aten.acosh.default, prims.acosh.default)),
    ("asinh", _U, (aten.asinh.default, prims.asinh.default)),
    ("atanh", _U, (aten.atanh.default, prims.atanh.default)),
    ("erfc", _U, (aten.erfc.default, prims.erfc.default)),
    ("lgamma", _U, (aten.lgamma.default, prims.lgamma.default)),
    ("digamma", _U, (aten.digamma.default, prims.digamma.default)),
    ("log2", _U, (aten.log2.default, prims.log2.default)),
    ("log10", _U, (aten.log10.default, prims.log10.default)),
    ("exp2", _U, (aten.exp2.default, prims.exp2.default)),
    ("signbit", _U, (aten.signbit.default, prims.signbit.default)),
    ("bessel_i1e", _U, (aten.special_i1e.default, prims.bessel_i1e.default)),
    ("bessel_i1", _U, (aten.special_i1.default, prims.bessel_i1.default, aten.special_modified_bessel_i1.default)),
    ("spherical_bessel_j0", _U, (aten.special_spherical_bessel_j0.default, prims.spherical_bessel_j0.default)),
    ("round", _U, (prims.round.default,)),
    ("fmax", _B, (aten.fmax.default, prims.fmax.default)),
    ("fmin", _B, (aten.fmin.default, prims.fmin.default)),
    ("hypot", _B, (prims.hypot.default,)),
    ("nextafter", _B, (prims.nextafter.default,)),
    ("copysign", _B, (aten.copysign.Tensor, aten.copysign.Scalar)),
]:
    mapping(*_overloads, op=_core_name, ranks=_ranks)
# float math torch's kernels refuse for integers and bools (dtype_rules)
mapping(aten.hypot.default, op="hypot", refuses=INTEGRAL_PROMOTED)
mapping(aten.nextafter.default, op="nextafter", refuses=INTEGRAL_PROMOTED)


@impl(aten.polygamma.default)
def polygamma(n, x):
    if n < 0:
        raise RuntimeError(f"polygamma(n, x) does not support negative n (got n={n}).")
    if n == 0:
        return wrapped_op(OP.digamma, (x._lt,), ())
    return _jax(_j_polygamma, x, n=n)


@impl(aten.polygamma_.default)
def polygamma_(x, n):  # (self first: the functional takes n first, so resolve() cannot pair them)
    assign(x, polygamma(n, x))
    return x


@impl(aten.round.decimals, refuses=INTEGRAL)
def round_decimals(x, *, decimals=0):
    # as ATen: nearbyint(x * 10^d) / 10^d, or for d < 0 nearbyint(x / 10^-d) * 10^-d
    if decimals == 0:
        return wrapped_op(OP.round, (x._lt,), ())
    if not x.is_floating_point():
        raise RuntimeError(f"round: decimals={decimals} is only supported for floating-point tensors (got {x.dtype})")
    scale = float(torch.tensor(10.0 ** abs(decimals), dtype=x.dtype))  # 10^|d| in x's dtype, as ATen's static_cast
    if decimals > 0:
        r = lazy_op(OP.round, (lazy_op(OP.mul, (x._lt, scale), ()),), ())
        return wrapped_op(OP.div, (r, scale), ())
    r = lazy_op(OP.round, (lazy_op(OP.div, (x._lt, scale), ()),), ())
    return wrapped_op(OP.mul, (r, scale), ())


# -- jax implementations inlined as one jax_call node -------------------------

def _jax(fn, *tensors, x64=None, complex_ok=False, **static):
    """fn (a jax function of same-shaped float arrays) on xla tensors: promoted
    as torch promotes (integers to float), broadcast, f16/bf16 computed in
    float32 (jax's series lose their accuracy in half precision). Complex
    tensors only where fn computes on them (complex_ok); else an error, as
    torch's real-only kernels raise (a cast would drop the imaginary part)."""
    ts = [t for t in tensors]
    dtype = ts[0].dtype
    for t in ts[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    if dtype.is_complex and not complex_ok:
        raise NotImplementedError(f"{fn.__name__.removeprefix('_j_')}: not implemented for complex tensors (got "
                                  f"{dtype}), as in torch")
    if not dtype.is_floating_point and not dtype.is_complex:
        dtype = torch.get_default_dtype()
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    shape = torch.broadcast_shapes(*[t.shape for t in ts])
    ts = [convert(t, compute) for t in ts]
    ts = [t if tuple(t.shape) == tuple(shape) else t.expand(shape).contiguous() for t in ts]
    r = call_jax(fn, *ts, x64=x64, _differentiable=False, **static)
    return convert(r, dtype) if isinstance(r, XlaTensor) else r


def _j_zeta(s, q):
    """Hurwitz zeta(s, q) as ATen computes it (Cephes): the terms (q + k)^-s
    summed directly until q + k > 9, the rest by lax.zeta (chlo.zeta), whose
    Euler-Maclaurin tail is inaccurate for small or negative q. NaN for s < 1,
    inf at s = 1 and at the poles q = 0, -1, -2, ..."""
    m = jnp.where(jnp.isfinite(q), jnp.clip(jnp.ceil(9 - q), 0, None), 0)
    top = jnp.max(m, initial=0).astype(jnp.int32)

    def body(k, acc):
        kf = k.astype(q.dtype)
        return acc + jnp.where(kf < m, jnp.power(q + kf, -s), 0)

    head = lax.fori_loop(0, top, body, jnp.zeros_like(q))
    z = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, head + lax.zeta(s, q + m))  # a pole
    return jnp.where(s < 1, jnp.nan, jnp.where(s == 1, jnp.inf, z))


def _j_trigamma(x):
    """psi^(1)(x) as ATen's CPU kernel computes it (its own trigamma, not
    zeta): reflection below 1/2, six recurrence steps, then the asymptotic
    series; in x's dtype, so it agrees with torch near the poles too."""
    pi = jnp.asarray(jnp.pi, x.dtype)
    reflect = x < 0.5
    s = jnp.sin(pi * x)
    result = jnp.where(reflect, -(pi * pi) / (s * s), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(reflect, -result, result)


def _j_polygamma(x, *, n):
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 2, as ATen; n = 1 by
    ATen's trigamma."""
    if n == 1:
        return _j_trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    factorial = float(math.factorial(n)) if n <= 170 else math.inf  # 171! overflows float64, as exp(lgamma) does
    return sign * factorial * _j_zeta(jnp.full_like(x, n + 1), x)


def _j_i0e(x):
    return lax.bessel_i0e(x)


def _j_i0(x):
    # i0(x) = exp(|x|) i0e(x) (NaN at +-inf, as ATen's)
    return jnp.exp(jnp.abs(x)) * lax.bessel_i0e(x)


def _j_igamma(a, x):
    return jnp.where(jnp.isinf(a) & jnp.isinf(x), jnp.nan, lax.igamma(a, x))  # ATen: NaN at (inf, inf)


def _j_igammac(a, x):
    return jnp.where(jnp.isinf(a) & jnp.isinf(x), jnp.nan, lax.igammac(a, x))


def _j_ndtri(p):
    return jss.ndtri(p)


def _j_log_ndtr(x):
    return jss.log_ndtr(x)


def _j_erfcx(x):
    return jss.erfcx(x)


def _j_frexp(x):
    """frexp from the bits alone: XLA:CPU treats subnormal operands of float
    arithmetic as 0 (jnp.frexp scales subnormals by a float product, so every
    subnormal came out 0.5 * 2**-149). A subnormal's exponent comes from its
    mantissa's leading zeros; 0, inf and nan are returned with exponent 0,
    as torch does."""
    fi = jnp.finfo(x.dtype)
    nbits, nmant, bias = fi.bits, fi.nmant, fi.maxexp - 1
    u = jnp.uint32 if nbits == 32 else jnp.uint64
    b = lax.bitcast_convert_type(x, u)
    field, mant = (b >> nmant) & u((1 << (nbits - 1 - nmant)) - 1), b & u((1 << nmant) - 1)
    top = (nbits - 1) - lax.clz(mant).astype(jnp.int32)  # the mantissa's highest set bit (-1 when 0)
    sub = (field == 0) & (mant != 0)
    special = ((field == 0) & (mant == 0)) | (field == (1 << (nbits - 1 - nmant)) - 1)
    e = jnp.where(sub, top - (nmant + bias - 2), field.astype(jnp.int32) - (bias - 1))
    shift = jnp.where(sub, nmant - top, 0).astype(u)
    m_bits = (b & u(1 << (nbits - 1))) | u((bias - 1) << nmant) | ((mant << shift) & u((1 << nmant) - 1))
    m = lax.bitcast_convert_type(m_bits, x.dtype)
    return jnp.where(special, x, m), jnp.where(special, 0, e)


def _j_logcumsumexp(x, *, axis):
    return lax.cumlogsumexp(x, axis=axis)


impl(aten.special_zeta.default, prims.zeta.default)(lambda s, q: _jax(_j_zeta, s, q))
impl(aten.special_zeta.self_scalar)(lambda s, q: _jax(_j_zeta, _scalar_tensor(s, q), q))
impl(aten.special_zeta.other_scalar)(lambda s, q: _jax(_j_zeta, s, _scalar_tensor(q, s)))
impl(aten.special_i0e.default, prims.bessel_i0e.default)(lambda x: _jax(_j_i0e, x))
impl(aten.i0.default, prims.bessel_i0.default, aten.special_modified_bessel_i0.default)(lambda x: _jax(_j_i0, x))
impl(aten.igamma.default, refuses=INTEGRAL_PROMOTED)(impl(prims.igamma.default)(lambda a, x: _jax(_j_igamma, a, x)))
impl(aten.igammac.default, refuses=INTEGRAL_PROMOTED)(impl(prims.igammac.default)(lambda a, x: _jax(_j_igammac, a, x)))
impl(aten.special_ndtri.default, prims.ndtri.default)(lambda x: _jax(_j_ndtri, x))
impl(aten.special_log_ndtr.default)(lambda x: _jax(_j_log_ndtr, x))
impl(aten.special_erfcx.default, prims.erfcx.default)(lambda x: _jax(_j_erfcx, x))


@impl(aten.frexp.Tensor, prims.frexp.default)
def frexp(x):
    if not x.is_floating_point():
        raise RuntimeError(f"torch.frexp() only supports floating-point dtypes (got {x.dtype})")
    m, e = _jax(_j_frexp, x)  # (f16/bf16 computed in float32: same mantissa and exponent)
    return convert(m, x.dtype), convert(e, torch.int32)


@impl(aten.logcumsumexp.default, refuses=INTEGRAL)
def logcumsumexp(x, dim):
    if x.dim() == 0:
        return wrapped_op(OP.alias, (_floating(x)._lt,), ())
    return _jax(_j_logcumsumexp, x, axis=dim % x.dim(), complex_ok=True)


# -- orthogonal polynomials (x, n): special_polynomials.py ---------------------

def _polynomial(fn):
    def h(x, n):
        if not isinstance(x, XlaTensor):
            x = _scalar_tensor(x, n)
        if not isinstance(n, XlaTensor):
            n = _scalar_tensor(n, x)
        return _jax(fn, x, n)
    return h


def _scalar_tensor(value, like):
    """A Python number (or 0-d CPU tensor) as a 0-d xla tensor, with the dtype torch's promotion gives it."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    dt = torch.result_type(like, value) if isinstance(value, (int, float)) else like.dtype
    return wrapped_op(OP.full, (), (float(value), code(dt), []))


for _name, _fn in _poly.POLYNOMIALS.items():
    _packet = getattr(aten, "special_" + _name)
    impl(_packet.default, _packet.x_scalar, _packet.n_scalar)(_polynomial(_fn))


# -- Bessel functions jax lacks: special_bessel.py (computed in float64) ------

def _bessel(fn):
    return lambda x: _jax(fn, x, x64=True)


for _name, _fn in _bessel_fns.FUNCTIONS.items():
    _overloads = [getattr(aten, "special_" + _name).default]
    if hasattr(prims, _name):
        _overloads.append(getattr(prims, _name).default)
    impl(*_overloads)(_bessel(_fn))
