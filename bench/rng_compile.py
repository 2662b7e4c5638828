#!/usr/bin/env python
"""Compile cost of random-number graphs: N chained `randn` + matmul steps,
with and without RNG, measured side by side in one run.

A program, not a test: it prints a table and writes JSON. For each N
(100, 200, 500; --quick: 20, 50) it traces one graph per variant and
times lowering + XLA compile of that graph (the runtime's "lower" and
"compile" timers, with an empty compile cache):

  rng      h = h @ torch.randn(d, d)                         (the draws)
  no_rng   h = h @ (torch.erfinv(u_i) * sqrt(2))             (u_i: N uniform
           matrices uploaded as inputs: the same inverse-CDF normal transform
           randn applies, without generating bits: what RNG itself costs)
  weights  h = h @ w_i                                       (w_i: N inputs; a
           bare matmul chain, for reference)

and the ratios rng/no_rng, rng(N)/rng(N_prev), rng(500)/rng(200). Variants
are interleaved, repeats (--repeats, default 2) alternate their order, and
the table shows the minimum per cell (this machine is shared; the minimum
is the least disturbed sample). Usage:

  python bench/rng_compile.py [--quick] [--sizes 100 200 500] [--repeats 2] [--out FILE.json]
"""
import argparse
import datetime
import gc
import json
import math
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("TXC_COMPILE_CACHE", "off")  # compile times are measured: no persistent cache
ROOT = Path(__file__).resolve().parent.parent

import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import runtime  # noqa: E402

SCHEMA = "torch_xla_core/bench/rng_compile/1"
VARIANTS = ("rng", "no_rng", "weights")


def _timer(name):
    return txc.metrics.timers().get(name, (0, 0.0))[1]


def measure(variant, n, d, dev):
    """Seconds to lower and to compile the graph of n steps of `variant`."""
    torch.manual_seed(0)
    x = torch.randn(4, d).to(dev)
    inputs = None
    if variant == "no_rng":
        inputs = [torch.rand(d, d).clamp(1e-3, 1 - 1e-3).mul(2).sub(1).to(dev) for _ in range(n)]
    elif variant == "weights":
        inputs = [(torch.randn(d, d) / math.sqrt(d)).to(dev) for _ in range(n)]
    txc.sync(wait=True)
    txc.executor.clear_cache()
    gc.collect()
    h = x
    for i in range(n):
        if variant == "rng":
            w = torch.randn(d, d, device=dev)
        elif variant == "no_rng":
            w = torch.erfinv(inputs[i]) * math.sqrt(2)
        else:
            w = inputs[i]
        h = h @ w / math.sqrt(d)
    l0, c0, k0 = _timer("lower"), _timer("compile"), txc.metrics.counters().get("compile", 0)
    txc.sync(wait=True)
    assert txc.metrics.counters().get("compile", 0) == k0 + 1, "expected one compile"
    return _timer("lower") - l0, _timer("compile") - c0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--d", type=int, default=16, help="matrix width")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "rng_compile.json"))
    args = ap.parse_args(argv)
    sizes = args.sizes or ([20, 50] if args.quick else [100, 200, 500])
    dev = txc.device()
    measure("rng", 4, args.d, dev)  # warm-up: imports, first-use costs
    measure("no_rng", 4, args.d, dev)

    samples = {(v, n): [] for v in VARIANTS for n in sizes}
    for r in range(args.repeats):
        for n in sizes:
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for v in order:
                lower, comp = measure(v, n, args.d, dev)
                samples[(v, n)].append({"lower_s": lower, "compile_s": comp})
                print(f"  [{r + 1}/{args.repeats}] N={n:<4} {v:<8} lower {lower:7.3f}s  compile {comp:7.3f}s",
                      file=sys.stderr)

    def best(v, n):
        return min(s["lower_s"] + s["compile_s"] for s in samples[(v, n)])

    rows = []
    for i, n in enumerate(sizes):
        row = {"n": n, **{f"{v}_s": best(v, n) for v in VARIANTS}}
        row["rng_over_no_rng"] = row["rng_s"] / row["no_rng_s"]
        row["rng_over_weights"] = row["rng_s"] / row["weights_s"]
        if i:
            row["rng_growth"] = row["rng_s"] / best("rng", sizes[i - 1])
            row["no_rng_growth"] = row["no_rng_s"] / best("no_rng", sizes[i - 1])
        rows.append(row)

    hdr = f"{'N':>5} {'rng s':>9} {'no_rng s':>9} {'weights s':>9} {'rng/no_rng':>11} {'rng growth':>11} " \
          f"{'no_rng growth':>14}"
    print(f"compile seconds (lower + XLA compile), d={args.d}, min of {args.repeats}")
    print(hdr)
    for r in rows:
        g = f"{r['rng_growth']:.2f}x" if "rng_growth" in r else "-"
        g2 = f"{r['no_rng_growth']:.2f}x" if "no_rng_growth" in r else "-"
        print(f"{r['n']:>5} {r['rng_s']:>9.3f} {r['no_rng_s']:>9.3f} {r['weights_s']:>9.3f} "
              f"{r['rng_over_no_rng']:>10.2f}x {g:>11} {g2:>14}")
    summary = {}
    if 200 in sizes and 500 in sizes:
        summary["rng_500_over_200"] = best("rng", 500) / best("rng", 200)
        summary["rng_500_over_no_rng_500"] = best("rng", 500) / best("no_rng", 500)
        print(f"rng(500)/rng(200) = {summary['rng_500_over_200']:.2f}x (linear: 2.5x); "
              f"rng(500)/no_rng(500) = {summary['rng_500_over_no_rng_500']:.2f}x")

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": SCHEMA,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "device": str(dev), "cpus": os.cpu_count(),
                    "loadavg": os.getloadavg()},
        "config": {"sizes": sizes, "repeats": args.repeats, "d": args.d},
        "rows": rows,
        "summary": summary,
        "samples": [{"variant": v, "n": n, "samples": s} for (v, n), s in samples.items()],
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
