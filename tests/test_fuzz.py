"""The op fuzzer's fixed-seed budget (tests/fuzz.py: random calls of common
ops on random shapes and dtypes, each against CPU eager), and its findings
kept as regression tests, each compared with CPU eager: a 0-d cat crashed
the process, empty boolean masks and zero-size indexing failed to compile,
0-d flip and repeated flip dims failed at the sync, view(dtype) was
refused, NaN/inf to integers and sign(NaN) differed from CPU."""
import math
import os

import pytest
import torch

import fuzz
import torch_xla_core as txc

# a fixed-seed budget for CI (TXC_FUZZ_CASES overrides); `nox -s fuzz -- --cases N` runs more
BUDGET = int(os.environ.get("TXC_FUZZ_CASES", "300"))


def test_fixed_seed_budget_has_no_finding():
    """Cases run in child processes: a crash is a finding, not a dead test run."""
    res = fuzz.run(BUDGET, seed=0, batch=250, log=lambda *_: None)
    assert sum(res["counts"].values()) == BUDGET
    assert res["counts"].get("ok", 0) > BUDGET // 2       # mostly real comparisons, not refusals
    lines = [f"{f['verdict']}: {f['case']}: {f['detail']}" for f in res["findings"]]
    assert not lines, "\n".join(lines)


def test_the_runner_reports_a_crash_and_goes_on(monkeypatch, tmp_path):
    """A case that kills its child is a 'crash' finding with its index; the cases after it still run."""
    monkeypatch.setenv("TXC_FUZZ_CRASH_AT", "3")
    res = fuzz.run(6, seed=0, batch=6, log=lambda *_: None)
    crashes = [f for f in res["findings"] if f["verdict"] == "crash"]
    assert [c["i"] for c in crashes] == [3]
    assert sum(res["counts"].values()) == 6


def test_every_known_difference_has_a_reason():
    assert fuzz.KNOWN
    for k in fuzz.KNOWN:
        assert k.family in fuzz.FAMILIES and len(k.reason) > 30, k


def _same(dev, fn, *args):
    """fn on CPU and on the xla device: equal results, or the same exception type."""
    try:
        want = fn(*args)
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)) as got:
            fn(*(a.to(dev) for a in args)).cpu()
        assert type(got.value) is type(e), got.value
        return e
    got = fn(*(a.to(dev) for a in args))
    got = [g.cpu() for g in got] if isinstance(got, (tuple, list)) else got.cpu()
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)
    return got


def test_cat_of_0d_tensors_raises_as_cpu(dev):
    a = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match=r"zero-dimensional tensor \(at position 0\) cannot be concatenated"):
        torch.cat([a.to(dev), a.to(dev)], dim=0)
    with pytest.raises(RuntimeError, match=r"zero-dimensional tensor \(at position 1\) cannot be concatenated"):
        torch.cat([torch.zeros(2).to(dev), a.to(dev)])
    torch.testing.assert_close(torch.stack([a.to(dev), a.to(dev)]).cpu(), torch.stack([a, a]))


def test_core_concat_of_0d_operands_raises_not_crashes(dev):
    """The core's own shape rule refuses (a caller that skips torch's check must not crash the process)."""
    from torch_xla_core import _C
    from torch_xla_core._tracing import tensor as _tensor
    a = torch.tensor(1.0).to(dev)
    with pytest.raises(RuntimeError, match=r"concat: zero-dimensional tensor \(at position 0\)"):
        _C.op(_tensor.OP.concat, (a._lt, a._lt), (0,), True)
    v = torch.zeros(2).to(dev)
    with pytest.raises(RuntimeError, match=r"concat: dimension 3 out of range"):
        _C.op(_tensor.OP.concat, (v._lt, v._lt), (3,), True)
    with pytest.raises(RuntimeError, match=r"flip: invalid dims \[0\]"):
        _C.op(_tensor.OP.flip, (a._lt,), ([0],), True)


