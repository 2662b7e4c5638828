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
  paged attention (multi-query, chunked prefill), kv length S in --paged-seq
  (default 512 2048), B=4, 16 new queries per sequence (kv lengths S, 3S/4,
  S/2, S/4+5), Hq=8, Hkv=2, D=64, page 16, 8 pages per kv block, forward:
    pallas     our Pallas kernel (TPU: Mosaic; elsewhere Pallas' interpreter,
               plain HLO: correctness only, slow)
    xla        the gather + masked-softmax implementation (default off TPU)
    reference  kernels.reference.multi_queries_paged_attention as torch ops
  grouped matmul, E=8 experts, top-2 routing of T tokens (rows = 2T), K=N=256,
  forward + backward:
    ragged_dot kernels.grouped_matmul(impl="ragged_dot") (jax.lax.ragged_dot;
               dense E x on CPU; the default off TPU)
    megablox   kernels.grouped_matmul(impl="megablox") (jax's megablox
               gmm/tgmm; TPU: Mosaic; elsewhere interpreted: correctness only)
    aten       F.grouped_mm (our lowering, E x the work)
    dense_bmm  every row against every expert with one bmm (the E x upper bound)
  moe decoder: a tiny Mixtral from transformers (8 experts, top-2, 2 layers,
  hidden 32, GQA attention) trains 5 AdamW steps on xla and on CPU eager:
  max loss difference, compiles per step (step 1 creates AdamW's state, so
  step 2 compiles the steady-state graph once; steps 3..5 must compile
  nothing), step time.

