"""Elementwise ops: numerics against CPU eager, dtype promotion, scalars."""
import re

import pytest
import torch

import torch_xla_core as txc
from util import assert_matches_cpu


@pytest.mark.parametrize("fn", [torch.exp, torch.log1p, torch.tanh, torch.sigmoid, torch.neg, torch.abs,
                                torch.sqrt, torch.rsqrt, torch.erf, torch.sin, torch.floor, torch.round,
                                torch.nn.functional.gelu, torch.nn.functional.silu, torch.relu])
def test_unary(fn):
    x = torch.rand(4, 5) + 0.1
    assert_matches_cpu(fn, x.requires_grad_(fn not in (torch.floor, torch.round)))


@pytest.mark.parametrize("fn", [torch.add, torch.sub, torch.mul, torch.div, torch.maximum, torch.minimum,
                                torch.pow, torch.atan2, torch.remainder, torch.fmod])
def test_binary_broadcast(fn):
    a = torch.rand(3, 1, 5) + 0.5
    b = torch.rand(4, 1) + 0.5
    assert_matches_cpu(fn, a.requires_grad_(fn not in (torch.remainder, torch.fmod)), b)


@pytest.mark.parametrize("a_dtype,b", [
    (torch.int64, 2.5), (torch.int32, 3), (torch.float16, 2.0), (torch.bool, 1), (torch.int64, True),
])
def test_scalar_promotion(a_dtype, b):
    a = torch.arange(6).reshape(2, 3).to(a_dtype)
    for fn in (torch.add, torch.mul):
        out = assert_matches_cpu(fn, a, b)
        assert out.dtype == fn(a, b).dtype


@pytest.mark.parametrize("da,db", [(torch.int64, torch.float32), (torch.float16, torch.float32),
                                   (torch.uint8, torch.int8), (torch.bfloat16, torch.float16)])
def test_tensor_promotion(da, db):
    a = torch.arange(6).reshape(2, 3).to(da)
    b = torch.ones(3).to(db)
    out = assert_matches_cpu(torch.add, a, b)
    assert out.dtype == torch.promote_types(da, db)


def test_zero_dim_tensor_priority():
    a = torch.ones(3, dtype=torch.float16)
    b = torch.tensor(2.0, dtype=torch.float64)
    out = assert_matches_cpu(torch.mul, a, b)
    assert out.dtype == torch.float16


def test_int_division_modes():
    a = torch.tensor([-7, -3, 5, 7])
    b = torch.tensor([2, 2, -3, 3])
    assert_matches_cpu(torch.div, a, b)
    assert_matches_cpu(lambda x, y: torch.div(x, y, rounding_mode="floor"), a, b)
    assert_matches_cpu(lambda x, y: torch.div(x, y, rounding_mode="trunc"), a, b)
    assert_matches_cpu(torch.remainder, a, b)


def test_compare_and_where():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    assert_matches_cpu(lambda x, y: (x > y, x == y, torch.where(x > y, x, y), torch.clamp(x, -0.5, 0.5)), a, b)
    assert_matches_cpu(lambda x: x.masked_fill(x < 0, -1.0), a)


def test_shape_mismatch_error_names_op(dev):
    a = torch.ones(2, 3, device=dev)
    b = torch.ones(4, device=dev)
    with pytest.raises(RuntimeError, match="add"):
        a + b


def test_scalars_do_not_recompile(dev):
    x = torch.ones(4, device=dev)
    txc.sync()
    txc.executor.clear_cache()  # an earlier test may have compiled x * s
    txc.metrics.clear()
    for s in (0.5, 1.5, 2.5):
        (x * s).cpu()
    assert txc.metrics.counters()["compile"] == 1


def test_equal_numbers_share_a_parameter_and_the_sharing_is_part_of_the_graph(dev):
    """Equal Python numbers in one graph read one parameter (an optimizer's
    betas and eps appear once per parameter tensor); which numbers are equal
    is part of the graph's identity, so a call whose numbers are equal in
    another pattern compiles its own executable, never runs the other's."""
    x_cpu = torch.randn(4)
    x = x_cpu.to(dev)
    txc.sync()
    txc.executor.clear_cache()
    txc.metrics.clear()

    def f(t, a, b):
        return t * a + t.cos() * b + (t * a).sin() * a

    from torch_xla_core import debug
    text = debug.stablehlo([f(x, 0.25, 0.25)])
    assert text.split("@main(")[1].split(")")[0].count("%arg") == 2  # x and one 0.25
    for a, b in ((2.0, 2.0), (2.0, 3.0), (5.0, 5.0), (7.0, 1.0), (-1.5, -1.5)):
        torch.testing.assert_close(f(x, a, b).cpu(), f(x_cpu, a, b))
    assert txc.metrics.counters()["compile"] == 2  # one per pattern: a == b, a != b


