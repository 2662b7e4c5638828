"""Special math functions and the elementwise ops torch decomposes into prims
(torch_xla_core/_ops/special.py): numerics against CPU eager including edge
values, gradients through torch's autograd formulas, integer inputs
promoting to float, no CPU fallback, and the CHLO ops in the emitted
StableHLO."""
import math
import re

import pytest
import torch

import torch_xla_core as txc
from util import assert_matches_cpu as _assert_matches_cpu


def assert_matches_cpu(fn, *args, **kwargs):
    """util.assert_matches_cpu with NaN == NaN (edge inputs give NaNs on purpose)."""
    return _assert_matches_cpu(fn, *args, equal_nan=True, **kwargs)

INF, NAN = math.inf, math.nan
# values every unary op sees: signs, zeros, integers, +-1, large, inf, nan
EDGE = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 3.0, 7.25, -7.25, 20.0, -20.0, 88.5, 1e-3, INF, -INF, NAN]


def _x(lo=-9.0, hi=9.0, n=64, edge=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g) * (hi - lo) + lo
    return torch.cat([x, torch.tensor(EDGE)]) if edge else x


def _positive(n=64):
    return torch.cat([_x(0.01, 9.0, n, edge=False), torch.tensor([0.0, 1.0, 2.0, 20.0, 88.5, INF, NAN])])


def _no_new_fallbacks(before):
    after = txc.metrics.fallbacks()
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


