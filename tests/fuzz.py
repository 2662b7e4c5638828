"""The op fuzzer (issue 38): random calls of the ops users call most on random
inputs, each compared with CPU eager PyTorch.

A case is (seed, index): its own random.Random, so any case replays alone
(`python tests/fuzz.py --seed S --case I`). It picks an op of one family
(elementwise, reductions, indexing, views, scatter/gather, sort/topk/unique,
matmul, conversions) and inputs: shapes with empty and 0-d ones, broadcasting
pairs, non-contiguous views (transposed, strided slices, expanded) and flipped
ones, every dtype the device has (floating, integer, bool, complex where the
op takes it), floats with NaN and +-inf. The xla side gets the same tensors
through the same views.

Verdicts: "ok" (equal results: structure, dtype, shape, values; floats within
a tolerance of their dtype, NaN where NaN), "same_error" (both raise the same
exception type), "tabled" (a difference listed in KNOWN with its reason), or
a finding: "differs", "error" (only one side raises, or other types),
"graph_error" (a GraphError: a compile failure, never acceptable), "crash"
(the process died: only the child-process runner, run(), sees it).

    python tests/fuzz.py --cases 20000 [--seed 0] [--jobs 1]
    nox -s fuzz -- --cases 20000

runs the cases in child processes (a crash is reported with its case and the
run goes on), prints the counts and each finding with its reproducer, and
exits non-zero on any finding. tests/test_fuzz.py runs a fixed-seed budget."""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TXC_COMPILE_CACHE", "off")

from fuzz_cases import FAMILIES, Case, lazy_torch, make_case  # noqa: E402,F401  (FAMILIES: test_fuzz reads it here)

# ---------------------------------------------------------------- the differences we keep, with their reasons
@dataclass
class Known:
    family: str
    label: str        # a prefix of the case's label
    reason: str
    when: object = None  # callable(case, cpu_result, xla_result) -> bool, None: always

    def matches(self, case, cpu, xla):
        if case.family != self.family or not case.label.startswith(self.label):
            return False
        return self.when is None or self.when(case, cpu, xla)


def _dtypes_of(case):
    return {i.dtype for i in case.inputs}


def _nonfinite_complex(case, cpu, xla):
    """Complex results that differ only where both sides are NaN or infinite."""
    torch = lazy_torch()
    if "complex64" not in _dtypes_of(case):
        return False
    for x, y in zip(_flatten(cpu), _flatten(xla)):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
            return False
        diff = ~torch.isclose(x, y, rtol=1e-3, atol=1e-3, equal_nan=True)
        if not bool((~torch.isfinite(x[diff])).all() and (~torch.isfinite(y[diff])).all()):
            return False
    return True


def _cpu_nan_where_xla_is_finite(case, cpu, xla):
    """Complex results that differ only where CPU's is NaN and the device's finite."""
    torch = lazy_torch()
    for x, y in zip(_flatten(cpu), _flatten(xla)):
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)) or x.shape != y.shape:
            return False
        diff = ~torch.isclose(x, y, rtol=1e-3, atol=1e-3, equal_nan=True)
        if not bool(torch.isnan(x[diff]).all() and torch.isfinite(y[diff]).all()):
            return False
    return True


def _out_of_range_both(case, cpu, xla):
    return (isinstance(cpu, (IndexError, RuntimeError)) and isinstance(xla, (IndexError, RuntimeError))
            and "index out of range" in str(xla))


