"""Bessel functions of torch.special that neither XLA nor jax provides
(bessel_j0/j1, bessel_y0/y1, modified_bessel_k0/k1 and their scaled forms,
airy_ai) as jax functions for call_jax (used by _ops/special.py).

Hand-written, from textbook formulas rather than fitted coefficient tables
(torch's CPU kernels use Cephes' rational fits; jax has only i0e/i1e and a
bessel_jn that returns NaN for some arguments). They compute in float64
(call_jax lowers them with x64 on) and return the input's dtype:

  J0, J1, Y0, Y1   power series for |x| < 12 (DLMF 10.2.2, 10.8.1/10.8.2),
                   Hankel's asymptotic expansion beyond (DLMF 10.17.3/4);
  K0, K1           the integral K_v(x) = int_0^inf exp(-x cosh t) cosh(v t) dt
                   by the trapezoidal rule, which converges exponentially for
                   this integrand (step 1/2, or 1/sqrt(x) for large x where
                   the integrand narrows: error about exp(-20) relative, and
                   exp(-40) with half the step for float64 inputs); the scaled forms exp(x) K_v(x) integrate
                   exp(-x (cosh t - 1)), so they neither overflow nor underflow;
  Ai               Maclaurin series for -8 <= x <= 2 (DLMF 9.4.1), the K_{1/3}
                   integral for x > 2 (DLMF 9.6.1), the asymptotic expansion for
                   x < -8 (DLMF 9.7.9).
Edge values follow torch: J, Y, Ai at +-inf are NaN, Y(0) = -inf, Y(x < 0) = NaN,
K(0) = inf, K(x < 0) = NaN."""
import jax.numpy as jnp

_EULER = 0.57721566490153286061
_SERIES_TERMS = 40
_ASYMPTOTIC_TERMS = 20
_SWITCH = 12.0  # |x| where J/Y move from the series to the asymptotic expansion
_H, _NODES = 0.5, 240  # trapezoidal step and nodes (t up to 120: x down to ~1e-50)


def _f64(x):
    return x.astype(jnp.float64)


def _j_series(x, nu):
    """J_nu(x) (nu = 0, 1) by its power series, and the terms' running sums
    of harmonic numbers needed by Y_nu."""
    half = x / 2
    y = half * half
    term = half if nu == 1 else jnp.ones_like(x)
    j, hsum = term, jnp.zeros_like(x)   # sum_k term_k, sum_k c_k term_k
    h_k, h_k1 = 0.0, 1.0                 # H_k, H_{k+1}
    hsum = term * (h_k + h_k1 if nu == 1 else 0.0)
    for k in range(1, _SERIES_TERMS):
        term = term * (-y) / (k * (k + nu))
        h_k += 1.0 / k
        h_k1 += 1.0 / (k + 1)
        j = j + term
        hsum = hsum + term * (h_k + h_k1 if nu == 1 else h_k)
    return j, hsum