UNARY = {  # name -> (function, input)
    "acosh": (torch.acosh, _x(0.5, 9.0)),
    "asinh": (torch.asinh, _x()),
    "atanh": (torch.atanh, _x(-1.2, 1.2)),
    "erfc": (torch.erfc, _x()),
    "lgamma": (torch.lgamma, _x()),
    "digamma": (torch.digamma, _x()),
    "log2": (torch.log2, _x(0.0, 1e4)),
    "log10": (torch.log10, _x(0.0, 1e4)),
    "exp2": (torch.exp2, _x(-30.0, 30.0)),
    "signbit": (torch.signbit, _x()),
    "i0": (torch.i0, _x()),
    "i0e": (torch.special.i0e, _x()),
    "i1": (torch.special.i1, _x()),
    "i1e": (torch.special.i1e, _x()),
    "erfcx": (torch.special.erfcx, _x(-4.0, 30.0)),
    "ndtri": (torch.special.ndtri, _x(0.0, 1.0)),
    "log_ndtr": (torch.special.log_ndtr, _x(-30.0, 9.0)),
    "spherical_bessel_j0": (torch.special.spherical_bessel_j0, _x()),
    "bessel_j0": (torch.special.bessel_j0, _x(-30.0, 30.0)),
    "bessel_j1": (torch.special.bessel_j1, _x(-30.0, 30.0)),
    "bessel_y0": (torch.special.bessel_y0, _positive()),
    "bessel_y1": (torch.special.bessel_y1, _positive()),
    "modified_bessel_k0": (torch.special.modified_bessel_k0, _positive()),
    "modified_bessel_k1": (torch.special.modified_bessel_k1, _positive()),
    "scaled_modified_bessel_k0": (torch.special.scaled_modified_bessel_k0, _positive()),
    "scaled_modified_bessel_k1": (torch.special.scaled_modified_bessel_k1, _positive()),
    "airy_ai": (torch.special.airy_ai, _x(-30.0, 30.0)),
    "angle": (torch.angle, _x()),
    "round_decimals_3": (lambda x: torch.round(x, decimals=3), _x()),
    "round_decimals_neg_2": (lambda x: torch.round(x, decimals=-2), _x(-1e4, 1e4)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_cpu_with_edge_values(dev, name):
    fn, x = UNARY[name]
    # relative 2e-5: XLA's transcendental approximations are a few ulps from ATen's
    assert_matches_cpu(fn, x, atol=1e-5, rtol=2e-5)


BINARY = {
    "hypot": (torch.hypot, _x(), _x(seed=1)),
    "fmax": (torch.fmax, _x(), _x(seed=1).flip(0)),
    "fmin": (torch.fmin, _x(), _x(seed=1).flip(0)),
    "copysign": (torch.copysign, _x(), _x(seed=1).flip(0)),
    "nextafter": (torch.nextafter, _x(), _x(seed=1)),
    "zeta": (torch.special.zeta, _x(1.0, 9.0), _x(0.5, 9.0, seed=1)),
    "igamma": (torch.igamma, _x(0.01, 9.0), _x(0.0, 12.0, seed=1)),
    "igammac": (torch.igammac, _x(0.01, 9.0), _x(0.0, 12.0, seed=1)),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_matches_cpu_with_edge_values(dev, name):
    fn, a, b = BINARY[name]
    assert_matches_cpu(fn, a, b, atol=1e-5, rtol=2e-5)


def test_fmax_fmin_ignore_one_nan_and_keep_integers(dev):
    a = torch.tensor([1.0, NAN, NAN, -0.0, 2.0])
    b = torch.tensor([NAN, 3.0, NAN, 0.0, -INF])
    assert_matches_cpu(torch.fmax, a, b)
    assert_matches_cpu(torch.fmin, a, b)
    ai, bi = torch.tensor([1, -5, 7]), torch.tensor([2, -9, 7])
    assert txc.device().type == "xla" and torch.fmax(ai.to(dev), bi.to(dev)).dtype == torch.int64
    assert_matches_cpu(torch.fmax, ai, bi)


def test_copysign_and_signbit_read_the_sign_of_zero(dev):
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s = torch.tensor([-0.0, 0.0, -INF, NAN])
    r = assert_matches_cpu(torch.copysign, x, s)
    assert r.cpu().tolist()[:3] == [-1.0, 2.0, -3.0]
    assert assert_matches_cpu(torch.signbit, torch.tensor([-0.0, 0.0, -1.0, INF])).cpu().tolist() == [
        True, False, True, False]
    assert_matches_cpu(torch.copysign, x, -2.0)


def test_hypot_does_not_overflow(dev):
    a = torch.tensor([3e30, 0.0, INF, NAN, 1e-30])
    b = torch.tensor([4e30, 0.0, NAN, INF, 1e-30])
    r = assert_matches_cpu(torch.hypot, a, b, rtol=2e-6)
    assert r.cpu()[0].item() == pytest.approx(5e30, rel=1e-6)


def test_exp2_is_exact_at_integers(dev):
    e = torch.arange(-20, 21, dtype=torch.float32)
    assert torch.equal(torch.exp2(e.to(dev)).cpu(), torch.exp2(e))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_polygamma_and_its_gradient(dev, n):
    x = _x(0.1, 9.0, edge=False).requires_grad_()
    assert_matches_cpu(lambda t: torch.polygamma(n, t), x, atol=1e-4, rtol=5e-5)


def test_polygamma_rejects_negative_n(dev):
    with pytest.raises(RuntimeError, match="negative n"):
        torch.polygamma(-1, torch.ones(2).to(dev))


GRAD = {  # ops whose backward formulas call other special ops
    "lgamma": (torch.lgamma, _x(0.1, 9.0, edge=False)),                  # digamma
    "digamma": (torch.digamma, _x(0.1, 9.0, edge=False)),                # polygamma(1)
    "mvlgamma": (lambda t: torch.mvlgamma(t, 3), _x(1.1, 9.0, edge=False)),
    "i0": (torch.i0, _x(edge=False)),                                    # i1
    "i0e": (torch.special.i0e, _x(edge=False)),                          # i1e, sgn
    "i1": (torch.special.i1, _x(edge=False)),                            # i0
    "i1e": (torch.special.i1e, _x(edge=False)),
    "erfcx": (torch.special.erfcx, _x(-3.0, 9.0, edge=False)),
    "ndtri": (torch.special.ndtri, _x(0.01, 0.99, edge=False)),
    "log_ndtr": (torch.special.log_ndtr, _x(edge=False)),
    "acosh": (torch.acosh, _x(1.1, 9.0, edge=False)),
    "atanh": (torch.atanh, _x(-0.9, 0.9, edge=False)),
    "exp2": (torch.exp2, _x(edge=False)),
    "log10": (torch.log10, _x(0.1, 9.0, edge=False)),
    "frexp": (lambda t: torch.frexp(t)[0], _x(edge=False)),             # exp2 of the exponent
    "logaddexp2": (lambda t: torch.logaddexp2(t, t.flip(0)), _x(edge=False)),
    "logcumsumexp": (lambda t: torch.logcumsumexp(t.reshape(8, 8), 1), _x(edge=False)),
}


@pytest.mark.parametrize("name", sorted(GRAD))
def test_gradient_matches_cpu(dev, name):
    fn, x = GRAD[name]
    assert_matches_cpu(fn, x.requires_grad_(), atol=1e-5, rtol=5e-5)


def test_hypot_copysign_fmax_gradients(dev):
    a, b = _x(edge=False).requires_grad_(), _x(seed=1, edge=False).requires_grad_()
    for fn in (torch.hypot, torch.copysign, torch.fmax, torch.fmin):
        assert_matches_cpu(fn, a, b)


def test_frexp_and_logcumsumexp_edges(dev):
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-30, 3e38, INF, -INF, 0.75])
    m, e = assert_matches_cpu(torch.frexp, x[:6])
    assert e.dtype == torch.int32
    for dtype, tiny in ((torch.float32, [1.4013e-45, 2.8026e-45, -9.8091e-45, 1.7796e-43, 1e-39, 1.1754942e-38]),
                        (torch.float64, [4.9e-324, -1e-320, 1e-310, 2.2250738585072014e-308])):
        # subnormals: XLA:CPU treats them as 0 in float arithmetic; frexp reads their bits (torch 2.15's samples)
        x = torch.tensor(tiny, dtype=dtype)
        m, e = torch.frexp(x.to(dev))
        assert torch.equal(m.cpu(), torch.frexp(x)[0]) and torch.equal(e.cpu(), torch.frexp(x)[1])
    big = torch.tensor([[-INF, -INF, 0.0, 1e4, -1e4, 5.0]])
    assert_matches_cpu(lambda t: torch.logcumsumexp(t, 1), big)
    assert_matches_cpu(lambda t: torch.logcumsumexp(t, 0), torch.tensor(2.5))


POLYNOMIALS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
               "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
               "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
               "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"]


