"""In-place and out= variants of every OpInfo op that has them, on the xla
device against CPU: the values written, the written tensor returned (the
same object), and torch's dtype rule for a result written into an int64 out.

out= overloads reach the device three ways (torch_xla_core/_ops/resolution.py
_derive): the functional overload's handler then a write (`out_variant`, found by
name or by arguments: sum.IntList_out -> sum.dim_IntList,
linalg_inv_ex.inverse -> linalg_inv_ex), torch's composite kernel, or the CPU
fallback (which writes its host copies back into the out tensors)."""
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

import torch_xla_core as txc
from torch_xla_core._runtime.dtypes import UnsupportedDtype
from conformance._opinfo import RANDOM
from util import opinfo_shard

# Each OpInfo-wide test runs as this many cases, a slice of the ops each (util.opinfo_shard)
OUT_SHARDS, INT64_OUT_SHARDS, INPLACE_SHARDS = 3, 2, 6

# Outputs that are not unique, so CPU and the device may both be right:
# eigenvectors (any sign / phase per vector).
NOT_UNIQUE = {"linalg.eigh"}


def _to(x, device):
    def move(t):
        if isinstance(t, torch.Tensor):
            return t.to(device)
        if isinstance(t, (torch.device, str)) and str(t) == "cpu":  # a factory's device= argument
            return torch.device(device) if isinstance(t, torch.device) else str(device)
        return t
    return pytree.tree_map(move, x)


def _cases(shards, shard):
    for op in opinfo_shard(shards, shard):
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        if not op.supports_out or op.name in RANDOM or name in RANDOM:
            continue
        for s in list(op.sample_inputs("cpu", torch.float32))[:4]:
            try:
                want = op.op(s.input, *s.args, **s.kwargs)
            except Exception:  # noqa: BLE001  (a sample CPU refuses: the conformance suite's business)
                continue
            yield op, name, s, want
            break


def _call(op, s, device, out):
    return op.op(_to(s.input, device), *_to(s.args, device), **_to(s.kwargs, device), out=out)


def _empty_like(want, device, dtype=None):
    return pytree.tree_map(lambda t: torch.empty(t.shape, dtype=dtype or t.dtype, device=device)
                           if isinstance(t, torch.Tensor) else t, want)


@pytest.mark.parametrize("shard", range(OUT_SHARDS))
def test_opinfo_out_variants_match_cpu(dev, shard):
    bad, checked = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, name, s, want in _cases(OUT_SHARDS, shard):
            try:
                out = _empty_like(want, dev)
            except Exception:  # noqa: BLE001  (a dtype the device does not hold: float8, uint64)
                continue
            cpu_out = _empty_like(want, "cpu")
            try:
                cpu_r = _call(op, s, "cpu", cpu_out)
            except Exception:  # noqa: BLE001  (OpInfo's supports_out is wrong for a few: equal)
                continue
            try:
                r = _call(op, s, dev, out)
            except UnsupportedDtype:  # (a float8 input: refused by name)
                continue
            except Exception as e:  # noqa: BLE001
                bad.append(f"{name}: {type(e).__name__}: {str(e)[:100]}")
                continue
            checked += 1
            leaves_r, leaves_o = pytree.tree_leaves(r), pytree.tree_leaves(out)
            if cpu_r is None:  # (a Tensor[] out=: split_with_sizes_copy returns nothing)
                if r is not None:
                    bad.append(f"{name}: returned {type(r).__name__}, CPU returns None")
            elif len(leaves_r) != len(leaves_o) or any(a is not b for a, b in zip(leaves_r, leaves_o)):
                bad.append(f"{name}: returned tensors are not the out= tensors")
            if name in NOT_UNIQUE:
                continue
            try:
                torch.testing.assert_close(pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t,
                                                           out), cpu_out, atol=1e-4, rtol=1e-4, equal_nan=True)
            except AssertionError as e:
                bad.append(f"{name}: values differ: {str(e).splitlines()[0]}")
    assert not bad, "\n".join(bad)
    assert checked >= 250 // OUT_SHARDS * 3 // 4, checked  # (the cases are really there)


@pytest.mark.parametrize("shard", range(INT64_OUT_SHARDS))
def test_opinfo_float_results_into_int64_out_as_on_cpu(dev, shard):
    """torch's rule: a float result into an int64 out raises ("can't be
    cast"), except where the op computes in out's dtype (sum, cumsum, ...):
    the device raises exactly where CPU does."""
    differ, raised = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op, name, s, want in _cases(INT64_OUT_SHARDS, shard):
            if not isinstance(want, torch.Tensor) or not want.dtype.is_floating_point:
                continue
            got = {}
            for d in ("cpu", dev):
                try:
                    _call(op, s, d, _empty_like(want, d, torch.int64))
                    got[d] = "ok"
                except UnsupportedDtype:  # (a float8 input the device does not hold: refused by name)
                    got[d] = "unsupported"
                except Exception:  # noqa: BLE001
                    got[d] = "error"
            if got[dev] == "unsupported":  # (CPU's float8 _scaled_mm runs on some hosts: AMD EPYC here)
                continue
            if got["cpu"] != got[dev]:
                differ.append(f"{name}: CPU {got['cpu']}, xla {got[dev]}")
            raised += got["cpu"] == "error"
    assert not differ, "\n".join(differ)
    assert raised >= 100 // INT64_OUT_SHARDS * 3 // 4, raised