KNOWN: list[Known] = [
    Known("scatter", "index_", "an index out of range: CPU raises IndexError or RuntimeError by which of its "
          "kernels runs (index_add_cpu_ picks one by the slices' layout); the device's check, read after the "
          "graph ran, raises one type naming the op and the valid range", _out_of_range_both),
    Known("index", "index_select", "an index out of range of a tensor with no elements: CPU's kernel for those "
          "raises RuntimeError ('INDICES element is out of DATA bounds'), for every other tensor IndexError; the "
          "device raises IndexError naming the op and the valid range (case 1:674)", _out_of_range_both),
    Known("order", "kthvalue", "kthvalue of bools: CPU has no Bool kernel (NotImplementedError); the device "
          "computes it exactly, on purpose, as sorting and median (tests/test_dtype_rules.py _EXACT_BOOL)",
          lambda c, cpu, xla: isinstance(cpu, NotImplementedError) and not isinstance(xla, Exception)),
    Known("matmul", "", "complex products with a NaN or an infinity: NaN or +-inf by how a kernel forms and sums "
          "complex products (CPU's own gemm gives NaN for a 1x1 mm and -inf-infj for 5x5 over the same "
          "values); XLA's dot forms them another way; finite values agree", _nonfinite_complex),
    Known("elementwise", "add", "complex sums with an infinity: CPU computes a + alpha * b with alpha a complex 1, "
          "and (inf + 0j) * (1 + 0j) has a NaN imaginary part (inf * 0); the device adds the parts (inf + 1.7j where "
          "CPU gives inf + nanj); finite values agree", _nonfinite_complex),
    Known("elementwise", "sub", "complex differences with an infinity: as add's", _nonfinite_complex),
    Known("scatter", "scatter_reduce", "complex means with an infinity: CPU divides the sum by the count as a "
          "complex division (NaN imaginary parts next to an infinite real part); the device divides the parts",
          _nonfinite_complex),
    Known("elementwise", "sigmoid", "complex sigmoid at an infinite argument (-inf + bj): CPU computes "
          "1 / (1 + exp(-z)), a complex division by an infinite value, NaN; XLA's logistic gives the limit, 0",
          _cpu_nan_where_xla_is_finite),
    Known("elementwise", "where", "bfloat16 with a 0-d complex tensor: torch 2.14+ promotes to bcomplex32, a dtype "
          "XLA does not have; the device computes complex64 (the same values, more precise)",
          lambda c, cpu, xla: getattr(cpu, "dtype", None) == getattr(lazy_torch(), "bcomplex32", "none")),
    Known("scatter", "scatter_reduce", "amax/amin of complex with an index out of range: CPU checks the range first "
          "(RuntimeError), the device checks a device index at the read, after the call refused the dtype "
          "(NotImplementedError)", lambda c, cpu, xla: isinstance(cpu, RuntimeError)
          and isinstance(xla, NotImplementedError) and "out of bounds" in str(cpu)),
    Known("views", "view(complex64)", "bitcasts to complex are refused (NotImplementedError: StableHLO's "
          "bitcast_convert takes no complex type; view_as_complex is the way)"),
    Known("views", "view(", "bitcasts from complex are refused (as above)",
          lambda c, cpu, xla: "complex64" in _dtypes_of(c)),
]


# ---------------------------------------------------------------- running and comparing
TOL = {"float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12),
       "complex64": (1e-4, 1e-5)}


def _flatten(x):
    torch = lazy_torch()
    if isinstance(x, (tuple, list)):
        out = []
        for e in x:
            out += _flatten(e)
        return out
    if isinstance(x, torch.Tensor):
        return [x]
    return [x]


def _to_cpu(x):
    torch = lazy_torch()
    if isinstance(x, (tuple, list)):
        return type(x)(_to_cpu(e) for e in x) if not hasattr(x, "_fields") else tuple(_to_cpu(e) for e in x)
    if isinstance(x, torch.Tensor):
        return x.cpu()
    return x