@pytest.mark.parametrize("name", POLYNOMIALS)
def test_polynomials_match_cpu(dev, name):
    fn = getattr(torch.special, name)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(200, generator=g) * 4 - 2, torch.tensor([1.0, -1.0, 0.0, 0.5])])
    # per-element degrees: negative, fractional (truncated), past the trigonometric switch (> 6, > 8)
    n = torch.cat([torch.randint(-2, 14, (200,), generator=g).float(), torch.tensor([3.0, 4.0, 5.0, 2.7])])
    assert_matches_cpu(fn, x, n, atol=1e-4, rtol=2e-5)
    assert_matches_cpu(lambda t: fn(t, 5), x, atol=1e-4, rtol=2e-5)        # a number as the degree
    assert_matches_cpu(lambda t: fn(0.25, t), n, atol=1e-4, rtol=2e-5)     # a number as x


@pytest.mark.parametrize("fn", [torch.lgamma, torch.erfc, torch.special.i0e, torch.special.bessel_j0, torch.log2,
                                lambda t: torch.special.chebyshev_polynomial_t(t, t)],
                         ids=["lgamma", "erfc", "i0e", "bessel_j0", "log2", "chebyshev_t"])
def test_integer_inputs_become_float(dev, fn):
    x = torch.tensor([1, 2, 3, 5, 9])
    r = assert_matches_cpu(fn, x, atol=1e-5, rtol=2e-5)
    assert r.dtype == torch.float32


def test_decompositions_reach_the_device(dev):
    """Ops torch decomposes through these prims (mvlgamma -> lgamma, kaiser -> i0, logaddexp2 -> exp2/log2)."""
    assert_matches_cpu(lambda t: torch.mvlgamma(t, 5), _x(2.5, 9.0, edge=False))
    assert_matches_cpu(lambda t: torch.logaddexp2(t, t.flip(0)), _x())
    before = dict(txc.metrics.fallbacks())
    w = torch.signal.windows.kaiser(12, beta=8.0, device=dev)
    torch.testing.assert_close(w.cpu(), torch.signal.windows.kaiser(12, beta=8.0))
    assert not _no_new_fallbacks(before)


