"""Random ops on the xla device: normal_/uniform_/bernoulli/random_/
exponential_/geometric_/log_normal_/cauchy_, the factories randn/rand/randint/randperm/
normal (PrivateUse1 kernels, as they have no tensor input), the *_like
factories, dropout (native_dropout and its backward), multinomial and
rrelu. Each draw is one
core op whose first operands, a state and an offset, come from
torch_xla_core._tracing.random.draw() (see csrc/ops/random.cpp). A `generator=` (a CPU torch.Generator) seeds a fresh
device state from that generator instead of the device RNG."""
import math

import torch

from .._tracing import checks as _checks, random as _random
from .._runtime.dtypes import code
from .._tracing.tensor import OP, lazy_op, op, wrap
from . import assign, aten, impl, sizes
from .dtype_rules import type_name
from .factory import placed_like, register

_key = _random.draw
_RNG, _INT, _BERN, _PERM = OP.rng, OP.rng_int, OP.rng_bernoulli, OP.rng_perm
UNIFORM, NORMAL, LOG_NORMAL, EXPONENTIAL, CAUCHY = range(5)
_DIGITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}


def _float_check(name, dtype):
    if not dtype.is_floating_point:
        raise NotImplementedError(f"{name}: expected a floating-point tensor, got {type_name(dtype)} "
                                  f"(\"{name}\" not implemented for '{type_name(dtype)}')")


def _draw(kind, dtype, shape, a, b, generator):
    return wrap(lazy_op(_RNG, _key(generator), (kind, code(dtype), sizes(shape), float(a), float(b))))


def _fill(self, name, kind, a, b, generator, refused=None):
    """`self` filled in place with a draw of `kind` (parameters a, b);
    `refused`: torch's message when it refuses the parameters."""
    _float_check(name, self.dtype)
    if refused:
        raise RuntimeError(refused)
    assign(self, _draw(kind, self.dtype, self.shape, a, b, generator))
    return self


def _dt(dtype):
    return dtype if dtype is not None else torch.get_default_dtype()


# --- in-place distributions -------------------------------------------------

@impl(aten.normal_.default)
def normal_(self, mean=0.0, std=1.0, *, generator=None):
    return _fill(self, "normal_", NORMAL, mean, std, generator,
                 std < 0 and f"normal expects std >= 0.0, but found std {std:g}")


@impl(aten.uniform.default)
def uniform(self, from_=0.0, to=1.0, *, generator=None):
    _float_check("uniform_", self.dtype)
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}")
    return _draw(UNIFORM, self.dtype, self.shape, from_, to, generator)


@impl(aten.uniform_.default)
def uniform_(self, from_=0.0, to=1.0, *, generator=None):
    assign(self, uniform(self, from_, to, generator=generator))
    return self


@impl(aten.exponential.default)
def exponential(self, lambd=1.0, *, generator=None):
    if not self.dtype.is_floating_point:
        raise RuntimeError("Exponential distribution is a continuous probability distribution. dtype must be a "
                           f"floating point but you specified {type_name(self.dtype)}")
    if not lambd > 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
    return _draw(EXPONENTIAL, self.dtype, self.shape, lambd, 0.0, generator)


@impl(aten.exponential_.default)
def exponential_(self, lambd=1.0, *, generator=None):
    assign(self, exponential(self, lambd, generator=generator))
    return self


@impl(aten.geometric.default)
def geometric(self, p, *, generator=None):
    """Trials until the first success, as torch's decomposition draws them
    (floor(log1p(-u) / log1p(-p)) + 1), for integer tensors too (their
    uniform draw is float32)."""
    if self.dtype.is_complex or self.dtype == torch.bool:
        raise RuntimeError(f"geometric not implemented for {self.dtype}")
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    u = _draw(UNIFORM, self.dtype if self.dtype.is_floating_point else torch.float32, self.shape, 0.0, 1.0,
              generator)
    r = torch.floor(torch.log1p(-u) / math.log1p(-p)) + 1
    return r if r.dtype == self.dtype else r.to(self.dtype)