def compare(case, cpu, xla) -> str | None:
    """None when equal; else what differs."""
    torch = lazy_torch()
    a, b = _flatten(cpu), _flatten(xla)
    if len(a) != len(b):
        return f"{len(a)} results on CPU, {len(b)} on xla"
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return f"result {i}: {type(x).__name__} vs {type(y).__name__}"
        if not isinstance(x, torch.Tensor):
            if not (x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))):
                return f"result {i}: {x!r} vs {y!r}"
            continue
        if x.dtype != y.dtype:
            return f"result {i}: dtype {x.dtype} vs {y.dtype}"
        if x.shape != y.shape:
            return f"result {i}: shape {tuple(x.shape)} vs {tuple(y.shape)}"
        if x.dtype.is_floating_point or x.dtype.is_complex:
            rtol, atol = TOL.get(str(x.dtype).replace("torch.", ""), (1e-4, 1e-5))
            # complex: part by part (isclose of inf - 2.512j and inf - 2.5119998j is False: |x - y| is NaN)
            xd, yd = ((torch.view_as_real(x.to(torch.complex128)), torch.view_as_real(y.to(torch.complex128)))
                      if x.dtype.is_complex else (x.to(torch.float64), y.to(torch.float64)))
            finite = xd[torch.isfinite(xd)].abs()
            scale = float(finite.max()) if finite.numel() else 1.0
            # reductions and products sum in another order: the tolerance scales with the inputs' magnitude
            fam_scale = 1.0 if case.family in ("elementwise", "convert", "views", "index", "order") else 50.0
            ok = torch.isclose(xd, yd, rtol=rtol * fam_scale, atol=atol * fam_scale * max(1.0, scale),
                               equal_nan=True)
            if not bool(ok.all()):
                bad = (~ok).nonzero()[0].tolist()
                return f"result {i}: at {bad} {xd[tuple(bad)].item()} vs {yd[tuple(bad)].item()}"
        elif not torch.equal(x, y):
            bad = (x != y).nonzero()[0].tolist()
            return f"result {i}: at {bad} {x[tuple(bad)].item()} vs {y[tuple(bad)].item()}"
    return None


def run_case(case: Case) -> tuple[str, str]:
    """(verdict, detail) of one case in this process."""
    torch = lazy_torch()
    import torch_xla_core as txc  # lazy: the parent runner loads no torch
    from torch_xla_core._execution.executor import GraphError  # lazy: as above
    bases = [i.cpu() for i in case.inputs]
    cpu_args = [i.view(b) for i, b in zip(case.inputs, bases)]
    xla_args = [i.view(b.to(txc.device())) for i, b in zip(case.inputs, bases)]
    try:
        cpu, cpu_err = case.fn(*cpu_args), None
    except Exception as e:  # noqa: BLE001
        cpu, cpu_err = None, e
    try:
        xla, xla_err = _to_cpu(case.fn(*xla_args)), None
    except Exception as e:  # noqa: BLE001
        xla, xla_err = None, e
    txc._checks.clear()
    if isinstance(xla_err, GraphError):
        return "graph_error", f"{type(xla_err).__name__}: {str(xla_err)[:400]}"
    if cpu_err is not None or xla_err is not None:
        if cpu_err is not None and xla_err is not None and type(cpu_err) is type(xla_err):
            return "same_error", type(cpu_err).__name__
        detail = (f"CPU: {type(cpu_err).__name__ if cpu_err else 'ok'}: {str(cpu_err)[:200] if cpu_err else ''} | "
                  f"xla: {type(xla_err).__name__ if xla_err else 'ok'}: {str(xla_err)[:300] if xla_err else ''}")
        return _tabled(case, cpu_err or cpu, xla_err or xla, "error", detail)
    diff = compare(case, cpu, xla)
    if diff is None:
        return "ok", ""
    return _tabled(case, cpu, xla, "differs", diff)


def _tabled(case, cpu, xla, verdict, detail):
    for k in KNOWN:
        if k.matches(case, cpu, xla):
            return "tabled", k.reason
    return verdict, detail


FINDINGS = ("differs", "error", "graph_error", "crash")


