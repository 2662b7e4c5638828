"""Dtypes torch's own kernels refuse are refused on the device too
(_ops/dtype_rules.py): PyTorch's OpInfo samples in int64 and bool, wherever
CPU raises "not implemented for", must raise on the device, naming the op
and the dtype, instead of computing (float math truncated into integers)."""
import warnings

import pytest
import torch
import torch.nn.functional as F

# Where CPU refuses ("not implemented for") and the device computes, on purpose: the result is exact for
# integers and bools (pools and unpooling, nearest interpolation, unfold, histc, pads, threshold,
# sorting/searching, index_reduce amax/amin/prod, trace; CUDA has integer kernels for several, and
# transformers calls histc on int32 expert ids), C++ mappings whose result for a bool is the bool
# (floor/ceil/round/trunc; clamp with tensor bounds is and/or), masked.cumsum/cumprod of bool (torch's own
# composite asks for a bool cumsum)
_EXACT_BOTH = ("max_pool2d_with_indices_backward", "nn.functional.adaptive_max_pool1d",
               "nn.functional.adaptive_max_pool2d", "nn.functional.adaptive_max_pool3d",
               "nn.functional.interpolate.nearest", "nn.functional.interpolate.nearest-exact",
               "nn.functional.max_pool1d", "nn.functional.upsample_nearest")
_EXACT_INT64 = ("histc", "nn.functional.max_unpool1d", "nn.functional.max_unpool1d.grad", "nn.functional.max_unpool2d",
                "nn.functional.max_unpool2d.grad", "nn.functional.max_unpool3d", "nn.functional.max_unpool3d.grad",
                "nn.functional.unfold")
_EXACT_BOOL = ("bucketize", "ceil", "clamp", "floor", "index_reduce.amax", "index_reduce.amin", "index_reduce.prod",
               "kthvalue", "masked.cumprod", "masked.cumsum", "median", "nanmedian", "nn.functional.max_pool2d",
               "nn.functional.max_pool3d", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
               "nn.functional.pad.replicate_negative", "nn.functional.threshold", "round", "trace", "trunc")
KNOWN = {*((n, d) for n in _EXACT_BOTH for d in (torch.int64, torch.bool)),
         *((n, torch.int64) for n in _EXACT_INT64), *((n, torch.bool) for n in _EXACT_BOOL)}


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(a, dev) for a in x)
    return x


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_opinfo_dtypes_cpu_refuses_are_refused(dev, dtype):
    from torch.testing._internal.common_methods_invocations import op_db
    computed, checked = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in op_db:
            name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            if (name, dtype) in KNOWN:
                continue
            try:
                samples = list(op.sample_inputs("cpu", dtype, requires_grad=False))[:2]
            except Exception:
                continue
            for s in samples:
                try:
                    op(s.input, *s.args, **s.kwargs)
                    continue
                except Exception as e:
                    if "not implemented for" not in str(e):
                        continue
                checked += 1
                try:
                    r = op(_to(s.input, dev), *_to(s.args, dev), **{k: _to(v, dev) for k, v in s.kwargs.items()})
                    torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, r)
                    computed.append(name)
                except (NotImplementedError, RuntimeError, TypeError, ValueError):
                    pass
                break
    assert checked > 20
    assert not computed, f"computed where CPU raises 'not implemented for' {dtype}: {sorted(set(computed))}"


def test_the_error_names_the_op_and_dtype(dev):
    x = torch.tensor([1, -2, 3], device=dev)
    with pytest.raises(NotImplementedError, match=r"aten::celu: not implemented for 'Long' \(torch.int64\)"):
        F.celu(x)
    with pytest.raises(NotImplementedError, match=r"aten::frac_: not implemented for 'Long'"):
        x.frac_()
    with pytest.raises(NotImplementedError, match=r"aten::hypot: not implemented for 'Long'"):
        torch.hypot(x, x)
    with pytest.raises(NotImplementedError, match=r"aten::_trilinear: not implemented for 'Bool'"):
        F.bilinear(*(torch.ones(2, 3, dtype=torch.bool, device=dev),) * 2, torch.ones(4, 3, 3, dtype=torch.bool,
                                                                                      device=dev))
    # histc of int32 (CUDA computes it; transformers' MoE routing calls it) stays exact
    ids = torch.tensor([0, 2, 2, 3, 1, 2], dtype=torch.int32)
    torch.testing.assert_close(torch.histc(ids.to(dev), bins=4, min=0, max=3).cpu(),
                               torch.histc(ids.float(), 4, 0, 3).to(torch.int32))  # CUDA keeps int32
    # what torch computes still computes: the same ops on floats, round of an integer, hypot of int and float
    torch.testing.assert_close(F.celu(x.float()).cpu(), F.celu(x.cpu().float()))
    torch.testing.assert_close(torch.round(x).cpu(), x.cpu())
    torch.testing.assert_close(torch.hypot(x, x.float()).cpu(), torch.hypot(x.cpu(), x.cpu().float()))


def test_matrix_products_of_bool_tensors_raise_instead_of_crashing(dev):
    """XLA:CPU aborted the process compiling a bool dot with an addend (F.linear with a bias)."""
    x = torch.tensor([[True, False]], device=dev)
    w = torch.tensor([[True, True], [False, True]], device=dev)
    for f in (lambda: F.linear(x, w, w[0]), lambda: x @ w, lambda: torch.einsum("ij,jk->ik", x, w)):
        with pytest.raises(RuntimeError, match="bool"):
            f().cpu()


@pytest.mark.parametrize("dt", [torch.uint8, torch.int8, torch.int32])
def test_small_integer_dtypes_keep_torch_result_dtypes(dev, dt):
    """Found by an OpInfo sweep in uint8/int32 (not in CI: ~4 min a dtype): abs of uint8 failed to
    compile (stablehlo.abs takes signless integers only), any/all of uint8 are uint8 in torch,
    addbmm and bilinear of int32/uint8 returned int64 (their sums took the default integer sum dtype)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (3, 4), generator=g).to(dt)
    b1, b2 = torch.randint(0, 3, (2, 3, 4), generator=g).to(dt), torch.randint(0, 3, (2, 4, 5), generator=g).to(dt)
    w = torch.randint(0, 3, (2, 4, 4), generator=g).to(dt)
    cases = {
        "abs": lambda d: torch.abs(x.to(d)),
        "all": lambda d: torch.all(x.to(d)),
        "any_dim": lambda d: torch.any(x.to(d), 1),
        "addbmm": lambda d: torch.addbmm(torch.ones(3, 5, dtype=dt).to(d), b1.to(d), b2.to(d)),
        "bilinear": lambda d: F.bilinear(x.to(d), x.to(d), w.to(d)),
    }
    for name, f in cases.items():
        want, got = f("cpu"), f(dev).cpu()
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert torch.equal(got, want), name


def test_complex_logcumsumexp_keeps_the_imaginary_part(dev):
    """logcumsumexp of complex64 returned float32 (the jax bridge cast complex inputs to float: the
    imaginary part silently dropped); the jax-computed special functions refuse complex as torch does."""
    x = torch.tensor([[-1000 + 1j, 0 + 2j, 3 - 1j], [0.5 - 0.5j, 1 + 0j, -2 + 3j]], dtype=torch.complex64)
    got = torch.logcumsumexp(x.to(dev), 1).cpu()
    assert got.dtype == torch.complex64
    torch.testing.assert_close(got, torch.logcumsumexp(x, 1))
    with pytest.raises((NotImplementedError, RuntimeError), match="complex"):
        torch.special.erfcx(x.to(dev)).cpu()
