#!/usr/bin/env python
"""Kernels vs references vs XLA's own ops on xla tensors: time and compiled
memory. A program, not a test: it prints a table and writes JSON.

  attention, S in --seq (default 512 1024 2048; the issue's full range is
  512..8192: --seq 512 1024 2048 4096 8192), B=1, H=8, Hkv=2 (GQA), D=64,
  causal, forward + backward:
    kernel     torch_xla_core.kernels.flash_attention (TPU: jax's Pallas
               flash kernel; CPU/GPU: the jax reference, through call_jax)
    reference  torch_xla_core.kernels.reference.flash_attention traced as
               ordinary torch ops on xla tensors
    xla_sdpa   F.scaled_dot_product_attention on xla (our sdpa core op)
  grouped matmul, E=8 experts, top-2 routing of T tokens (rows = 2T), K=N=256:
    kernel     kernels.grouped_matmul (jax.lax.ragged_dot; dense E x on CPU)
    aten       F.grouped_mm (our masked dense lowering, E x the work)
    dense_bmm  every row against every expert with one bmm (the E x upper bound)

Columns: first (s, trace + compile + run), step (median s of --repeats
runs, cache hits), temp_mb / peak_mb (XLA's compiled memory statistics of
the step's graph). On CPU every number is of the reference/interpret path:
only correctness is meaningful there (the table says so).

  python bench/kernels.py [--quick] [--seq ...] [--tokens ...] [--repeats N] [--out FILE.json]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
ROOT = Path(__file__).resolve().parent.parent

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import executor, kernels, runtime  # noqa: E402
from torch_xla_core.kernels import reference  # noqa: E402


def _run(step, repeats):
    """(first seconds, median step seconds, memory stats of the step's graph)."""
    t0 = time.perf_counter()
    step()
    txc.sync(wait=True)
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        txc.sync(wait=True)
        times.append(time.perf_counter() - t0)
    return first, statistics.median(times), executor.last_memory_stats()


def bench_attention(seqs, repeats, dev):
    rows = []
    b, h, hkv, d = 1, 8, 2, 64
    for s in seqs:
        q = torch.randn(b, h, s, d, device=dev, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device=dev, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device=dev, requires_grad=True)
        methods = {
            "kernel": lambda: kernels.flash_attention(q, k, v, causal=True, sm_scale=d ** -0.5),
            "reference": lambda: reference.flash_attention(q, k, v, causal=True, sm_scale=d ** -0.5),
            "xla_sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        }
        txc.sync(wait=True)  # inputs are device data before the first step
        outs = {}
        for name, fn in methods.items():
            def step(fn=fn):
                q.grad = k.grad = v.grad = None
                o = fn()
                o.sum().backward()
                outs[name] = o
            first, med, mem = _run(step, repeats)
            rows.append(dict(bench="attention", shape=f"S={s}", method=name, first_s=first, step_s=med,
                             temp_mb=mem.get("temp_size_in_bytes", 0) / 2 ** 20,
                             peak_mb=mem.get("peak_memory_in_bytes", 0) / 2 ** 20))
        err = (outs["kernel"] - outs["xla_sdpa"]).abs().max().item()
        for r in rows[-3:]:
            r["max_err_vs_xla_sdpa"] = err
    return rows


def bench_gmm(tokens, repeats, dev):
    rows = []
    e, kdim, n = 8, 256, 256
    w = torch.randn(e, kdim, n, device=dev, requires_grad=True)
    for t in tokens:
        m = 2 * t  # top-2
        ids = torch.randint(0, e, (m,))
        sizes = torch.bincount(ids, minlength=e).to(torch.int32)
        x = torch.randn(m, kdim, device=dev, requires_grad=True)
        gs, offs = sizes.to(dev), torch.cumsum(sizes, 0).to(torch.int32).to(dev)
        onehot = F.one_hot(ids.sort().values, e).T.float().to(dev)  # [E, M]
        methods = {
            "kernel": lambda: kernels.grouped_matmul(x, w, gs),
            "aten": lambda: F.grouped_mm(x, w, offs=offs),
            "dense_bmm": lambda: (torch.matmul(x[None], w) * onehot[:, :, None]).sum(0),
        }
        txc.sync(wait=True)
        outs = {}
        for name, fn in methods.items():
            def step(fn=fn):
                x.grad = w.grad = None
                o = fn()
                o.sum().backward()
                outs[name] = o
            first, med, mem = _run(step, repeats)
            rows.append(dict(bench="grouped_matmul", shape=f"E={e} top2 T={t}", method=name, first_s=first,
                             step_s=med, temp_mb=mem.get("temp_size_in_bytes", 0) / 2 ** 20,
                             peak_mb=mem.get("peak_memory_in_bytes", 0) / 2 ** 20))
        err = (outs["kernel"] - outs["aten"]).abs().max().item()
        for r in rows[-3:]:
            r["max_err_vs_aten"] = err
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="S=256 512, T=64 256, 2 repeats")
    p.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "kernels.json"))
    a = p.parse_args()
    if a.quick:
        a.seq, a.tokens, a.repeats = [256, 512], [64, 256], 3
    dev = txc.device()
    plat = runtime.platform()
    mode = ("TPU: compiled Mosaic kernels" if plat == "tpu" else
            f"{plat.upper()}: kernels run their jax reference / ragged_dot path (Pallas TPU kernels need a TPU); "
            f"CPU numbers are for correctness only, not kernel speed")
    rows = bench_attention(a.seq, a.repeats, dev) + bench_gmm(a.tokens, a.repeats, dev)
    print(f"# bench/kernels.py on {plat} ({platform.machine()}, {os.cpu_count()} cpus): {mode}")
    print(f"{'bench':15} {'shape':18} {'method':10} {'first_s':>8} {'step_s':>8} {'temp_mb':>9} {'peak_mb':>9} "
          f"{'max_err':>9}")
    for r in rows:
        err = r.get("max_err_vs_xla_sdpa", r.get("max_err_vs_aten", 0.0))
        print(f"{r['bench']:15} {r['shape']:18} {r['method']:10} {r['first_s']:8.3f} {r['step_s']:8.4f} "
              f"{r['temp_mb']:9.1f} {r['peak_mb']:9.1f} {err:9.2e}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(date=datetime.datetime.now().isoformat(timespec="seconds"), platform=plat,
                                   mode=mode, torch=torch.__version__, rows=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
