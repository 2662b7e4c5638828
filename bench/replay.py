#!/usr/bin/env python
"""Host time per training step: per-op tracing every step vs txc.compile
(trace once, replay; torch_xla_core/replay.py).

A program, not a test: it prints a table and writes JSON. For each model
(bench/_models.py: the 64-layer residual MLP and the GPT-style decoder) one
step is forward + backward + AdamW step + zero_grad, with the batch passed
as arguments. Each mode runs --warmup steps, then --steps timed ones:

  traced    the plain step function, then txc.sync(wait=True)
  replayed  txc.compile(step, wait=True)

Host ms per step = wall time of the step (and its sync) minus the device's
"execute" timer (launch until the outputs are ready), which both modes
record the same way. Medians over the timed steps; the ratio is traced /
replayed host time. Also the final losses of both modes (the same up to
float32 rounding: the replayed AdamW keeps its step count on the device).
The persistent compile cache is off (bench/_harness.py).

  python bench/replay.py [--models mlp decoder] [--steps 20] [--warmup 3] [--out FILE.json]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PJRT_DEVICE", "CPU")

import _harness  # noqa: E402,F401  (persistent compile cache off)
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from _models import make_case  # noqa: E402

SCHEMA = "torch_xla_core/bench/replay/1"


def _step(model, opt, inputs, loss_fn):
    opt.zero_grad()
    loss = loss_fn(model, inputs)
    loss.backward()
    opt.step()
    return loss.detach()


def run_mode(name, mode, steps, warmup):
    case = make_case(name).to(txc.device())
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-6)  # the MLP loss is a plain sum
    loss_fn = case.loss
    inputs = [x.detach() for x in case.inputs]  # the batch (no input grads: a training step)
    if mode == "replayed":
        fn = txc.compile(_step, wait=True)
    else:
        def fn(m, o, inp, lf):
            out = _step(m, o, inp, lf)
            txc.sync(wait=True)
            return out
    host, wall = [], []
    loss = None
    for i in range(warmup + steps):
        e0 = txc.metrics.timers().get("execute", (0, 0.0))[1]
        t0 = time.perf_counter()
        loss = fn(case.model, opt, inputs, loss_fn)
        t1 = time.perf_counter()
        e1 = txc.metrics.timers().get("execute", (0, 0.0))[1]
        if i >= warmup:
            wall.append(t1 - t0)
            host.append((t1 - t0) - (e1 - e0))
    c = txc.metrics.counters()
    return {"host_ms": statistics.median(host) * 1e3, "wall_ms": statistics.median(wall) * 1e3,
            "device_ms": (statistics.median(wall) - statistics.median(host)) * 1e3,
            "loss": loss.item(), "replays": c.get("replay", 0), "compiles": c.get("compile", 0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "decoder"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "replay.json"))
    a = ap.parse_args()
    rows = []
    for name in a.models:
        r = {"model": name}
        for mode in ("traced", "replayed"):
            txc.metrics.clear()
            r[mode] = run_mode(name, mode, a.steps, a.warmup)
        r["host_ratio"] = r["traced"]["host_ms"] / max(r["replayed"]["host_ms"], 1e-9)
        rows.append(r)
    print(f"{'model':<8} {'traced host ms':>15} {'replayed host ms':>17} {'ratio':>7} "
          f"{'device ms':>10} {'replays':>8} {'loss traced':>12} {'loss replayed':>14}")
    for r in rows:
        t, p = r["traced"], r["replayed"]
        print(f"{r['model']:<8} {t['host_ms']:>15.2f} {p['host_ms']:>17.3f} {r['host_ratio']:>6.1f}x "
              f"{p['device_ms']:>10.2f} {p['replays']:>8} {t['loss']:>12.6f} {p['loss']:>14.6f}")
    doc = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "python": platform.python_version(), "torch": torch.__version__,
           "platform": txc.runtime.platform(), "steps": a.steps, "warmup": a.warmup, "rows": rows}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