@impl(aten.geometric_.default)
def geometric_(self, p, *, generator=None):
    assign(self, geometric(self, p, generator=generator))
    return self


@impl(aten.log_normal_.default)
def log_normal_(self, mean=1.0, std=2.0, *, generator=None):
    return _fill(self, "log_normal_", LOG_NORMAL, mean, std, generator,
                 not std > 0 and f"log_normal_ expects std > 0.0, but found std={std:g}")


@impl(aten.cauchy_.default)
def cauchy_(self, median=0.0, sigma=1.0, *, generator=None):
    return _fill(self, "cauchy_", CAUCHY, median, sigma, generator,
                 not sigma > 0 and f"cauchy_ expects sigma > 0.0, but found sigma={sigma:g}")


# --- normal with tensor mean/std --------------------------------------------

def _normal_t(mean, std, generator):
    ref = mean if isinstance(mean, torch.Tensor) else std
    shape = torch.broadcast_shapes(*(t.shape for t in (mean, std) if isinstance(t, torch.Tensor)))
    dtype = torch.result_type(mean, std) if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor) \
        else ref.dtype
    _float_check("normal", dtype)
    z = _draw(NORMAL, dtype, shape, 0.0, 1.0, generator)
    return op("add", mean, op("mul", std, z))


@impl(aten.normal.Tensor_float)
def normal_tensor_float(mean, std=1.0, *, generator=None):
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    return _normal_t(mean, std, generator)


@impl(aten.normal.float_Tensor, aten.normal.Tensor_Tensor)
def normal_tensor(mean, std, *, generator=None):
    return _normal_t(mean, std, generator)


# --- bernoulli --------------------------------------------------------------

def _bern(dtype, shape, p, generator):
    if isinstance(p, torch.Tensor):
        return wrap(lazy_op(_BERN, (*_key(generator), p._lt), (code(dtype), [int(s) for s in shape], 0.0)))
    if not 0 <= p <= 1:
        raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p:g}")
    return wrap(lazy_op(_BERN, _key(generator), (code(dtype), [int(s) for s in shape], float(p))))


@impl(aten.bernoulli.default)
def bernoulli(self, *, generator=None):
    return _bern(self.dtype, self.shape, self, generator)


@impl(aten.bernoulli.p)
def bernoulli_p(self, p, *, generator=None):
    return _bern(self.dtype, self.shape, p, generator)


@impl(aten.bernoulli.Tensor)
def bernoulli_t(self, p, *, generator=None):
    return _bern(self.dtype, self.shape, p, generator)


@impl(aten.bernoulli_.float, aten.bernoulli_.Tensor)
def bernoulli_(self, p=0.5, *, generator=None):
    assign(self, _bern(self.dtype, self.shape, p, generator))
    return self


# --- integers ---------------------------------------------------------------

def _int_bounds(dtype):
    """[lo, hi] of the values random_() may produce for dtype."""
    if dtype == torch.bool:
        return 0, 1
    if dtype.is_floating_point:
        return -(1 << _DIGITS[dtype]), 1 << _DIGITS[dtype]
    info = torch.iinfo(dtype)
    return info.min, info.max


def _ints(dtype, shape, low, high, generator, name="random_"):
    """Uniform integers in [low, high) (high=None: up to the dtype's max, inclusive)."""
    lo, hi = _int_bounds(dtype)
    if high is None:
        high = hi + 1 if not dtype.is_floating_point else (1 << _DIGITS[dtype]) + 1
    if low >= high:
        raise RuntimeError(f"{name} expects 'from' to be less than 'to', but got from={low} >= to={high}")
    tname = type_name(dtype)
    if not lo <= low <= hi:
        raise RuntimeError(f"from is out of bounds for {tname.lower() if dtype != torch.uint8 else 'unsigned char'}")
    if not lo <= high - 1 <= hi:
        raise RuntimeError(f"to - 1 is out of bounds for {tname.lower() if dtype != torch.uint8 else 'unsigned char'}")
    r1 = (high - low - 1) & ((1 << 64) - 1)
    if r1 >= 1 << 63:
        r1 -= 1 << 64
    return wrap(lazy_op(_INT, _key(generator), (code(dtype), sizes(shape), int(low), r1)))