@pytest.mark.parametrize("name", ["sum", "cumsum", "prod", "cumprod"])
def test_reductions_compute_in_the_out_dtype(dev, name):
    """sum(x, 0, out=int64) casts x first, as CPU does (0.6 + 0.6 -> 0, not 1)."""
    f = {"sum": lambda x, o: torch.sum(x, 0, out=o), "cumsum": lambda x, o: torch.cumsum(x, 0, out=o),
         "prod": lambda x, o: torch.prod(x, 0, out=o), "cumprod": lambda x, o: torch.cumprod(x, 0, out=o)}[name]
    x = torch.tensor([[0.6, 1.6], [0.6, 2.5]])
    shape = (2,) if name in ("sum", "prod") else (2, 2)
    want = torch.empty(shape, dtype=torch.int64)
    f(x, want)
    out = torch.empty(shape, dtype=torch.int64, device=dev)
    assert f(x.to(dev), out) is out
    torch.testing.assert_close(out.cpu(), want)
    assert not txc.metrics.fallbacks()


def test_out_kernels_on_the_cpu_fallback_write_back(dev):
    """An out= overload that runs on the CPU fallback (ldl_factor has no
    lowering) writes its results into the out tensors and returns them."""
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    a = a @ a.T + 4 * torch.eye(4)
    want = torch.linalg.ldl_factor(a)
    lu = torch.zeros(4, 4, device=dev)
    piv = torch.zeros(4, dtype=torch.int32, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = torch.linalg.ldl_factor(a.to(dev), out=(lu, piv))
    assert r[0] is lu and r[1] is piv
    torch.testing.assert_close(lu.cpu(), want[0])
    torch.testing.assert_close(piv.cpu(), want[1])
    assert "linalg_ldl_factor_ex" in txc.metrics.fallbacks()  # (it did take the fallback)


# (op name, dtype): where an in-place variant differs from CPU on purpose.
INPLACE_KNOWN = {# refused by name on the device: integer means (torch truncates)
                 ("index_reduce.mean", torch.int64), ("scatter_reduce.mean", torch.int64),
                 # CPU resizes self (a [1] tensor) to the [5, 10] result; an in-place op here keeps self's shape
                 ("addbmm", torch.float32), ("addbmm", torch.int64), ("baddbmm", torch.int64)}


@pytest.mark.parametrize("shard", range(INPLACE_SHARDS))
def test_opinfo_inplace_variants_match_cpu(dev, shard):
    """Every OpInfo in-place variant (float32 and int64, 3 samples each): the same
    values as CPU in self, self returned, and an error exactly where CPU
    raises one (the listed differences aside), without a CPU fallback."""
    bad, checked = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for op in opinfo_shard(INPLACE_SHARDS, shard):
            name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
            if op.inplace_variant is None or op.name in RANDOM or name in RANDOM:
                continue
            for dtype in (torch.float32, torch.int64):
                try:
                    samples = list(op.sample_inputs("cpu", dtype))[:3]
                except Exception:  # noqa: BLE001  (no samples of this dtype)
                    continue
                for s in samples:
                    if not isinstance(s.input, torch.Tensor):
                        continue
                    want = s.input.clone()
                    try:
                        op.inplace_variant(want, *s.args, **s.kwargs)
                        cpu_error = None
                    except Exception as e:  # noqa: BLE001
                        cpu_error = e
                    x = s.input.to(dev)
                    try:
                        r = op.inplace_variant(x, *_to(s.args, dev), **_to(s.kwargs, dev))
                        error = None
                    except Exception as e:  # noqa: BLE001
                        error = e
                    if (cpu_error is None) != (error is None):
                        if (op.name if (op.name, dtype) in INPLACE_KNOWN else name, dtype) not in INPLACE_KNOWN:
                            bad.append(f"{name} {dtype}: CPU {'raises' if cpu_error else 'computes'}, xla "
                                       f"{'raises: ' + str(error)[:80] if error else 'computes'}")
                        continue
                    if error is not None:
                        continue
                    checked += 1
                    if r is not x:
                        bad.append(f"{name} {dtype}: returned a tensor other than self")
                    try:
                        torch.testing.assert_close(x.cpu(), want, atol=1e-4, rtol=1e-4, equal_nan=True)
                    except AssertionError as e:
                        bad.append(f"{name} {dtype}: values differ: {str(e).splitlines()[0]}")
            if txc.metrics.fallbacks() and op.name not in ("gcd", "lcm"):  # (integer gcd runs on the CPU)
                bad.append(f"{name}: CPU fallback {txc.metrics.fallbacks()}")
            txc.metrics.clear()
    assert not bad, "\n".join(bad)
    assert checked >= 400 // INPLACE_SHARDS * 3 // 4, checked  # (the cases are really there)