@pytest.mark.parametrize("shape", [(0,), (1, 0), (3, 0, 1)])
def test_boolean_mask_of_an_empty_tensor(dev, shape):
    a = torch.randn(shape)
    got = a.to(dev)[a.to(dev) > 0].cpu()
    assert got.shape == a[a > 0].shape and got.dtype == a.dtype


def test_indexing_zero_size_tensors(dev):
    z = torch.zeros(0, 1, 2, 0)
    empty = torch.zeros(0, dtype=torch.long)
    for fn in (lambda x, i: x.index_select(0, i), lambda x, i: x[i], lambda x, i: x[:, :, i[:0]],
               lambda x, i: torch.gather(x, 0, i.reshape(0, 1, 1, 0))):
        _same(dev, fn, z, empty)
    _same(dev, lambda x, i: x[i], torch.zeros(0), empty)
    _same(dev, lambda x, i: x.index_put((i,), torch.tensor(1.0)), torch.zeros(0, 3), empty)
    # indices into a dim of size 0: IndexError at the call, as CPU (was RuntimeError; case 0:230)
    x, i0, i1 = torch.zeros(1, 0, dtype=torch.bfloat16), torch.tensor([0, -1]), torch.tensor([0])
    _same(dev, lambda x, a, b: x[a, b], x, i0, i1)
    _same(dev, lambda x, b: x[:, b], x, i1)
    _same(dev, lambda x, a, b: x.index_put((a, b), torch.tensor(1.0, dtype=x.dtype, device=x.device)), x, i0, i1)
    # index_add into a tensor of no elements adds nothing, whatever the index (CPU's kernel; case 0:281),
    # except a 1-D one: IndexError for any index (case 1:391)
    src = torch.ones(3, 1, 1, dtype=torch.float16)
    for i in (torch.tensor([0]), torch.tensor([5])):
        _same(dev, lambda x, i, s: x.index_add(1, i, s), torch.zeros(3, 0, 1, dtype=torch.float16), i, src)
    for dt in (torch.float32, torch.complex64):
        _same(dev, lambda x, i, s: x.index_add(0, i, s), torch.zeros(0, dtype=dt), torch.tensor([0]), torch.ones(1, dtype=dt))
        _same(dev, lambda x, i, s: x.index_add(0, i, s), torch.zeros(0, dtype=dt), torch.tensor([], dtype=torch.long),
              torch.ones(0, dtype=dt))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bool, torch.int64])
def test_flip_of_a_0d_tensor(dev, dtype):
    x = torch.tensor(3).to(dtype)
    for dims in ((0,), (-1,), ()):
        _same(dev, lambda t: t.flip(dims), x)


def test_flip_with_repeated_dims_raises_at_the_call(dev):
    x = torch.zeros(2, 3).to(dev)
    for dims in ((0, 1, 1), (0, -2)):
        with pytest.raises(RuntimeError, match="appears multiple times in the list of dims"):
            x.flip(dims)                          # at the call, no read needed
    with pytest.raises(IndexError):
        x.flip(2)


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.int32), (torch.int32, torch.float32),
                                     (torch.float32, torch.uint8), (torch.uint8, torch.float32),
                                     (torch.float64, torch.int16), (torch.bfloat16, torch.float16),
                                     (torch.int8, torch.bool), (torch.bool, torch.uint8),
                                     (torch.int16, torch.int8), (torch.float16, torch.int64)])
def test_view_dtype_is_a_bitcast_as_cpu(dev, src, dst):
    x = torch.randn(3, 8, dtype=torch.float64) * 100
    x = x.to(src) if src.is_floating_point else x.to(torch.int64).to(src)
    _same(dev, lambda t: t.view(dst), x)
    _same(dev, lambda t: t[1:, 2:6].view(dst), x)            # a view of a view: offset and strides scale
    _same(dev, lambda t: t.t().view(dst), x)                  # stride(-1) != 1: both raise when sizes differ


