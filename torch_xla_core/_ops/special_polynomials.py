"""Orthogonal polynomials P_n(x) of torch.special (chebyshev T/U/V/W and
their shifted forms, hermite H/He, laguerre L, legendre P) as jax functions
of (x, n) arrays, for call_jax (used by _ops/special.py).

Hand-written because neither XLA nor jax has them. They follow the
definitions torch's CPU kernels use, so results agree with them: n is
truncated to an integer, n < 0 gives 0, the endpoints |x| = 1 have closed
forms, Chebyshev polynomials of high degree inside (-1, 1) use their
trigonometric forms, and everything else the three-term recurrence
P_{k+1} = f(k, x, P_{k-1}, P_k). The recurrence is one while loop (jax's
fori_loop with a bound computed on the device) running to the largest n
among the elements that need it; each element keeps its value once k
reaches its own n."""
import jax.numpy as jnp
from jax import lax


def _recurrence(x, n, p0, p1, step, needs):
    """P_n(x) elementwise from P_0 = p0, P_1 = p1, P_{k+1} = step(k, P_{k-1}, P_k),
    for the elements where `needs` holds (others: any value)."""
    top = jnp.max(jnp.where(needs, n, 1), initial=1)

    def body(k, pq):
        p, q = pq
        r = step(k.astype(x.dtype), p, q)
        live = k < n
        return jnp.where(live, q, p), jnp.where(live, r, q)

    p0 = jnp.broadcast_to(p0, x.shape).astype(x.dtype)
    p1 = jnp.broadcast_to(p1, x.shape).astype(x.dtype)
    _, q = lax.fori_loop(1, top, body, (p0, p1))
    return jnp.where(n == 0, p0, q)


def _degree(n):
    """torch's static_cast<int64_t>(n) of a float degree (truncation); NaN -> -1 (gives 0)."""
    if jnp.issubdtype(n.dtype, jnp.floating):
        n = jnp.where(jnp.isnan(n), -1, jnp.clip(jnp.trunc(n), -1, jnp.iinfo(jnp.int32).max))
    return n.astype(jnp.int32)


def _odd(n):
    return (n % 2) == 1


def chebyshev_t(x, n):
    n = _degree(n)
    one = jnp.ones_like(x)
    edge = jnp.abs(x) == 1
    trig = (n > 6) & (jnp.abs(x) < 1)
    r = _recurrence(x, n, one, x, lambda k, p, q: (x + x) * q - p, ~edge & ~trig)
    r = jnp.where(trig, jnp.cos(n * jnp.arccos(x)), r)
    r = jnp.where(edge, jnp.where((x > 0) | ~_odd(n), one, -one), r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def chebyshev_u(x, n):
    n = _degree(n)
    edge = jnp.abs(x) == 1
    trig = (n > 8) & (jnp.abs(x) < 1)
    r = _recurrence(x, n, jnp.ones_like(x), x + x, lambda k, p, q: (x + x) * q - p, ~edge & ~trig)
    t = jnp.arccos(x)
    s = jnp.sin(t)
    r = jnp.where(trig, jnp.where(s != 0, jnp.sin((n + 1) * t) / s, (n + 1) * jnp.cos((n + 1) * t)), r)
    m = (n + 1).astype(x.dtype)
    r = jnp.where(edge, jnp.where((x > 0) | ~_odd(n), m, -m), r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def chebyshev_v(x, n):
    n = _degree(n)
    edge = jnp.abs(x) == 1
    trig = (n > 8) & (jnp.abs(x) < 1)
    r = _recurrence(x, n, jnp.ones_like(x), x + x - 1, lambda k, p, q: (x + x) * q - p, ~edge & ~trig)
    t = jnp.arccos(x)
    m = (n + n + 1).astype(x.dtype)
    alt = jnp.where(_odd(n), -m, m)
    r = jnp.where(trig, jnp.where(jnp.sin(t / 2) != 1, jnp.cos((n + 0.5) * t) / jnp.cos(t / 2), alt), r)
    r = jnp.where(edge, jnp.where(x > 0, jnp.ones_like(x), alt), r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def chebyshev_w(x, n):
    n = _degree(n)
    edge = jnp.abs(x) == 1
    trig = (n > 8) & (jnp.abs(x) < 1)
    r = _recurrence(x, n, jnp.ones_like(x), x + x + 1, lambda k, p, q: (x + x) * q - p, ~edge & ~trig)
    t = jnp.arccos(x)
    m = (n + n + 1).astype(x.dtype)
    sign = jnp.where(_odd(n), -1.0, 1.0).astype(x.dtype)
    r = jnp.where(trig, jnp.where(jnp.cos(t / 2) != 1, jnp.sin((n + 0.5) * t) / jnp.sin(t / 2),
                                  jnp.where(x > 0, m, sign)), r)
    r = jnp.where(edge, jnp.where(x > 0, m, sign), r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def _shifted(f):
    def g(x, n):
        return f(x + x - 1, n)
    g.__name__ = g.__qualname__ = "shifted_" + f.__name__
    return g


def hermite_h(x, n):
    n = _degree(n)
    # H_{k+1} = 2x H_k - 2k H_{k-1}
    r = _recurrence(x, n, jnp.ones_like(x), x + x, lambda k, p, q: (x + x) * q - (k + k) * p, n > 1)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def hermite_he(x, n):
    n = _degree(n)
    # He_{k+1} = x He_k - k He_{k-1}
    r = _recurrence(x, n, jnp.ones_like(x), x, lambda k, p, q: x * q - k * p, n > 1)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def laguerre_l(x, n):
    n = _degree(n)
    # L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1); L_n(0) = 1
    r = _recurrence(x, n, jnp.ones_like(x), 1 - x, lambda k, p, q: (((k + k) + (1 - x)) * q - k * p) / (k + 1),
                    (n > 1) & (x != 0))
    r = jnp.where(x == 0, 1, r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


def legendre_p(x, n):
    n = _degree(n)
    edge = jnp.abs(x) == 1
    # P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1)
    r = _recurrence(x, n, jnp.ones_like(x), x, lambda k, p, q: ((k + k + 1) * x * q - k * p) / (k + 1),
                    (n > 1) & ~edge)
    r = jnp.where(edge, jnp.where((x > 0) | ~_odd(n), 1.0, -1.0), r)
    return jnp.where(n < 0, 0, r).astype(x.dtype)


POLYNOMIALS = {
    "chebyshev_polynomial_t": chebyshev_t,
    "chebyshev_polynomial_u": chebyshev_u,
    "chebyshev_polynomial_v": chebyshev_v,
    "chebyshev_polynomial_w": chebyshev_w,
    "shifted_chebyshev_polynomial_t": _shifted(chebyshev_t),
    "shifted_chebyshev_polynomial_u": _shifted(chebyshev_u),
    "shifted_chebyshev_polynomial_v": _shifted(chebyshev_v),
    "shifted_chebyshev_polynomial_w": _shifted(chebyshev_w),
    "hermite_polynomial_h": hermite_h,
    "hermite_polynomial_he": hermite_he,
    "laguerre_polynomial_l": laguerre_l,
    "legendre_polynomial_p": legendre_p,
}
