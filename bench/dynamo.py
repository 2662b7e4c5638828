#!/usr/bin/env python
"""Host time per training step: per-op tracing vs txc.compile vs
torch.compile(backend="torch_xla_core") (torch_xla_core/_features/dynamo.py).

A program, not a test: it prints a table and writes JSON. The models are
bench/_models.py's (the GPT-style decoder by default; the 64-layer residual
MLP with --models mlp decoder). One step is zero_grad + forward + backward +
AdamW step, the batch passed as arguments, then txc.sync(wait=True). Modes:

  traced          the plain step, every op traced every step
  txc.compile     txc.compile(step, wait=True): the whole step replayed
  torch.compile   the model compiled by dynamo with our backend (forward and
                  backward graphs replayed); zero_grad and AdamW traced per op
  torch.compile+opt  also opt.step compiled by dynamo (AdamW(capturable=True):
                  its step counts on the device; the in-place updates of
                  parameters and state are graph outputs written back)

Each mode runs --warmup steps, then --steps timed ones. Host ms per step =
wall time minus the device's "execute" timer (every graph waits for its
results: txc.compile(wait=True), dynamo.WAIT), medians over the timed steps.
Also the final loss of each mode (the same up to float32 rounding), the
graphs dynamo handed over, the replays per step, and the compiles after
warmup (0: nothing new was compiled while timing). The persistent compile
cache is off (bench/_harness.py).

  python bench/dynamo.py [--models decoder] [--steps 20] [--warmup 3] [--out FILE.json]
"""
import argparse
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PJRT_DEVICE", "CPU")

import _harness  # noqa: E402  (persistent compile cache off; write_report)
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import dynamo  # noqa: E402
from _models import make_case, train_step as _step  # noqa: E402

SCHEMA = "torch_xla_core/bench/dynamo/1"
MODES = ("traced", "txc.compile", "torch.compile", "torch.compile+opt")


def run_mode(name, mode, steps, warmup):
    torch._dynamo.reset()
    txc.executor.clear_cache()
    case = make_case(name).to(txc.device())
    # (the MLP loss is a plain sum: a small lr). A compiled opt.step needs its step counts on the device
    # (capturable=True, as torch asks of compiled optimizers on CUDA): CPU counts make its graph traced
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-6, capturable=mode == "torch.compile+opt")
    inputs = [x.detach() for x in case.inputs]
    model, loss_fn, opt_step = case.model, case.loss, None
    if mode == "txc.compile":
        compiled = txc.compile(_step, wait=True)

        def fn():
            return compiled(model, opt, inputs, loss_fn)
    else:
        if mode.startswith("torch.compile"):
            model = torch.compile(case.model, backend="torch_xla_core", dynamic=False)
        if mode == "torch.compile+opt":
            opt_step = torch.compile(opt.step, backend="torch_xla_core", dynamic=False)

        def fn():
            out = _step(model, opt, inputs, loss_fn, opt_step)
            txc.sync(wait=True)
            return out
    r = _harness.host_steps(fn, warmup, steps)
    c, c0 = txc.metrics.counters(), r["counters_at_start"]
    return {"host_ms": r["host_ms"], "wall_ms": r["wall_ms"], "device_ms": r["device_ms"],
            "loss": r["result"].item(), "dynamo_graphs": c.get("dynamo_graph", 0),
            "replays_per_step": (c.get("replay", 0) - c0.get("replay", 0)) / steps,
            "compiles_timed": c.get("compile", 0) - c0.get("compile", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["decoder"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "dynamo.json"))
    a = ap.parse_args()
    dynamo.WAIT = True
    warnings.simplefilter("once")
    rows = []
    for name in a.models:
        for mode in a.modes:
            txc.metrics.clear()
            r = {"model": name, "mode": mode, **run_mode(name, mode, a.steps, a.warmup)}
            rows.append(r)
    base = {r["model"]: r["host_ms"] for r in rows if r["mode"] == "traced"}
    print(f"{'model':<8} {'mode':<18} {'host ms':>9} {'vs traced':>10} {'device ms':>10} {'graphs':>7} "
          f"{'replays/step':>13} {'compiles':>9} {'loss':>12}")
    for r in rows:
        ratio = base.get(r["model"], float("nan")) / max(r["host_ms"], 1e-9)
        r["host_ratio_vs_traced"] = ratio
        print(f"{r['model']:<8} {r['mode']:<18} {r['host_ms']:>9.2f} {ratio:>9.1f}x {r['device_ms']:>10.2f} "
              f"{r['dynamo_graphs']:>7} {r['replays_per_step']:>13.1f} {r['compiles_timed']:>9} {r['loss']:>12.6f}")
    _harness.write_report(a.out, SCHEMA, steps=a.steps, warmup=a.warmup, rows=rows)


if __name__ == "__main__":
    main()