def _hankel(x, nu):
    """(P, Q, omega) of Hankel's expansion of order nu at x > 0."""
    mu = 4.0 * nu * nu
    p, q = jnp.ones_like(x), jnp.zeros_like(x)
    a = 1.0
    inv8x = 1.0 / (8.0 * x)
    term = jnp.ones_like(x)
    for k in range(1, 2 * _ASYMPTOTIC_TERMS):
        a = a * (mu - (2 * k - 1) ** 2) / k
        term = term * inv8x
        t = jnp.where(k < 2 * x, a * term, 0.0)  # the terms shrink until k ~ 2x, then grow: stop there
        sign = -1.0 if (k // 2) % 2 == 1 else 1.0
        if k % 2 == 0:
            p = p + sign * t
        else:
            q = q + sign * t
    omega = x - (0.5 * nu + 0.25) * jnp.pi
    return p, q, omega


def _jy(x, nu):
    """(J_nu(|x|), Y_nu(|x|)) for x != 0."""
    ax = jnp.abs(x)
    small = ax < _SWITCH
    xs = jnp.where(small, ax, 1.0)
    xl = jnp.where(small, _SWITCH, ax)
    j_s, hsum = _j_series(xs, nu)
    lg = jnp.log(xs / 2)
    if nu == 0:
        y_s = (2 / jnp.pi) * ((lg + _EULER) * j_s - hsum)
    else:
        # Y1 = (2/pi) ln(x/2) J1 - 2/(pi x) - (1/pi) sum (-1)^k (psi(k+1) + psi(k+2)) (x/2)^(2k+1) / (k!(k+1)!)
        y_s = (2 / jnp.pi) * lg * j_s - 2 / (jnp.pi * xs) - (hsum - 2 * _EULER * j_s) / jnp.pi
    p, q, w = _hankel(xl, nu)
    amp = jnp.sqrt(2 / (jnp.pi * xl))
    j_l = amp * (p * jnp.cos(w) - q * jnp.sin(w))
    y_l = amp * (p * jnp.sin(w) + q * jnp.cos(w))
    return jnp.where(small, j_s, j_l), jnp.where(small, y_s, y_l)


def bessel_j0(x):
    v = _f64(x)
    j, _ = _jy(v, 0)
    j = jnp.where(jnp.isinf(v), jnp.nan, jnp.where(v == 0, 1.0, j))
    return j.astype(x.dtype)


def bessel_j1(x):
    v = _f64(x)
    j, _ = _jy(v, 1)
    j = jnp.where(jnp.isinf(v), jnp.nan, jnp.where(v == 0, 0.0, jnp.sign(v) * j))
    return j.astype(x.dtype)


def _bessel_y(x, nu):
    v = _f64(x)
    _, y = _jy(jnp.where(v > 0, v, 1.0), nu)
    y = jnp.where(v == 0, -jnp.inf, jnp.where((v < 0) | jnp.isnan(v) | jnp.isinf(v), jnp.nan, y))
    return y.astype(x.dtype)


def bessel_y0(x):
    return _bessel_y(x, 0)


def bessel_y1(x):
    return _bessel_y(x, 1)


def _k_scaled(v, order, fine=False):
    """exp(v) K_order(v) for v > 0 (float64), by the trapezoidal rule. For
    large v the integrand is a narrow peak at t = 0 (about exp(-v t^2 / 2)):
    the step shrinks to 1/sqrt(v) there. fine: half the step (and twice
    the nodes) for float64 results: error about exp(-40) instead of exp(-20)."""
    h0, nodes, c = (_H / 2, 2 * _NODES, 0.7) if fine else (_H, _NODES, 1.0)
    h = jnp.minimum(h0, c / jnp.sqrt(v))[..., None]
    t = jnp.arange(nodes, dtype=jnp.float64) * h
    w = jnp.where(t == 0, 0.5 * h, h) * jnp.cosh(order * t)
    s = jnp.sinh(t / 2)
    e = jnp.exp(-v[..., None] * (2 * s * s))  # exp(-v (cosh t - 1))
    return jnp.sum(e * w, axis=-1)


def _bessel_k(x, order, scaled):
    v = _f64(x)
    pos = jnp.where(v > 0, v, 1.0)
    k = _k_scaled(pos, order, fine=x.dtype == jnp.float64)
    if not scaled:
        k = k * jnp.exp(-pos)
    k = jnp.where(v == jnp.inf, 0.0, k)
    k = jnp.where(v == 0, jnp.inf, jnp.where((v < 0) | jnp.isnan(v), jnp.nan, k))
    return k.astype(x.dtype)


def modified_bessel_k0(x):
    return _bessel_k(x, 0.0, False)


def modified_bessel_k1(x):
    return _bessel_k(x, 1.0, False)


def scaled_modified_bessel_k0(x):
    return _bessel_k(x, 0.0, True)


def scaled_modified_bessel_k1(x):
    return _bessel_k(x, 1.0, True)


_AI0 = 0.35502805388781723926    # Ai(0)
_DAI0 = 0.25881940379280679840   # -Ai'(0)


def airy_ai(x):
    v = _f64(x)
    # Maclaurin series, -8 <= x <= 2: Ai = Ai(0) f(x) + Ai'(0) g(x)
    xs = jnp.clip(v, -8.0, 2.0)
    x3 = xs * xs * xs
    fk, gk = jnp.ones_like(xs), xs
    f, g = fk, gk
    for k in range(1, _SERIES_TERMS):
        fk = fk * x3 / ((3 * k - 1) * (3 * k))
        gk = gk * x3 / ((3 * k) * (3 * k + 1))
        f, g = f + fk, g + gk
    series = _AI0 * f - _DAI0 * g
    # x > 2: Ai = sqrt(x/3) K_{1/3}(zeta) / pi, zeta = (2/3) x^(3/2)
    xp = jnp.maximum(v, 2.0)
    zeta = (2.0 / 3.0) * xp * jnp.sqrt(xp)
    right = jnp.sqrt(xp / 3) / jnp.pi * _k_scaled(zeta, 1.0 / 3.0, fine=x.dtype == jnp.float64) * jnp.exp(-zeta)
    # x < -8: Ai(-z) ~ z^(-1/4)/sqrt(pi) (cos(zeta - pi/4) sum (-1)^k u_2k zeta^-2k
    #                                    + sin(zeta - pi/4) sum (-1)^k u_2k+1 zeta^-(2k+1))
    z = jnp.maximum(-v, 8.0)
    zeta = (2.0 / 3.0) * z * jnp.sqrt(z)
    even, odd = jnp.ones_like(z), jnp.zeros_like(z)
    u, pw = 1.0, jnp.ones_like(z)
    for k in range(1, _ASYMPTOTIC_TERMS):
        u = u * (6 * k - 5) * (6 * k - 3) * (6 * k - 1) / ((2 * k - 1) * 216 * k)
        pw = pw / zeta
        sign = -1.0 if (k // 2) % 2 == 1 else 1.0
        if k % 2 == 0:
            even = even + sign * u * pw
        else:
            odd = odd + sign * u * pw
    w = zeta - jnp.pi / 4
    left = (jnp.cos(w) * even + jnp.sin(w) * odd) / (jnp.sqrt(jnp.pi) * jnp.sqrt(jnp.sqrt(z)))
    r = jnp.where(v > 2.0, right, jnp.where(v < -8.0, left, series))
    r = jnp.where(jnp.isinf(v) | jnp.isnan(v), jnp.nan, r)
    return r.astype(x.dtype)


FUNCTIONS = {
    "bessel_j0": bessel_j0,
    "bessel_j1": bessel_j1,
    "bessel_y0": bessel_y0,
    "bessel_y1": bessel_y1,
    "modified_bessel_k0": modified_bessel_k0,
    "modified_bessel_k1": modified_bessel_k1,
    "scaled_modified_bessel_k0": scaled_modified_bessel_k0,
    "scaled_modified_bessel_k1": scaled_modified_bessel_k1,
    "airy_ai": airy_ai,
}