def test_view_dtype_writes_through_and_refuses_as_cpu(dev):
    x = torch.arange(8, dtype=torch.float32)
    xd = x.to(dev)
    v, vd = x.view(torch.int32), xd.view(torch.int32)
    v[2] = 0x7F800000                                        # +inf's bits, written through the int view
    vd[2] = 0x7F800000
    torch.testing.assert_close(xd.cpu(), x)
    b, bd = x.view(torch.uint8), xd.view(torch.uint8)
    assert bd.shape == b.shape and bd.stride() == b.stride()
    bd[4:8] = 0
    b[4:8] = 0
    torch.testing.assert_close(xd.cpu(), x)
    for bad in (lambda t: t[1:].view(torch.uint8).view(torch.float32),   # offset not divisible
                lambda t: torch.tensor(1.0, device=t.device).view(torch.uint8),   # 0-d, another size
                lambda t: t.view(torch.uint8)[:7].view(torch.float32)):  # size not divisible
        _same(dev, bad, x)
    with pytest.raises(NotImplementedError, match="complex"):
        xd.view(torch.complex64)


@pytest.mark.parametrize("src", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_nan_and_inf_to_integers_as_cpu(dev, src):
    vals = [math.nan, math.inf, -math.inf, 1e10, -1e10, 300.5, -1.5, 128.0, -129.0, 65539.0, 2.0**31,
            -2.0**31 - 1e3, 2.0**63, 3e38, 40000.0, -40000.0, -0.7, 2.0**31 - 128]
    x = torch.tensor(vals, dtype=torch.float64).to(src)
    for dst in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool):
        _same(dev, lambda t: t.to(dst), x)


def test_sign_and_sgn_of_nan_are_zero_as_cpu(dev):
    x = torch.tensor([math.nan, -math.nan, math.inf, -math.inf, -2.0, 0.0, 3.0])
    for dt in (torch.float32, torch.float64, torch.bfloat16):
        _same(dev, torch.sign, x.to(dt))
        _same(dev, torch.sgn, x.to(dt))


def test_a_device_checked_index_raises_at_the_read_right_after(dev):
    """An index only the device can judge: the error is the read's, right after the op, naming it."""
    x = torch.randn(4, 3).to(dev)
    bad = torch.tensor([0, 7]).to(dev)
    with pytest.raises(IndexError, match="index_select: index out of range"):
        torch.index_select(x, 0, bad).cpu()
    txc.sync(wait=True)                                       # reported once: nothing left for later syncs
    with pytest.raises(RuntimeError, match="gather: index out of range"):
        torch.gather(x, 0, bad.reshape(2, 1)).sum().item()
    assert x[torch.tensor([1]).to(dev)].cpu().shape == (1, 3)  # the next read is clean


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_fills_wrap_or_refuse_numbers_as_cpu(dev, dtype):
    """A number an integer dtype cannot hold: uint8 takes integers down to
    -255 wrapped (-2 fills 254; it failed to compile, case 1:109), anything
    else out of range (NaN, inf, -2.5 into uint8) raises torch's overflow error."""
    x = torch.zeros(3, dtype=dtype)
    m = torch.tensor([True, False, True])
    for v in (-2, 2, 127, 300, -300, -255, -256, 70000.0, 2.5, -2.5, 2 ** 40, math.inf, math.nan):
        for fn in (lambda t: torch.full((3,), v, dtype=dtype, device=t.device), lambda t: t.clone().fill_(v),
                   lambda t: t.scatter(0, torch.tensor([1], device=t.device), value=v),
                   lambda t: t.masked_fill(m.to(t.device), v), lambda t: t.index_fill(0, torch.tensor([0], device=t.device), v)):
            _same(dev, fn, x)
    _same(dev, lambda t: t.scatter(-1, torch.zeros(0, dtype=torch.long, device=t.device), value=-2), x[:1])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.float32])
