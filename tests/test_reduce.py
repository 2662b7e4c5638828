"""Reductions (torch_xla_core/_ops/reduce.py, csrc/ops/reduce.cpp) against CPU
eager: empty inputs (errors where torch has no identity, values where it
has one) and the index argmax/argmin/max/min pick on ties and NaN."""
import pytest
import torch


# (name, fn) of reductions over tensors with a zero-size dim.
EMPTY_CASES = [
    ("max.dim0", lambda x: x.max(dim=0)),
    ("max.dim-2", lambda x: x.max(dim=-2)),
    ("max.dim1", lambda x: x.max(dim=1)),
    ("min.dim0", lambda x: x.min(dim=0)),
    ("min.dim1-keep", lambda x: x.min(dim=1, keepdim=True)),
    ("argmax", lambda x: x.argmax()),
    ("argmax.keepdim", lambda x: x.argmax(keepdim=True)),
    ("argmax.dim0", lambda x: x.argmax(0)),
    ("argmax.dim1", lambda x: x.argmax(1)),
    ("argmin", lambda x: x.argmin()),
    ("argmin.dim0", lambda x: x.argmin(0)),
    ("argmin.dim1", lambda x: x.argmin(1)),
    ("amax", lambda x: x.amax()),
    ("amax.dim0", lambda x: x.amax(0)),
    ("amax.dim-2", lambda x: x.amax(-2)),
    ("amax.dim1", lambda x: x.amax(1)),
    ("amax.dims01", lambda x: x.amax((0, 1))),
    ("amin.dim0", lambda x: x.amin(0)),
    ("amin.dim1", lambda x: x.amin(1)),
    ("max", lambda x: x.max()),
    ("min", lambda x: x.min()),
    ("aminmax", lambda x: torch.aminmax(x)),
    ("aminmax.dim1", lambda x: torch.aminmax(x, dim=1)),
    ("sum", lambda x: x.sum()),
    ("sum.dim0", lambda x: x.sum(0)),
    ("prod.dim0", lambda x: x.prod(0)),
    ("mean.dim0", lambda x: x.mean(0)),
    ("any.dim0", lambda x: x.bool().any(0)),
    ("all.dim0", lambda x: x.bool().all(0)),
    ("logsumexp.dim0", lambda x: x.logsumexp(0)),
    ("mode.dim0", lambda x: x.mode(0)),
    ("median", lambda x: x.float().median()),
    ("median.dim0", lambda x: x.median(0)),
    ("median.dim1", lambda x: x.median(1)),
]


def _cpu_outcome(fn, x):
    try:
        return fn(x), None
    except Exception as e:  # noqa: BLE001 - the oracle's own error
        return None, e


