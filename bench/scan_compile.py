#!/usr/bin/env python
"""Compile and trace cost of a decoder stack: a Python for loop over the
layers vs torch_xla_core.scan.scan_layers (one loop in the graph).

A program, not a test: it prints a table and writes JSON. For each number of
layers N (16, 64, 128, 256; --quick: 4, 16) and each phase (fwd: forward
under torch.no_grad(); fwd+bwd: forward, loss, backward), for each method
(loop, scan) on fresh layers (tests/models.py Block, width --d) with empty
compile and trace caches:

  trace       seconds to trace the first step (Python + core, no sync)
  compile     seconds in XLA compile (+ lowering) for the first step
  first       wall seconds of the first step: trace + lower + compile + run
  step        median wall seconds of later steps (trace + cache hit + run)
  step_trace  median seconds to trace a later step (scan reuses its body)
  overhead    first - step: what the first step costs beyond a cached one

(after a warm-up run of each method at N=2, so first-use costs such as
imports are not counted)

and the ratios loop/scan. Usage:

  python bench/scan_compile.py [--quick] [--layers 16 64] [--methods loop scan scan:save]
                               [--out FILE.json]
"""
import argparse
import datetime
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TXC_COMPILE_CACHE", "off")  # compile times are measured: no persistent cache
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import executor, runtime  # noqa: E402
from torch_xla_core.scan import clear_cache, scan_layers  # noqa: E402
from models import Block  # noqa: E402

SCHEMA = "torch_xla_core/bench/scan_compile/1"


def _timer(name):
    return txc.metrics.timers().get(name, (0, 0.0))[1]


def run_case(n, phase, method, args):
    dev = txc.device()
    torch.manual_seed(0)
    layers = nn.ModuleList([Block(args.d, args.heads) for _ in range(n)]).to(dev)
    x = torch.randn(args.batch, args.seq, args.d).to(dev)
    txc.sync(wait=True)
    executor.clear_cache()
    clear_cache()
    gc.collect()

    def forward():
        if method.startswith("scan"):
            return scan_layers(layers, x, policy=method.partition(":")[2] or "recompute")
        h = x
        for layer in layers:
            h = layer(h)
        return h

    def step():
        t0 = time.perf_counter()
        if phase == "fwd":
            with torch.no_grad():
                out = forward()
        else:
            for p in layers.parameters():
                p.grad = None
            out = forward()
            out.pow(2).mean().backward()
        t1 = time.perf_counter()
        txc.sync(wait=True)
        t2 = time.perf_counter()
        return t1 - t0, t2 - t0

    c0, l0, compiles0 = _timer("compile"), _timer("lower"), txc.metrics.counters().get("compile", 0)
    trace, first = step()
    compile_s = _timer("compile") - c0 + _timer("lower") - l0
    compiles = txc.metrics.counters().get("compile", 0) - compiles0
    traces, walls = [], []
    for _ in range(args.repeats):
        t, w = step()
        traces.append(t)
        walls.append(w)
    later_compiles = txc.metrics.counters().get("compile", 0) - compiles0 - compiles
    step_s = statistics.median(walls)
    return {"trace": trace, "compile": compile_s, "first": first, "compiles_first": compiles,
            "step": step_s, "overhead": first - step_s, "step_trace": statistics.median(traces),
            "compiles_later": later_compiles}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 4, 16 and 2 repeats")
    ap.add_argument("--layers", type=int, nargs="*", default=None)
    ap.add_argument("--phases", nargs="*", default=["fwd", "fwd+bwd"])
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--methods", nargs="*", default=["loop", "scan"],
                    choices=["loop", "scan", "scan:save", "scan:offload"],
                    help="the first is the reference of the ratios")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "scan_compile.json"))
    args = ap.parse_args()
    if args.layers is None:
        args.layers = [4, 16] if args.quick else [16, 64, 128, 256]
    if args.quick:
        args.repeats = 2
    for phase in args.phases:  # warm-up: first-use costs (imports, torch.func) out of the measurements
        for method in args.methods:
            run_case(2, phase, method, argparse.Namespace(**{**vars(args), "repeats": 1}))
    rows = []
    hdr = (f"{'N':>4} {'phase':8} {'method':12} {'trace s':>8} {'compile s':>9} {'first s':>8} {'step s':>8} "
           f"{'overhead s':>10} {'steptrace s':>11} {'compiles':>8}")
    print(f"decoder stack: Block(d={args.d}, heads={args.heads}), x [{args.batch}, {args.seq}, {args.d}], "
          f"platform {runtime.platform()}")
    print(hdr)
    for n in args.layers:
        for phase in args.phases:
            res = {}
            for method in args.methods:
                r = run_case(n, phase, method, args)
                res[method] = r
                print(f"{n:>4} {phase:8} {method:12} {r['trace']:8.3f} {r['compile']:9.3f} {r['first']:8.3f} "
                      f"{r['step']:8.4f} {r['overhead']:10.3f} {r['step_trace']:11.4f} "
                      f"{r['compiles_first']:>4}+{r['compiles_later']}", flush=True)
            ref = args.methods[0]
            ratios = {}
            for method in args.methods[1:]:
                ratio = {k: (res[ref][k] / res[method][k] if res[method][k] > 0 else None)
                         for k in ("trace", "compile", "first", "step", "overhead", "step_trace")}
                ratios[method] = ratio
                print(f"{'':4} {'':8} {ref + '/' + method:12} "
                      + "  ".join(f"{k} {v:.2f}x" for k, v in ratio.items() if v), flush=True)
            rows.append({"layers": n, "phase": phase, **res, "ratios_to_" + ref: ratios,
                         # the schema's first field, kept for readers of older files
                         "loop_over_scan": ratios.get("scan")})
    doc = {"schema": SCHEMA, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
           "platform": runtime.platform(), "config": vars(args), "results": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