def test_addcmul_casts_value_to_an_integer_result_as_cpu(dev, dtype):
    """value=0.5 on integer tensors is cast to the integer dtype first (0): the
    result stays integer, as ATen's kernel (it came out float32, case 1:251)."""
    a, b, c = (torch.tensor(v, dtype=dtype) for v in (3, 5, 7))
    for value in (0.5, -1.5, 2, 2.75):
        _same(dev, lambda x, y, z: torch.addcmul(x, y, z, value=value), a, b, c)
        _same(dev, lambda x, y, z: torch.addcmul(x, y, z, value=value), a.expand(2, 3), b, c.reshape(1, 1))


def test_topk_of_bool_raises_as_cpu(dev):
    """torch's CPU and CUDA kernels refuse bool topk; it ran on the device (case 1:230)."""
    x = torch.tensor([[True, False, True], [False, False, True]])
    _same(dev, lambda t: torch.topk(t, 1, -2).values, x)
    _same(dev, lambda t: torch.sort(t, -1).values, x)  # sort of bool is fine on CPU, and here


def test_arg_reductions_of_bool_raise_as_cpu(dev):
    """CPU refuses bool argmax/argmin before any other check (cases 1:634, 1:927: it ran; an empty one raised
    the empty-reduction IndexError)."""
    for x in (torch.tensor([[True, False, True]]).t(), torch.zeros(3, 0, 1, dtype=torch.bool)):
        for fn in (torch.argmax, torch.argmin):
            _same(dev, fn, x)
            _same(dev, lambda t: fn(t, dim=-1), x)


def test_complex_refusals_raise_not_implemented_as_cpu(dev):
    """An op torch has no complex kernel for raises NotImplementedError, as CPU's (cases 1:457, 1:458, 1:652,
    1:884: RuntimeError here); the complex functions CPU has (log2, log10, exp2, acosh, asinh, atanh: refused
    here, case 1:864) compute, judged against complex128 from the same inputs."""
    z = torch.tensor([1 + 2j, -0.5 + 0.25j, 3 - 1j, 0.1 - 0.7j, -2 - 3j], dtype=torch.complex64)
    for fn in (torch.sign, lambda t: torch.amin(t, 0), lambda t: t > t, lambda t: torch.atan2(t, t)):
        _same(dev, fn, z)
    for fn in (torch.log2, torch.log10, torch.exp2, torch.acosh, torch.asinh, torch.atanh):
        want, cpu, got = fn(z.to(torch.complex128)), fn(z), fn(z.to(dev)).cpu()
        assert got.dtype == torch.complex64
        err, cpu_err = (got.to(torch.complex128) - want).abs().max(), (cpu.to(torch.complex128) - want).abs().max()
        assert err <= max(4 * cpu_err, 1e-6 * want.abs().max()), (fn, err, cpu_err)


def test_integer_mean_raises_as_cpu_before_any_graph(dev):
    """mean(dtype=<integer>) raises CPU's error (case 1:1432: an int64 mean of an empty tensor reached XLA:CPU as
    0 / 0 in integers and killed the process with SIGFPE)."""
    x = torch.zeros(3, 0, 1, dtype=torch.int8)
    for dtype in (torch.int64, torch.uint8, torch.bool):
        _same(dev, lambda t: torch.mean(t, dtype=dtype), x)
        _same(dev, lambda t: torch.mean(t, 1, dtype=dtype), x)
    _same(dev, lambda t: torch.mean(t, dtype=torch.float32), x)


