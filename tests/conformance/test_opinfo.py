"""PyTorch's OpInfo database (torch.testing._internal's op_db) on the xla
device against CPU eager: one test per (op, dtype, direction), its samples
classified by _opinfo.run_case and held to the reviewed expected-failure
list (expected_failures.py), strictly: a new failure or an unexpected pass
fails. Mode, sample bounds and the summary: see _opinfo.py and plugin.py."""
import time

import pytest
import torch

from . import _opinfo, expected_failures
from .plugin import KEY

CASES = _opinfo.cases()
pytestmark = pytest.mark.skipif(not CASES, reason=f"TXC_CONFORMANCE={_opinfo.MODE}: no cases")


def _param(case):
    op, dtype, direction, why = case
    cid = f"{_opinfo.op_id(op)}-{str(dtype).removeprefix('torch.')}-{direction}"
    return pytest.param(op, dtype, direction, id=cid,
                        marks=[pytest.mark.skip(reason=why)] if why else [])


@pytest.mark.parametrize("op,dtype,direction", [_param(c) for c in CASES])
def test_opinfo(op, dtype, direction, request):
    oid = _opinfo.op_id(op)
    entry = expected_failures.lookup(oid, direction, dtype, _opinfo.MODE)
    t0 = time.perf_counter()
    results = _opinfo.run_case(op, dtype, direction)
    seconds = round(time.perf_counter() - t0, 3)
    judged = _opinfo.judge(results, entry)
    counts, failures, _, verdict = judged
    request.node.user_properties.append((KEY, {
        "mode": _opinfo.MODE, "op": oid, "dtype": str(dtype).removeprefix("torch."),
        "direction": direction, "counts": counts, "failures": failures[:5],
        "expected": entry.reason if entry else None, "verdict": verdict, "seconds": seconds}))
    _opinfo.settle(f"{oid} {dtype} {direction}", results, entry, judged, "the expected-failure list")


def test_expected_entries_name_real_cases():
    """Every expected-failure entry names an OpInfo case that exists."""
    by_id = {_opinfo.op_id(op): op for op in _opinfo.op_db}
    bad = []
    for x in expected_failures.EXPECTED:
        op = by_id.get(x.op)
        if op is None:
            bad.append(f"{x.op}: no such OpInfo")
            continue
        if x.direction not in ("fwd", "bwd") or x.mode not in ("ci", "full", "all") \
                or not set(x.kinds()) <= set(expected_failures.KINDS) or not x.reason.strip():
            bad.append(f"{x}: malformed")
            continue
        if x.dtype != "*":
            dtype = getattr(torch, x.dtype, None)
            ok = op.supported_dtypes("cpu") if x.direction == "fwd" else op.supported_backward_dtypes("cpu")
            if dtype not in ok:
                bad.append(f"{x.op} has no {x.direction} {x.dtype} case")
    keys = [(x.op, x.direction, x.dtype, x.mode) for x in expected_failures.EXPECTED]
    bad += [f"duplicate entry {k}" for k in set(keys) if keys.count(k) > 1]
    assert not bad, "\n".join(bad)


def test_random_ops_exist():
    """The ops compared by shape only are real OpInfo names (the list cannot rot)."""
    names = {_opinfo.op_id(op) for op in _opinfo.op_db} | {op.name for op in _opinfo.op_db}
    listed = _opinfo.RANDOM | set(_opinfo.RANDOM_WHEN)
    assert not listed - names, sorted(listed - names)


def test_a_mismatch_is_caught():
    """The comparison itself: a wrong value, dtype or device is a mismatch."""
    import torch_xla_core as txc
    x = torch.tensor([1.0, 2.0])
    _opinfo.compare(x.to(txc.device()), x, 1e-5, 1e-5, False)
    for bad in (torch.tensor([1.0, 2.1]).to(txc.device()), x.double().to(txc.device()), x):
        with pytest.raises(_opinfo.Mismatch):
            _opinfo.compare(bad, x, 1e-5, 1e-5, False)
    _opinfo.compare(torch.tensor([5.0, 7.0]).to(txc.device()), x, 0, 0, True)  # random: shape only
    with pytest.raises(_opinfo.Mismatch):
        _opinfo.compare(torch.zeros(3).to(txc.device()), x, 0, 0, True)


class _SyncFails:
    """An op whose second sample fails only when the device computes it (a
    device-side index check), as some ops' samples do: CPU eager runs all."""
    name, variant_test_name, decorators = "index_select", "", ()

    def __call__(self, x, bad):
        if x.device.type == "xla" and bad:
            return torch.index_select(x, 0, torch.tensor([7], device=x.device))  # out of range: the device's check
        return x * 2

    def sample_inputs(self, device, dtype, requires_grad=False):
        from torch.testing._internal.opinfo.core import SampleInput
        return (SampleInput(torch.arange(n * 2.0).reshape(n, 2), args=(n == 3,)) for n in (2, 3, 4))


def test_samples_computed_together_then_one_by_one_where_that_fails():
    """A case's forward samples compute in one sync (one compile); a sync
    that fails sends them one by one, so only the failing sample is an error
    and the others still pass, as when each had its own sync."""
    import torch_xla_core as txc
    x2 = _SyncFails()
    x2.sample_inputs = lambda *a, **k: (s for s in _SyncFails().sample_inputs(*a, **k) if not s.args[0])
    def executables():  # compiled, or loaded from the persistent cache (CI's compat runs load them)
        return sum(txc.metrics.counter_value(c) or 0 for c in ("UncachedCompile", "persistent_cache_hit"))

    before = executables()
    assert [r[1] for r in _opinfo.run_case(x2, torch.float32, "fwd")] == ["pass", "pass"]
    assert executables() - before == 1  # both samples, one graph
    results = _opinfo.run_case(_SyncFails(), torch.float32, "fwd")
    assert [(i, outcome) for i, outcome, _ in results] == [(0, "pass"), (1, "error"), (2, "pass")], results
    assert "index" in results[1][2].lower(), results[1][2]