@pytest.mark.parametrize("name,fn", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
@pytest.mark.parametrize("shape", [(0, 3), (0,), (2, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_empty_reductions_match_cpu(name, fn, shape, dtype, dev):
    x = torch.ones(shape, dtype=dtype)
    if dtype != torch.float32 and name.split(".")[0] in ("mean", "logsumexp"):
        pytest.skip("float-only reduction")
    want, err = _cpu_outcome(fn, x)
    if err is not None:
        with pytest.raises(type(err)) as got:
            fn(x.to(dev))
        # torch's message names the op and the dim at fault
        assert str(got.value) == str(err)
        return
    got = fn(x.to(dev))
    flat_w = want if isinstance(want, tuple) else (want,)
    flat_g = got if isinstance(got, tuple) else (got,)
    for w, g in zip(flat_w, flat_g):
        assert g.device.type == "xla"
        torch.testing.assert_close(g.cpu(), w, equal_nan=True)


def test_empty_reduction_error_leaves_process_working(dev):
    x = torch.ones(0, 3, device=dev)
    with pytest.raises(IndexError):
        x.argmax(0)
    assert torch.equal(torch.arange(4, device=dev).argmax().cpu(), torch.tensor(3))


def _ties_and_nans(rows=64, n=4099, seed=0):
    """Rows with many equal values (small integers) and, in some rows,
    several NaNs at scattered positions: the first max/min or first NaN is
    what torch returns."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (rows, n), generator=g).float()
    for r in range(0, rows, 2):
        pos = torch.randperm(n, generator=g)[: 1 + r % 7]
        x[r, pos] = float("nan")
    return x


def _assert_same(got, want):
    """Exact agreement, NaN where CPU has NaN (assert_matches_cpu does not allow NaN)."""
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device.type == "xla" and g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w, atol=0, rtol=0, equal_nan=True)


ARG_FNS = [lambda x: x.argmax(1), lambda x: x.argmin(1), lambda x: x.argmax(0), lambda x: x.argmin(0),
           lambda x: x.max(1), lambda x: x.min(1), lambda x: x.max(0), lambda x: x.min(0),
           lambda x: x.argmax(), lambda x: x.argmin(), lambda x: x.argmax(1, keepdim=True),
           lambda x: x.max(-1, keepdim=True)]
ARG_IDS = ["argmax1", "argmin1", "argmax0", "argmin0", "max1", "min1", "max0", "min0", "argmax", "argmin",
           "argmax1k", "max-1k"]


@pytest.mark.parametrize("fn", ARG_FNS, ids=ARG_IDS)
def test_arg_reductions_pick_the_first_tie_and_first_nan(fn, dev):
    x = _ties_and_nans()
    _assert_same(fn(x.to(dev)), fn(x))
    # without NaN: the first of equal maxima/minima
    y = torch.nan_to_num(x, nan=1.0)
    _assert_same(fn(y.to(dev)), fn(y))


@pytest.mark.parametrize("fn", ARG_FNS, ids=ARG_IDS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.int8])
def test_arg_reductions_ties_integers(fn, dtype, dev):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 2, (16, 5003), generator=g).to(dtype)
    _assert_same(fn(x.to(dev)), fn(x))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool])
def test_min_max_of_extreme_integers(dtype, dev):
    # the reductions' identities are the dtype's extremes (int64's max is 2^63-1)
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    vals = [5, 3, 7] if info is None else [info.max, 3, info.min, info.max - 1]
    x = torch.tensor(vals).to(dtype) if dtype != torch.bool else torch.tensor([True, False])
    for fn in (lambda t: t.amin(), lambda t: t.amax(), lambda t: t.min(), lambda t: t.max()):
        _assert_same(fn(x.to(dev)), fn(x))
    if dtype != torch.bool:
        for fn in (lambda t: t.min(0), lambda t: t.max(0), lambda t: t.argmin(), lambda t: t.argmax()):
            _assert_same(fn(x.to(dev)), fn(x))
        y = torch.tensor([7, 3, 5]).to(dtype)
        for fn in (lambda t: t.amin(), lambda t: t.min(0), lambda t: t.argmin()):
            _assert_same(fn(y.to(dev)), fn(y))


def _run_swapped(y):
    """y's graph compiled twice: as emitted, and with every arg-reduction
    combiner's operands swapped (^bb0(a, ai, b, bi) -> ^bb0(b, bi, a, ai)),
    i.e. as if XLA combined a later partial result with an earlier one."""
    import re

    from torch_xla_core import _C, runtime

    cut = _C.GraphCut([y._lt])
    text = cut.lower()
    pat = re.compile(r"\^bb0\((%\w+: tensor<\w+>), (%\w+: tensor<i64>), (%\w+: tensor<\w+>), (%\w+: tensor<i64>)\)")
    swapped, n = pat.subn(r"^bb0(\3, \4, \1, \2)", text)
    assert n >= 1, text
    params = [runtime.scalar(*p) if type(p) is tuple else p for p in cut.params()]
    outs = []
    for t in (text, swapped):
        (buf,), t0 = runtime.launch(runtime.compile_text(t), params)
        runtime.wait_ready([buf], t0)
        outs.append(runtime.to_host(buf))
    return outs


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_arg_combiner_does_not_depend_on_combine_order(name, dev):
    nan = float("nan")
    x = torch.tensor([[nan, 1.0, nan, 2.0],   # first NaN
                      [nan, nan, nan, nan],   # all NaN: the first
                      [3.0, 3.0, 3.0, 3.0],   # all equal: the first
                      [1.0, 5.0, 5.0, -1.0],  # two maxima
                      [0.0, -1.0, -1.0, 5.0]])  # two minima
    want = getattr(x, name)(1)
    for got in _run_swapped(getattr(x.to(dev), name)(1)):
        assert torch.equal(got, want), (got, want)


@pytest.mark.parametrize("fn", [torch.std, torch.var, torch.var_mean, torch.std_mean])
@pytest.mark.parametrize("dtype", [torch.int32, torch.bool])
def test_std_var_of_integers_raise_cpus_error(fn, dtype, dev):
    """torch 2.15 raises NotImplementedError here, 2.11-2.14 RuntimeError: the
    device raises what CPU eager raises, with its message, before tracing."""
    x = torch.ones(2, 3, dtype=dtype)
    with pytest.raises(Exception) as cpu:
        fn(x, dim=0)
    with pytest.raises(type(cpu.value), match="only support floating point and complex"):
        fn(x.to(dev), dim=0)