def test_rounding_and_abs_of_bool_raise_and_sgn_of_uint8_computes_as_cpu(dev):
    """floor/ceil/round/trunc/abs of bool: torch has no kernel (NotImplementedError; they ran, abs failed to
    compile; case 1:1777); sgn/sign of uint8 is 1 where nonzero (stablehlo.sign refused unsigned: case 1:1240)."""
    b = torch.tensor([[True, False, True]])
    for fn in (torch.floor, torch.ceil, torch.round, torch.trunc, torch.abs):
        _same(dev, fn, b)
    u = torch.tensor([[0, 1, 255], [7, 0, 128]], dtype=torch.uint8)
    for fn in (torch.sgn, torch.sign, lambda t: t.expand(2, 2, 3).sgn()):
        _same(dev, fn, u)


def test_index_select_into_a_dim_of_size_0_raises_index_error_as_cpu(dev):
    """Case 1:1039: RuntimeError here, IndexError on CPU."""
    for dt in (torch.float16, torch.int64):
        _same(dev, lambda t, i: t.index_select(-1, i), torch.zeros(0, dtype=dt), torch.tensor([0]))
        _same(dev, lambda t, i: t.index_select(0, i), torch.zeros(0, dtype=dt), torch.tensor([], dtype=torch.long))


def test_complex_checks_that_torch_words_as_runtime_error(dev):
    """Where torch refuses complex with a check, not a missing kernel, it raises RuntimeError: argmax/argmin,
    max/min (with and without dim), maximum/minimum/fmax/fmin (seed 1, cases 2500-19999); and exp2 of an
    infinite real part is a signed zero, as CPU's exp(z ln 2) (case 1:5825: NaN)."""
    z = torch.tensor([[1 + 2j, -0.5 + 0.25j], [3 - 1j, 0.1 - 0.7j]], dtype=torch.complex64)
    for fn in (torch.argmax, torch.argmin, lambda t: torch.argmax(t, 0), torch.max, torch.min,
               lambda t: torch.max(t, 1).values, lambda t: torch.min(t, 0).values,
               lambda t: torch.maximum(t, t), lambda t: torch.minimum(t, t), lambda t: torch.fmax(t, t),
               lambda t: torch.fmin(t, t)):
        _same(dev, fn, z)
    w = torch.tensor([complex(-math.inf, 1.0), complex(-math.inf, -2.0), complex(1.0, 3.0)], dtype=torch.complex64)
    got, want = torch.exp2(w.to(dev)).cpu(), torch.exp2(w)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_integer_pow_wraps_over_every_exponent_bit_as_cpu(dev, dtype):
    """XLA's integer power reads the exponent's low 6 bits: (-4) ** 67 came out as (-4) ** 3 (cases 1:8633,
    1:2948). Negative exponents: 1, +-1 for base -1, else 0, as torch's integer kernel."""
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype == torch.uint8 else -150
    a = torch.randint(lo, 150, (500,), generator=g).to(dtype)
    a[:5] = torch.tensor([0, 1, 2, 3, 7]).to(dtype)
    if dtype != torch.uint8:
        a[5:8] = torch.tensor([-1, -2, -3]).to(dtype)
    e = torch.randint(lo, 250, (500,), generator=g).to(dtype)
    _same(dev, torch.pow, a, e)
    _same(dev, lambda t: torch.pow(t, 67), a)


def test_numbers_in_float_ops_of_integers_and_bool_numbers_as_cpu(dev):
    """`uint8 / -1` divides by -1.0 (the number was cast to uint8 first: 255, case 1:17271); `x - True`
    raises as CPU's sub (a Python bool was taken as a float, case 1:17169)."""
    u = torch.tensor([[0, 3, 146, 255]], dtype=torch.uint8)
    for fn in (lambda t: t / -1, lambda t: torch.true_divide(t.expand(2, 4), -1), lambda t: t.int() / -3,
               lambda t: t.bool() / 2):
        _same(dev, fn, u)
    x = torch.tensor([1.5, -2.0], dtype=torch.float64)
    for fn in (lambda t: t - True, lambda t: torch.sub(t, False), lambda t: t + True, lambda t: t * False):
        _same(dev, fn, x)