_JAX_ENTRY_CALLS = re.compile(r"callee = @jx\w+_main\b")  # our graph's calls of inlined jax functions


def test_chlo_ops_in_the_emitted_stablehlo(dev):
    x = torch.rand(8).to(dev) + 0.5
    text = txc.debug.stablehlo(torch.lgamma(x) + torch.digamma(x) + torch.nextafter(x, x + 1) + torch.special.i1e(x))
    for op in ("chlo.lgamma", "chlo.digamma", "chlo.next_after", "chlo.bessel_i1e"):
        assert op in text, op
    assert "custom_call" not in text and "func.call" not in text  # core ops, no jax_call
    # zeta/polygamma: jax's lax.zeta (chlo.zeta) inside one inlined call
    text = txc.debug.stablehlo(torch.polygamma(2, x))
    assert "chlo.zeta" in text and len(_JAX_ENTRY_CALLS.findall(text)) == 1


def test_jax_implementations_are_one_call_each(dev):
    x = torch.rand(8).to(dev)
    text = txc.debug.stablehlo(torch.special.i0e(x) + torch.special.ndtri(x) + torch.special.bessel_y0(x + 1))
    assert len(_JAX_ENTRY_CALLS.findall(text)) == 3
    assert "callback" not in text


@pytest.mark.parametrize("fn", [torch.lgamma, torch.special.i0e, torch.special.modified_bessel_k1,
                                lambda t: torch.special.zeta(t + 1, t), lambda t: torch.polygamma(3, t),
                                lambda t: torch.special.chebyshev_polynomial_t(t, 4), lambda t: torch.frexp(t)[0]],
                         ids=["lgamma", "i0e", "k1", "zeta", "polygamma3", "chebyshev_t", "frexp"])
def test_float64_stays_float64(dev, fn):
    # jax lowers these under x64: nothing is truncated to float32
    x = torch.linspace(0.1, 11.0, 57, dtype=torch.float64)
    r = assert_matches_cpu(fn, x, atol=1e-10, rtol=1e-7)
    assert r.dtype == torch.float64


def test_half_precision_keeps_its_dtype(dev):
    x = torch.linspace(0.1, 5.0, 33)
    for dt in (torch.bfloat16, torch.float16):
        for fn in (torch.lgamma, torch.special.i0e, torch.special.erfcx, lambda t: torch.frexp(t)[0]):
            r = fn(x.to(dt).to(dev))
            assert r.dtype == dt
            torch.testing.assert_close(r.cpu().float(), fn(x).float(), atol=2e-2, rtol=2e-2)


def test_bessel_float64_against_scipy(dev):
    """In float64 the hand-written Bessel functions are checked against
    scipy (ATen's own float64 J0/Y0/Y1 are only ~1e-7..1e-4 accurate)."""
    ss = pytest.importorskip("scipy.special")
    x = torch.cat([torch.linspace(0.05, 40.0, 801, dtype=torch.float64), torch.tensor([1e-6, 11.99, 12.0, 12.01, 1e3],
                                                                                  dtype=torch.float64)])
    for fn, ref in [(torch.special.bessel_j0, ss.j0), (torch.special.bessel_j1, ss.j1), (torch.special.bessel_y0, ss.y0),
                    (torch.special.bessel_y1, ss.y1), (torch.special.modified_bessel_k0, ss.k0),
                    (torch.special.modified_bessel_k1, ss.k1), (torch.special.scaled_modified_bessel_k0, ss.k0e),
                    (torch.special.airy_ai, lambda v: ss.airy(v)[0])]:
        for xs in (x, -x[:400]) if fn in (torch.special.bessel_j0, torch.special.bessel_j1,
                                          torch.special.airy_ai) else (x,):
            r = fn(xs.to(dev))
            assert r.dtype == torch.float64
            torch.testing.assert_close(r.cpu(), torch.from_numpy(ref(xs.numpy())), atol=2e-11, rtol=1e-9,
                                       msg=lambda m: f"{fn.__name__}: {m}")
