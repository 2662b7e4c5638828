#!/usr/bin/env python
"""Device linear algebra (torch_xla_core/_ops/linalg_lapack.py): what one
call costs at trace time, and how the OpInfo samples fare in float64.

A program, not a test: it prints tables and writes JSON.

  trace    per op: the first call of a shape (jax lowers the function:
           a call_jax cache miss) and later calls (a cache hit), in ms of
           host time to trace the call, nothing computed (median of
           --repeats); then one compile + run of the graph (first sync).
  float64  the OpInfo samples of the linear-algebra ops in float64 (the
           conformance suite's CI runs float32 only), forward and backward,
           at most --samples per case, against CPU eager with
           (atol, rtol) = (1e-7, 1e-7): pass / fallback / mismatch / error.

  python bench/linalg.py [--quick] [--skip-float64] [--samples 16] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402
import torch_xla_core.kernels.call_jax  # noqa: E402,F401
_cj = sys.modules["torch_xla_core.kernels.call_jax"]

# the _ex variants: no deferred check keeps each repeat's factorization alive
# (XLA:CPU hangs running ~20 independent 8x64x64 potrf calls in one program;
# plain jax does the same: see the note in linalg_lapack.py)
OPS = {
    "cholesky_ex": (lambda a, b: torch.linalg.cholesky_ex(a @ a.mT + 8 * torch.eye(a.shape[-1], device=a.device))),
    "lu_factor_ex": (lambda a, b: torch.linalg.lu_factor_ex(a)),
    "solve_ex": (lambda a, b: torch.linalg.solve_ex(a, b)),
    "inv_ex": (lambda a, b: torch.linalg.inv_ex(a)),
    "det": (lambda a, b: torch.linalg.det(a)),
    "solve_triangular": (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True)),
    "qr": (lambda a, b: torch.linalg.qr(a)),
    "svd": (lambda a, b: torch.linalg.svd(a, full_matrices=False)),
    "eigh": (lambda a, b: torch.linalg.eigh(a)),
    "matrix_exp": (lambda a, b: torch.linalg.matrix_exp(a / 8)),
    "pinv": (lambda a, b: torch.linalg.pinv(a)),
}

LINALG_OPINFO = (
    "addbmm cholesky cholesky_inverse cholesky_solve geqrf linalg.cholesky linalg.cholesky_ex linalg.cond "
    "linalg.det linalg.eigh linalg.eigvalsh linalg.householder_product linalg.inv linalg.inv_ex linalg.lstsq "
    "linalg.lstsq.grad_oriented linalg.lu linalg.lu_factor linalg.lu_factor_ex linalg.lu_solve "
    "linalg.matrix_norm linalg.matrix_power linalg.matrix_rank linalg.matrix_rank.hermitian linalg.pinv "
    "linalg.pinv.hermitian linalg.pinv.singular linalg.qr linalg.slogdet linalg.solve linalg.solve_ex "
    "linalg.solve_triangular linalg.svd linalg.svdvals linalg.tensorinv linalg.tensorsolve logdet lu lu_solve "
    "lu_unpack matrix_exp norm.nuc ormqr pinverse qr svd triangular_solve").split()


def trace_costs(n, batch, repeats):
    dev = txc.device()
    rows = []
    for name, fn in OPS.items():
        _cj.clear_cache()
        a = torch.randn(batch, n, n).to(dev)
        b = torch.randn(batch, n, 2).to(dev)
        txc.sync(wait=True)
        t0 = time.perf_counter()
        fn(a, b)
        first = time.perf_counter() - t0
        hits = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = fn(a, b)
            hits.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        txc.sync(wait=True)
        run = time.perf_counter() - t0
        del out
        rows.append({"op": name, "first_call_ms": first * 1e3, "cached_call_ms": statistics.median(hits) * 1e3,
                     "first_sync_ms": run * 1e3})
    return rows


def float64_sweep(max_samples):
    from tests.conformance import _opinfo
    _opinfo.FLOOR_TOL[torch.float64] = (1e-7, 1e-7)
    by_id = {_opinfo.op_id(op): op for op in _opinfo.op_db}
    rows = []
    for oid in LINALG_OPINFO:
        op = by_id[oid]
        for direction in ("fwd", "bwd"):
            ok = op.supported_dtypes("cpu") if direction == "fwd" else op.supported_backward_dtypes("cpu")
            if torch.float64 not in ok:
                continue
            res = _opinfo.run_case(op, torch.float64, direction, mode="full", max_samples=max_samples)
            counts = {}
            for _, outcome, _ in res:
                counts[outcome] = counts.get(outcome, 0) + 1
            first = next(((i, o, m[:160]) for i, o, m in res if o != "pass"), None)
            rows.append({"op": oid, "direction": direction, "counts": counts, "first_failure": first})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-float64", action="store_true")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "linalg.json"))
    args = ap.parse_args()
    n, batch, repeats = (16, 4, 5) if args.quick else (64, 8, 20)
    out = {"platform": txc.runtime.platform(), "n": n, "batch": batch, "repeats": repeats}
    out["trace"] = trace_costs(n, batch, repeats)
    print(f"trace cost per call ({batch}x{n}x{n} float32, {out['platform']}):")
    print(f"  {'op':18s} {'first call ms':>14s} {'cached call ms':>15s} {'first sync ms':>14s}")
    for r in out["trace"]:
        print(f"  {r['op']:18s} {r['first_call_ms']:14.2f} {r['cached_call_ms']:15.3f} {r['first_sync_ms']:14.1f}")
    if not args.skip_float64:
        out["float64"] = rows = float64_sweep(args.samples)
        print(f"\nOpInfo float64 (at most {args.samples} samples per case, atol=rtol=1e-7):")
        full = sum(all(set(r["counts"]) <= {"pass"} for r in rows if r["op"] == oid) for oid in LINALG_OPINFO)
        for r in rows:
            if set(r["counts"]) - {"pass"}:
                print(f"  {r['op']:28s} {r['direction']} {r['counts']} first failure: {r['first_failure']}")
        print(f"  {full} of {len(LINALG_OPINFO)} ops pass every float64 sample (forward and backward)")
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