def child_main(seed: int, start: int, stop: int, progress: str) -> None:
    """Runs cases [start, stop) and writes one JSON line per case to stdout;
    `progress` names a file holding the index of the case in flight."""
    import signal
    import warnings
    warnings.simplefilter("ignore")
    crash_at = os.environ.get("TXC_FUZZ_CRASH_AT")  # tests/test_fuzz.py: the runner's crash report
    for i in range(start, stop):
        with open(progress, "w") as f:
            f.write(str(i))
        if crash_at == str(i):
            os.kill(os.getpid(), signal.SIGSEGV)
        try:
            case = make_case(seed, i)
            verdict, detail = run_case(case)
            desc = repr(case)
        except Exception as e:  # noqa: BLE001  (the generator itself: a bug of the fuzzer, reported)
            verdict, detail, desc = "error", f"fuzzer: {type(e).__name__}: {e}", f"case {seed}:{i}"
        sys.stdout.write(json.dumps({"i": i, "verdict": verdict, "detail": detail, "case": desc}) + "\n")
        sys.stdout.flush()


def run(cases: int, seed: int = 0, start: int = 0, jobs: int = 1, batch: int = 500, log=print) -> dict:
    """Runs cases [start, start + cases) in child processes (a crash ends
    its child: the case is reported and the next child goes on). Returns
    {"counts": {verdict: n}, "findings": [...], "tabled": {reason: n}}."""
    import concurrent.futures as cf
    import tempfile
    counts: dict[str, int] = {}
    findings, tabled = [], {}
    todo = [(s, min(s + batch, start + cases)) for s in range(start, start + cases, batch)]

    def one(span):
        lo, hi = span
        recs = []
        while lo < hi:
            with tempfile.NamedTemporaryFile("w+", suffix=".fuzz", delete=False) as pf:
                progress = pf.name
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(seed), str(lo), str(hi),
                                progress], capture_output=True, text=True)
            done = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
            recs += done
            lo = done[-1]["i"] + 1 if done else lo
            if p.returncode != 0 and lo < hi:  # the case in flight killed the child
                with open(progress) as f:
                    bad = int(f.read() or lo)
                recs.append({"i": bad, "verdict": "crash", "case": f"case {seed}:{bad}",
                             "detail": f"exit {p.returncode}: {p.stderr[-600:]}"})
                lo = bad + 1
            os.unlink(progress)
        return recs

    t0 = time.time()
    with cf.ThreadPoolExecutor(max(1, jobs)) as ex:
        for recs in ex.map(one, todo):
            for rec in recs:
                counts[rec["verdict"]] = counts.get(rec["verdict"], 0) + 1
                if rec["verdict"] in FINDINGS:
                    findings.append(rec)
                elif rec["verdict"] == "tabled":
                    tabled[rec["detail"]] = tabled.get(rec["detail"], 0) + 1
            log(f"  {sum(counts.values())} cases, {time.time() - t0:.0f} s: {counts}")
    return {"counts": counts, "findings": findings, "tabled": tabled}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="the first case index")
    ap.add_argument("--jobs", type=int, default=1, help="child processes at a time")
    ap.add_argument("--batch", type=int, default=500, help="cases per child process")
    ap.add_argument("--case", type=int, help="run this one case here and print it (a reproducer)")
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child_main(int(a.child[0]), int(a.child[1]), int(a.child[2]), a.child[3])
        return 0
    if a.case is not None:
        case = make_case(a.seed, a.case)
        print(case)
        print(*run_case(case))
        return 0
    res = run(a.cases, a.seed, a.start, a.jobs, a.batch)
    print(f"fuzz: {a.cases} cases from {a.seed}:{a.start}: {res['counts']}")
    for reason, n in sorted(res["tabled"].items(), key=lambda kv: -kv[1]):
        print(f"  tabled x{n}: {reason}")
    for f in res["findings"]:
        print(f"FINDING {f['verdict']}: {f['case']}\n    {f['detail']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if res["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