@impl(aten.random.default)
def random(self, *, generator=None):
    lo = 0
    return _ints(self.dtype, self.shape, lo, None, generator)


@impl(aten.random.to)
def random_to(self, to, *, generator=None):
    return _ints(self.dtype, self.shape, 0, to, generator)


@impl(getattr(aten.random, "from"))
def random_from(self, from_, to, *, generator=None):
    return _ints(self.dtype, self.shape, from_, to, generator)


@impl(aten.random_.default)
def random_(self, *, generator=None):
    assign(self, random(self, generator=generator))
    return self


@impl(aten.random_.to)
def random_to_(self, to, *, generator=None):
    assign(self, random_to(self, to, generator=generator))
    return self


@impl(getattr(aten.random_, "from"))
def random_from_(self, from_, to, *, generator=None):
    assign(self, random_from(self, from_, to, generator=generator))
    return self


# --- factories (device="xla": PrivateUse1 kernels) ---------------------------

_COMPLEX_PART = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _complex_draw(kind, dtype, size, a, b, generator):
    """A complex draw as torch makes it: real and imaginary parts drawn
    independently (kind, a, b) in the part dtype."""
    return torch.view_as_complex(_draw(kind, _COMPLEX_PART[dtype], [*sizes(size), 2], a, b, generator))