def test_complex_and_bool_refusals_of_clamp_relu_nansum_scatter_as_cpu(dev):
    """clamp/relu of complex, relu of bool, nansum of complex, scatter_reduce amax of complex raise CPU's
    types (cases 1:1628, 1:5209, 1:2909, 1:8897); amax/amin of an empty complex tensor compute the empty
    result and max/min over an empty dim raise IndexError first (1:6785, 1:8013); nan_to_num of complex
    works part by part (1:12439)."""
    z = torch.tensor([[1 + 2j, -0.5 + 0.25j, 3 - 1j]], dtype=torch.complex64)
    for fn in (lambda t: torch.clamp(t, None, 2), lambda t: torch.clamp(t, 0, None), torch.relu,
               torch.nansum, lambda t: torch.nansum(t, 0),
               lambda t: t.scatter_reduce(-1, torch.tensor([[0, 0, 1]], device=t.device), t, "amax")):
        _same(dev, fn, z)
    _same(dev, torch.relu, torch.tensor([True, False]))
    e = torch.zeros(3, 0, 1, dtype=torch.complex64)
    for fn in (lambda t: torch.amax(t, (0, 2)), lambda t: torch.amin(t, 0), lambda t: torch.max(t, 1),
               lambda t: torch.min(t, -2)):
        _same(dev, fn, e)
    inf, nan = math.inf, math.nan
    w = torch.tensor([complex(nan, inf), complex(-inf, nan), complex(1.5, -inf)], dtype=torch.complex64)
    _same(dev, torch.nan_to_num, w)
    _same(dev, lambda t: torch.nan_to_num(t, 1.0, 2.0, -3.0), w)
    _same(dev, torch.nansum, torch.tensor([[1.0, nan], [nan, 2.5]]))


def test_shape_checks_before_dtype_and_cat_stack_addmm_as_cpu(dev):
    """Shapes that do not broadcast raise CPU's RuntimeError before a dtype refusal (bitwise_and of floats,
    hypot of int8: 1:4699, 1:17403); cat promotes over the 1-d empty tensors it skips (1:2625); stack of
    unequal shapes raises CPU's RuntimeError (1:15208); an integer addmm with an empty inner dim and a float
    beta raises as CPU's (1:2764); indexing a tensor with no elements reads no index (1:6964, 1:14723)."""
    _same(dev, torch.bitwise_and, torch.ones(1, 4, dtype=torch.bfloat16), torch.ones(1, 5, dtype=torch.bfloat16))
    _same(dev, torch.hypot, torch.ones(5, dtype=torch.int8), torch.ones(6, dtype=torch.int8))
    for a, b in ((torch.zeros(0, dtype=torch.bool), torch.zeros(0, dtype=torch.int64)),
                 (torch.zeros(0, dtype=torch.int8), torch.ones(1, dtype=torch.bool)),
                 (torch.zeros(0, dtype=torch.complex64), torch.zeros(0, dtype=torch.float64))):
        _same(dev, lambda s, t: torch.cat([s, t]), a, b)
    _same(dev, lambda s, t: torch.stack([s, t], -1), torch.ones(1, 4), torch.tensor(2.0))
    c, m1, m2 = torch.ones(3, 3, dtype=torch.int64), torch.ones(3, 0, dtype=torch.int64), torch.ones(0, 3,
                                                                                                   dtype=torch.int64)
    _same(dev, lambda x, y, z: torch.addmm(x, y, z, beta=0.5, alpha=2), c, m1, m2)
    _same(dev, lambda x, y, z: torch.addmm(x, y, z, beta=2, alpha=2), c, m1, m2)
    x = torch.zeros(1, 0)
    _same(dev, lambda t, i: t[i], x, torch.tensor([3]))
    _same(dev, lambda t, i, v: t.index_put((i,), v), x, torch.tensor([3, -1, 0]), torch.tensor(1.0))
