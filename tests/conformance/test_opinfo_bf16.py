"""bf16 training conformance (issue 31): every OpInfo op with bf16 forward
and backward on CPU runs its first samples forward and backward in one
graph on the xla device, judged against a float64 reference (_bf16.py says
how); the ops autocast covers run again on float32 inputs under
torch.autocast("xla", dtype=torch.bfloat16). Held to the reviewed list
expected_failures_bf16.py, strictly: a new failure or an unexpected pass
fails. The terminal summary (plugin.py) prints the pass rate and where we
are more or less accurate than CPU, per op family (report_bf16.py)."""
import time

import pytest
import torch

from . import _bf16, _opinfo, expected_failures_bf16 as xf
from ._opinfo import op_db, op_id
from .plugin import KEY

CASES = [(op, run, why) for run in xf.RUNS for op, why in _bf16.cases(run)]
pytestmark = pytest.mark.skipif(not CASES, reason="TXC_BF16=off: no cases")


def _param(case):
    op, run, why = case
    return pytest.param(op, run, id=f"{op_id(op)}-{run}", marks=[pytest.mark.skip(reason=why)] if why else [])


@pytest.mark.parametrize("op,run", [_param(c) for c in CASES])
def test_bf16(op, run, request):
    oid = op_id(op)
    entry = xf.lookup(oid, run)
    t0 = time.perf_counter()
    results = _bf16.run_case(op, run)
    seconds = round(time.perf_counter() - t0, 3)
    if results is None:
        assert entry is None, f"{oid} {run}: listed ({entry.reason}) but autocast does not change it"
        pytest.skip("autocast leaves this op's float32 inputs unchanged")
    judged = _opinfo.judge(results, entry)
    counts, failures, _, verdict = judged
    errs = [(r[3], r[4]) for r in results if r[3] is not None]
    request.node.user_properties.append((KEY, {
        "mode": run, "op": oid, "family": _bf16.family(op), "dtype": "bfloat16", "direction": "fwd+bwd",
        "counts": counts, "failures": failures[:5], "expected": entry.reason if entry else None,
        "verdict": verdict, "seconds": seconds,
        "err_xla": max((e[0] for e in errs), default=None), "err_cpu": max((e[1] for e in errs), default=None),
        "policy": sorted({r[2] for r in results if r[1] == "pass" and r[2]})}))
    _opinfo.settle(f"{oid} {run}", results, entry, judged, "expected_failures_bf16")


def test_expected_entries_name_real_cases():
    """Every bf16 expected-failure entry names an op of its run."""
    ops = {run: {op_id(op) for op, _ in _bf16.cases(run)} for run in xf.RUNS} if _bf16.ENABLED else None
    by_id = {op_id(op) for op in op_db}
    bad = []
    for x in xf.EXPECTED:
        if x.run not in xf.RUNS or not set(x.kinds()) <= set(xf.KINDS) or not x.reason.strip():
            bad.append(f"{x}: malformed")
        elif x.op not in by_id:
            bad.append(f"{x.op}: no such OpInfo")
        elif ops is not None and x.op not in ops[x.run]:
            bad.append(f"{x.op} has no {x.run} case (bf16/float32 forward and backward)")
    for i, x in enumerate(xf.EXPECTED):  # entries of one case hold on torch versions that do not overlap
        for y in xf.EXPECTED[i + 1:]:
            if (x.op, x.run) == (y.op, y.run) and any(x.holds((2, m)) and y.holds((2, m)) for m in range(30)):
                bad.append(f"duplicate entry {(x.op, x.run)} (their torch versions overlap)")
    assert not bad, "\n".join(bad)


def test_version_keyed_entries_hold_on_their_versions_only():
    e = xf.X("op", "bf16", "mismatch", "why", torch=((2, 12), None))
    assert not e.holds((2, 11)) and e.holds((2, 12)) and e.holds((2, 15))
    e = xf.X("op", "bf16", "mismatch", "why", torch=(None, (2, 12)))
    assert e.holds((2, 11)) and not e.holds((2, 12))
    assert xf.X("op", "bf16", "mismatch", "why").holds((2, 11))
    assert xf._version("2.14.1+cu130") == (2, 14)


def test_the_judge():
    """The judge: within bf16 tolerance of CPU passes; otherwise ours must be
    no further from float64 than CPU (or within bf16 tolerance of it);
    integers, dtypes and non-finite values must match."""
    ref = torch.tensor([1.0, 2.0, 100.0], dtype=torch.float64)
    cpu = ref.bfloat16()
    _bf16.judge(cpu.clone(), cpu, ref, "t")
    _bf16.judge(torch.tensor([1.0, 2.0, 101.0]).bfloat16(), cpu, ref, "t")  # 1% off: within tolerance of both
    bad = (torch.tensor([1.0, 2.0, 104.0]).bfloat16(),  # 4% off: past tolerance, CPU exact
           cpu.float(),                                   # another dtype
           torch.tensor([1.0, 2.0, float("nan")]).bfloat16())  # NaN where neither has one
    for b in bad:
        with pytest.raises(_bf16.Mismatch):
            _bf16.judge(b, cpu, ref, "t")
    # CPU far off (bf16 coordinates), ours near float64: ours passes, CPU's error would not
    far = torch.tensor([1.0, 2.0, 110.0]).bfloat16()
    _bf16.judge(cpu, far, ref, "t")
    with pytest.raises(_bf16.Mismatch):
        _bf16.judge(torch.tensor([1.0, 2.0, 120.0]).bfloat16(), far, ref, "t")
    with pytest.raises(_bf16.Mismatch):
        _bf16.judge(torch.tensor([0, 2]), torch.tensor([1, 2]), None, "i")


def test_stable_ties():
    """CPU's sort/topk under StableTies order ties as a stable sort: one of
    the answers torch allows, and the xla device's."""
    import torch_xla_core as txc
    x = torch.tensor([3.0, 1, 3, 2, 1, 3]).bfloat16()
    with _bf16.StableTies():
        s, t = torch.sort(x, descending=True), torch.topk(x, 4)
    assert s.indices.tolist() == [0, 2, 5, 3, 1, 4] and t.indices.tolist() == [0, 2, 5, 3]
    xs, xt = torch.sort(x.to(txc.device()), descending=True), torch.topk(x.to(txc.device()), 4)
    assert xs.indices.cpu().tolist() == s.indices.tolist() and xt.indices.cpu().tolist() == t.indices.tolist()
    assert torch.sort(x.to(txc.device()), stable=True).indices.cpu().tolist() == \
        torch.sort(x, stable=True).indices.tolist()


def test_samples_computed_together_then_one_by_one_where_that_fails():
    """As the float32 file's test of the same name: the samples compute in
    one sync; when it fails they run one by one, so only the sample the
    device rejects is an error."""
    from .test_opinfo import _SyncFails

    class Bf16SyncFails(_SyncFails):
        def sample_inputs(self, device, dtype, requires_grad=False):
            for s in super().sample_inputs(device, dtype):
                s.input = s.input.to(dtype)
                yield s

    results = _bf16.run_case(Bf16SyncFails(), "bf16")
    assert [(i, r[0]) for i, *r in results] == [(0, "pass"), (1, "error"), (2, "pass")], results