def _randn(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _dt(dtype)
    if dtype in _COMPLEX_PART:  # each part N(0, 1/2): unit variance in all, as torch
        return _complex_draw(NORMAL, dtype, size, 0.0, math.sqrt(0.5), generator)
    _float_check("randn", dtype)
    return _draw(NORMAL, dtype, size, 0.0, 1.0, generator)


def _rand(size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _dt(dtype)
    if dtype in _COMPLEX_PART:  # each part uniform on [0, 1), as torch
        return _complex_draw(UNIFORM, dtype, size, 0.0, 1.0, generator)
    _float_check("rand", dtype)
    return _draw(UNIFORM, dtype, size, 0.0, 1.0, generator)


def _randint_low(low, high, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    return _ints(dtype or torch.int64, size, low, high, generator, "random_")


def _randint(high, size, **kw):
    return _randint_low(0, high, size, **kw)


def _randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    if n < 0:
        raise RuntimeError(f"randperm: n must be non-negative, got {n}")
    return wrap(lazy_op(_PERM, _key(generator), (code(dtype or torch.int64), int(n))))


def _normal_ff(mean, std, size, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None):
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")
    dtype = _dt(dtype)
    _float_check("normal", dtype)
    return _draw(NORMAL, dtype, size, mean, std, generator)


for _name, _fn in [
    ("randn", _randn), ("randn.generator", _randn),
    ("rand", _rand), ("rand.generator", _rand),
    ("randint", _randint), ("randint.generator", _randint),
    ("randint.low", _randint_low), ("randint.low_generator", _randint_low),
    ("randperm", _randperm), ("randperm.generator", _randperm),
    ("normal.float_float", _normal_ff),
]:
    register(_name, _fn)


@impl(aten.randn_like.default, aten.randn_like.generator)
def randn_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return placed_like(_randn(x.shape, generator=generator, dtype=dtype or x.dtype), x, device)


@impl(aten.rand_like.default, aten.rand_like.generator)
def rand_like(x, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return placed_like(_rand(x.shape, generator=generator, dtype=dtype or x.dtype), x, device)


@impl(aten.randint_like.default, aten.randint_like.generator)
def randint_like(x, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                 memory_format=None):
    return placed_like(_ints(dtype or x.dtype, x.shape, 0, high, generator), x, device)


@impl(aten.randint_like.low_dtype, aten.randint_like.low_generator_dtype)
def randint_like_low(x, low, high, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None,
                     memory_format=None):
    return placed_like(_ints(dtype or x.dtype, x.shape, low, high, generator), x, device)


# --- dropout ----------------------------------------------------------------

@impl(aten.native_dropout.default)
def native_dropout(x, p, train):
    if train is not None and not train:
        return op("alias", x), wrap(lazy_op(OP.full, (), (1.0, code(torch.bool), list(x.shape))))
    if not 0 <= p <= 1:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {p}")
    p1m = 1.0 - p
    scale = 0.0 if p1m == 0 else 1.0 / p1m
    mask = wrap(lazy_op(_BERN, _key(), (code(torch.bool), list(x.shape), p1m)))
    return wrap(lazy_op(OP.masked_scale, (x._lt, mask._lt), (scale,))), mask


@impl(aten.native_dropout_backward.default)
def native_dropout_backward(grad, mask, scale):
    return wrap(lazy_op(OP.masked_scale, (grad._lt, mask._lt), (float(scale),)))


# --- multinomial, rrelu -----------------------------------------------------

@impl(aten.multinomial.default)
def multinomial(p, num_samples, replacement=False, *, generator=None):
    """Without replacement: the top num_samples of p / Exp(1) noise (CPU
    eager's algorithm); with replacement: inverse CDF of uniform draws."""
    if p.dim() not in (1, 2):
        raise RuntimeError("prob_dist must be 1 or 2 dim")
    if not p.is_floating_point():
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: "
                           f"{type_name(p.dtype)}")
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    k = p.shape[-1]
    if not replacement and num_samples > k:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    _checks.require(((p < 0) | ~torch.isfinite(p))._lt,
                    "probability tensor contains either `inf`, `nan` or element < 0", RuntimeError)
    _checks.require((p.sum(-1) <= 0)._lt, "invalid multinomial distribution (sum of probabilities <= 0)",
                    RuntimeError)
    if not replacement:
        q = _draw(EXPONENTIAL, p.dtype, p.shape, 1.0, 0.0, generator)
        return torch.topk(p / q, num_samples, -1)[1]
    cdf = torch.cumsum(p, -1)
    cdf = cdf / cdf[..., -1:]
    u = _draw(UNIFORM, p.dtype, (*p.shape[:-1], num_samples), 0.0, 1.0, generator)
    c = cdf if p.dim() == 1 else cdf.unsqueeze(-2)           # [(N,) 1, K]
    idx = (c <= u.unsqueeze(-1)).sum(-1)                       # categories whose cdf is passed
    return torch.clamp(idx, max=k - 1)


def _rrelu(x, noise, lower, upper, training, generator):
    if not training:
        slope = (float(lower) + float(upper)) / 2
        return torch.where(x > 0, x, x * slope), noise
    r = _draw(UNIFORM, x.dtype, x.shape, lower, upper, generator)
    neg = x <= 0
    return torch.where(neg, x * r, x), torch.where(neg, r, 1.0).to(noise.dtype).reshape(noise.shape)


@impl(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    return _rrelu(x, noise, lower, upper, training, generator)


@impl(aten.rrelu_with_noise.default)
def rrelu_with_noise(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    out, n = _rrelu(x, noise, lower, upper, training, generator)
    if training:
        assign(noise, n)
    return out


@impl(aten.rrelu_with_noise_.default)
def rrelu_with_noise_(x, noise, lower=0.125, upper=1 / 3, training=False, generator=None):
    assign(x, rrelu_with_noise(x, noise, lower, upper, training, generator))
    return x