_POW_BASES = {
    "int64": torch.tensor([-3, -1, 0, 1, 2, 3]), "int32": torch.tensor([-2, 0, 1, 2, 3, 4], dtype=torch.int32),
    "uint8": torch.tensor([0, 1, 2, 3, 4, 5], dtype=torch.uint8),
    "float32": torch.tensor([0.5, 0.0, 1.0, 2.0, 3.0, 4.0]),
    "float64": torch.tensor([0.5, 0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64),
    "bfloat16": torch.tensor([0.5, 0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16),
    "bool": torch.tensor([True, False, True, True, False, True]),
}
_POW_EXPS = [0, 1, 2, 3, -1, -2, 0.0, 0.5, 1.0, 2.0, 3.0, -1.0, -0.5, 2.5, True, False]


def _same_outcome(fn, *args):
    """fn on CPU and xla: the same dtype and values, or the same exception type."""
    try:
        want, err = fn(*args), None
    except Exception as e:  # noqa: BLE001 - the oracle's own error
        want, err = None, e
    xargs = [a.to(txc.device()) if isinstance(a, torch.Tensor) else a for a in args]
    if err is not None:
        with pytest.raises(type(err)):
            fn(*xargs).cpu()
        return
    got = fn(*xargs)
    assert got.device.type == "xla"
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    torch.testing.assert_close(got.cpu(), want, equal_nan=True)


@pytest.mark.parametrize("base", list(_POW_BASES), ids=list(_POW_BASES))
def test_pow_dtype_and_values_match_cpu(base):
    t = _POW_BASES[base]
    for e in _POW_EXPS:
        _same_outcome(lambda x: x ** e, t)           # pow.Tensor_Scalar
        _same_outcome(lambda x: e ** x, t)           # pow.Scalar (Python number ** tensor)
    for other in _POW_BASES.values():
        _same_outcome(lambda x, y: x ** y, t, other)          # pow.Tensor_Tensor
        _same_outcome(lambda x, y: x ** y, t, other[3].clone())  # 0-d exponent tensor


def test_pow_error_leaves_process_working(dev):
    with pytest.raises(RuntimeError, match="negative integer powers"):
        torch.arange(3, device=dev) ** -1
    assert (torch.arange(3, device=dev) ** 2.0).cpu().tolist() == [0.0, 1.0, 4.0]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_shifts_match_cpu_for_every_amount(dtype):
    """>>, <<, bitwise_*_shift (tensor, scalar and in-place forms) lower without fallback and agree with
    CPU's kernels for negative and oversized amounts too (0, or the sign fill for >> on signed types)."""
    a = torch.tensor([-9, 5, 100, 7, -1, 3, -128, 64], dtype=torch.int64).to(dtype)
    b = torch.tensor([1, 2, 3, 40, -1, 7, 0, 8], dtype=torch.int64).to(dtype)
    cases = [lambda a, b: a >> 2, lambda a, b: a << 3, lambda a, b: a >> b, lambda a, b: a << b,
             lambda a, b: torch.bitwise_right_shift(a, b), lambda a, b: torch.bitwise_left_shift(3, b),
             lambda a, b: a.clone().__irshift__(b), lambda a, b: a.clone().bitwise_left_shift_(2)]
    before = dict(txc.metrics.fallbacks())
    for f in cases:
        want, got = f(a, b), f(a.to(txc.device()), b.to(txc.device())).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (dtype, want.tolist(), got.tolist())
    assert dict(txc.metrics.fallbacks()) == before
    with pytest.raises(NotImplementedError, match="bitwise_right_shift: not implemented for 'Float'"):
        torch.ones(2, device=txc.device()) >> 1                # as CPU's "rshift_cpu" not implemented for 'Float'
    for f in (torch.bitwise_not, lambda x: x & 3, lambda x: torch.bitwise_or(x.to(torch.complex64), 1), lambda x: 3 << x):
        _same_outcome(f, torch.ones(2))


_NO_BOOL_KERNEL = [torch.fmod, torch.remainder, torch.floor_divide, torch.bitwise_left_shift,
                   torch.bitwise_right_shift, torch.sub, torch.rsub,
                   lambda a, b: torch.div(a, b, rounding_mode="floor"),
                   lambda a, b: torch.div(a, b, rounding_mode="trunc"),
                   lambda a, b: a.clone().fmod_(b), lambda a, b: a.clone().remainder_(b),
                   lambda a, b: a.clone().sub_(b), lambda a, b: torch.sub(a, b, alpha=2)]


_INTEGER_DIVISIONS = {
    "floor_divide": torch.floor_divide, "//": lambda a, b: a // b, "fmod": torch.fmod, "remainder": torch.remainder,
    "%": lambda a, b: a % b, "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "fmod_": lambda a, b: a.clone().fmod_(b),
    "floor_divide_": lambda a, b: a.clone().floor_divide_(b), "remainder_out": lambda a, b: torch.remainder(
        a, b, out=torch.empty_like(a))}


@pytest.mark.parametrize("name", list(_INTEGER_DIVISIONS))
def test_integer_division_by_zero_raises_as_cpu(name):
    """torch's integer kernels of floor/trunc division, fmod and remainder
    raise ZeroDivisionError (a RuntimeError) on a zero divisor; the device
    would return a value. A zero number is refused at the call; a tensor
    divisor by a deferred check, at the sync, naming the op. Without a zero,
    and in floating point (inf/nan), they compute as CPU."""
    fn, dev = _INTEGER_DIVISIONS[name], txc.device()
    a, b = torch.tensor([7, -7, 5], dtype=torch.int32), torch.tensor([2, 3, 0], dtype=torch.int32)
    op = {"//": "floor_divide", "%": "remainder", "div_floor": "div(rounding_mode='floor')",
          "div_trunc": "div(rounding_mode='trunc')"}.get(name, name.rstrip("_").replace("_out", ""))
    for divisor in (b, 0, b[2:]):  # a tensor, a number, a 0-d... 1-element tensor holding 0
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            fn(a, divisor)
        with pytest.raises(RuntimeError, match=rf"ZeroDivisionError: {re.escape(op)} of integers \(torch.int32\)"):
            out = fn(a.to(dev), divisor.to(dev) if isinstance(divisor, torch.Tensor) else divisor)
            txc.sync(wait=True)
            out.cpu()
    # the pending check was consumed: the next graph runs. An in-place op that fails to write its result
    # (its shape) leaves no check behind either.
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a[:1].to(dev).fmod_(b.to(dev))
    txc.sync(wait=True)
    _same_outcome(fn, a, b.clamp(min=1))
    _same_outcome(fn, a, -3)
    _same_outcome(fn, a.double(), b)       # floating: inf / nan, no error
    _same_outcome(fn, a, b.double())


@pytest.mark.parametrize("fn", _NO_BOOL_KERNEL)
def test_ops_without_a_bool_kernel_match_cpu_on_bools(fn):
    """fmod, remainder, floor division, shifts, sub and neg of bools: torch's
    CPU kernels raise NotImplementedError (no 'Bool' kernel; sub refuses any
    bool operand), at the call, not a compile failure later; where a bool
    promotes with another dtype they compute, in that dtype, as CPU."""
    a = torch.tensor([[True, False, True], [False, True, True]])
    others = [a.flip(1), torch.tensor(True), torch.tensor([3, 1, 2], dtype=torch.int32),
              torch.tensor([[2.5], [-1.5]], dtype=torch.float64), True, 2, 1.5]
    for b in others:
        for x, y in ((a, b), (b, a)):
            if not isinstance(x, torch.Tensor) and fn not in (torch.remainder, torch.bitwise_left_shift, torch.sub):
                continue  # no number-first overload
            _same_outcome(fn, x, y)
    # refused at the call: no graph is left pending with an op that cannot compile
    with pytest.raises(NotImplementedError, match="fmod: not implemented for 'Bool'"):
        torch.fmod(a.to(txc.device()), True)
    with pytest.raises(NotImplementedError, match="Negation, the `-` operator, on a bool tensor"):
        -a.to(txc.device())
    _same_outcome(torch.neg, a)
    _same_outcome(torch.neg, a.to(torch.int8))