Columns: first (s, trace + compile + run), step (median s of --repeats
runs, cache hits), dev_mb / temp_mb (txc.memory.last_graph(): the step
graph's argument + output + temp - alias bytes, and its temp bytes), max_err
(against the row group's XLA op). On CPU the kernels run their reference or
interpreted path: only correctness is meaningful there (the table says so).

  python bench/kernels.py [--quick] [--seq ...] [--paged-seq ...] [--tokens ...] [--repeats N]
                          [--sections attention paged gmm moe] [--out FILE.json]
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
os.environ.setdefault("TXC_COMPILE_CACHE", "off")  # first_s includes the compile; compile counts count compiles
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import executor, kernels, runtime  # noqa: E402,F401
from torch_xla_core.kernels import reference  # noqa: E402
from models import tiny_mixtral  # noqa: E402  (tests/models.py)


def _run(step, repeats):
    """(first seconds, median step seconds, txc.memory.last_graph() of the step)."""
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
    return first, statistics.median(times), txc.memory.last_graph()


def _row(bench, shape, method, first, med, mem, **extra):
    return dict(bench=bench, shape=shape, method=method, first_s=first, step_s=med,
                dev_mb=mem.get("device_total_bytes", 0) / 2 ** 20, temp_mb=mem.get("temp_size_in_bytes", 0) / 2 ** 20,
                **extra)


def bench_attention(seqs, repeats, dev, dtype=torch.float32):
    rows = []
    b, h, hkv, d = 1, 8, 2, 64
    for s in seqs:
        q = torch.randn(b, h, s, d, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(b, hkv, s, d, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(b, hkv, s, d, device=dev, dtype=dtype, requires_grad=True)
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
            rows.append(_row("attention", f"S={s}", name, first, med, mem))
        for r in rows[-3:]:
            r["max_err"] = (outs[r["method"]].float() - outs["xla_sdpa"].float()).abs().max().item()
    return rows


def bench_paged(seqs, repeats, dev):
    rows = []
    b, nq, hq, hkv, d, page, ppcb = 4, 16, 8, 2, 64, 16, 8
    for s in seqs:
        pps = -(-s // (page * ppcb)) * ppcb
        total = b * pps + 1
        q = torch.randn(b, nq, hq, d, device=dev) * d ** -0.5
        kp, vp = torch.randn(hkv, total, page, d, device=dev), torch.randn(hkv, total, page, d, device=dev)
        pi = torch.randperm(total)[: b * pps].reshape(b, pps).to(torch.int32).to(dev)
        lens = torch.tensor([s, 3 * s // 4, s // 2, s // 4 + 5], dtype=torch.int32, device=dev)
        eff = torch.full((b,), nq, dtype=torch.int32, device=dev)
        args = (q, kp, vp, lens, pi, eff)
        methods = {
            "pallas": lambda: kernels.multi_queries_paged_attention(*args, ppcb, nq, impl="pallas"),
            "xla": lambda: kernels.multi_queries_paged_attention(*args, ppcb, nq, impl="xla"),
            "reference": lambda: reference.multi_queries_paged_attention(*args),
        }
        txc.sync(wait=True)
        outs = {}
        for name, fn in methods.items():
            def step(fn=fn, name=name):
                outs[name] = fn()
            first, med, mem = _run(step, repeats)
            rows.append(_row("paged_attention", f"kv={s} B={b} Q={nq}", name, first, med, mem))
        for r in rows[-3:]:
            r["max_err"] = (outs[r["method"]] - outs["xla"]).abs().max().item()
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
            "ragged_dot": lambda: kernels.grouped_matmul(x, w, gs, impl="ragged_dot"),
            "megablox": lambda: kernels.grouped_matmul(x, w, gs, impl="megablox"),
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
            rows.append(_row("grouped_matmul", f"E={e} top2 T={t}", name, first, med, mem))
        for r in rows[-4:]:
            r["max_err"] = (outs[r["method"]] - outs["aten"]).abs().max().item()
    return rows


def bench_moe_decoder(dev, steps=5):
    """The issue's Mixtral-style decoder: 5 AdamW steps, xla vs CPU eager."""
    import copy
    try:
        import transformers
    except ImportError:
        return []
    torch.manual_seed(0)
    model = tiny_mixtral(transformers)
    ids = torch.randint(0, 64, (2, 12))

    def train(m, d):
        m = m.to(d)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        losses, compiles, times, mem = [], [], [], {}
        for _ in range(steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = m(input_ids=ids.to(d), labels=ids.to(d)).loss
            loss.backward()
            opt.step()
            if d != "cpu":
                txc.sync(wait=True)
                compiles.append(txc.metrics.counters().get("compile", 0))
                mem = txc.memory.last_graph()
            losses.append(loss.detach().to("cpu"))
            times.append(time.perf_counter() - t0)
        return torch.stack(losses), compiles, times, mem

    losses_c, _, _, _ = train(copy.deepcopy(model), "cpu")
    executor.clear_cache()
    txc.metrics.clear()
    losses_x, compiles, times, mem = train(copy.deepcopy(model), dev)
    row = _row("moe_decoder", "mixtral E=8 top2 5 steps", "adamw", times[0], statistics.median(times[1:]), mem,
               max_err=(losses_x - losses_c).abs().max().item(), compiles_per_step=compiles,
               compiles_after_step2=compiles[-1] - compiles[1],
               fallbacks=sum(txc.metrics.fallbacks().values()))
    return [row]


_SECTIONS = ("attention", "paged", "gmm", "moe")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="S=256 512, paged kv 256, T=64 256, 3 repeats")
    p.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--paged-seq", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--tokens", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="attention inputs (bfloat16: the GPU runs the Triton kernel there)")
    p.add_argument("--sections", nargs="+", default=list(_SECTIONS), choices=list(_SECTIONS))
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "kernels.json"))
    a = p.parse_args()
    if a.quick:
        a.seq, a.paged_seq, a.tokens, a.repeats = [256, 512], [256], [64, 256], 3
    dev = txc.device()
    plat = runtime.platform()
    mode = ("TPU: compiled Mosaic kernels" if plat == "tpu" else
            "CUDA: flash = the Triton kernel in bf16 (--dtype bfloat16), else its jax reference; pallas/megablox = "
            "Pallas' interpreter (plain HLO): those rows say correctness only" if plat == "cuda" else
            f"{plat.upper()}: flash = its jax reference; pallas/megablox = Pallas' interpreter (plain HLO); "
            f"these numbers say correctness only, not kernel speed")
    run = dict(attention=lambda: bench_attention(a.seq, a.repeats, dev, getattr(torch, a.dtype)),
               paged=lambda: bench_paged(a.paged_seq, a.repeats, dev),
               gmm=lambda: bench_gmm(a.tokens, a.repeats, dev), moe=lambda: bench_moe_decoder(dev))
    rows = [r for name in _SECTIONS if name in a.sections for r in run[name]()]
    print(f"# bench/kernels.py on {plat} ({platform.machine()}, {os.cpu_count()} cpus): {mode}")
    print("# max_err vs: attention xla_sdpa, paged_attention xla, grouped_matmul aten, moe_decoder CPU eager losses")
    print(f"{'bench':16} {'shape':25} {'method':10} {'first_s':>8} {'step_s':>8} {'dev_mb':>8} {'temp_mb':>8} "
          f"{'max_err':>9}")
    for r in rows:
        extra = (f"  compiles in steps 3-5: {r['compiles_after_step2']} (cumulative per step "
                 f"{r['compiles_per_step']})" if "compiles_after_step2" in r else "")
        print(f"{r['bench']:16} {r['shape']:25} {r['method']:10} {r['first_s']:8.3f} {r['step_s']:8.4f} "
              f"{r['dev_mb']:8.1f} {r['temp_mb']:8.1f} {r['max_err']:9.2e}{extra}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(date=datetime.datetime.now().isoformat(timespec="seconds"), platform=plat,
                                   mode=mode, torch=torch.__version__, rows=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
