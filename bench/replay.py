#!/usr/bin/env python
"""Host time per training step: per-op tracing every step vs txc.compile
(trace once, replay; torch_xla_core/replay/).

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
The persistent compile cache is off for these (bench/_harness.py). Then,
per model, the first step of a new process with the persistent cache in a
fresh temporary directory: cold (compiles, writes) and warm (loads).

  python bench/replay.py [--models mlp decoder] [--steps 20] [--warmup 3] [--out FILE.json]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PJRT_DEVICE", "CPU")

import _harness  # noqa: E402  (persistent compile cache off; write_report)
import torch  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core import executor  # noqa: E402
from _models import make_case, train_step as _step  # noqa: E402

SCHEMA = "torch_xla_core/bench/replay/1"


def run_mode(name, mode, steps, warmup, opt_step=None):
    """One row's mode ("traced" or "replayed"): model `name`'s training step
    timed by _harness.host_steps, the metrics cleared first. opt_step(opt):
    the step's optimizer call (default opt.step(); bench/collective_replay.py
    passes txc.optimizer_step)."""
    case = make_case(name).to(txc.device())
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-6)  # the MLP loss is a plain sum
    inputs = [x.detach() for x in case.inputs]  # the batch (no input grads: a training step)

    def step(m, o, inp, lf):
        return _step(m, o, inp, lf, opt_step=opt_step and (lambda: opt_step(o)))
    if mode == "replayed":
        fn = txc.compile(step, wait=True)
    else:
        def fn(m, o, inp, lf):
            out = step(m, o, inp, lf)
            txc.sync(wait=True)
            return out
    if mode == "replayed":  # the steady state: recorded, and the executable that takes the old grads donated
        for _ in range(2):    # (compiled in the background after the recording) in use
            fn(case.model, opt, inputs, case.loss)
        executor.wait_compiles()
    txc.metrics.clear()
    r = _harness.host_steps(lambda: fn(case.model, opt, inputs, case.loss), warmup, steps)
    c = txc.metrics.counters()
    return {"host_ms": r["host_ms"], "wall_ms": r["wall_ms"], "device_ms": r["device_ms"],
            "thread_cpu_ms": r["thread_cpu_ms"], "loss": r["result"].item(), "replays": c.get("replay", 0),
            "compiles": c.get("compile", 0),
            "executions_per_step": (c.get("execute", 0) - r["counters_at_start"].get("execute", 0)) / steps}


def first_step(name):
    """(In a fresh process) wall seconds of the first traced training step."""
    case = make_case(name).to(txc.device())
    opt = torch.optim.AdamW(case.model.parameters(), lr=1e-6)
    inputs = [x.detach() for x in case.inputs]
    t0 = time.perf_counter()
    _step(case.model, opt, inputs, case.loss)
    txc.sync(wait=True)
    c, tm = txc.metrics.counters(), txc.metrics.timers()
    # where the first step's time goes: XLA compile (cold) or executable
    # load (warm), and the first execution (XLA:CPU sets up its library
    # fusions, e.g. YNNPACK's dot kernels, on an executable's first run)
    return {"first_step_s": time.perf_counter() - t0, "compiles": c.get("compile", 0),
            "disk_hits": c.get("persistent_cache_hit", 0),
            **{f"{k}_s": tm.get(k, (0, 0.0))[1] for k in ("compile", "persistent_cache_load", "execute")}}


def cache_startup(name):
    """First step of a new process with a cold, then a warm persistent cache."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TXC_COMPILE_CACHE=d)
        res = {}
        for run in ("cold", "warm"):
            r = subprocess.run([sys.executable, __file__, "--first-step", name], env=env, capture_output=True,
                               text=True, check=True)
            res[run] = json.loads(r.stdout.strip().splitlines()[-1])
    res["speedup"] = res["cold"]["first_step_s"] / max(res["warm"]["first_step_s"], 1e-9)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "decoder"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "replay.json"))
    ap.add_argument("--first-step", help=argparse.SUPPRESS)  # worker of the cache startup rows
    a = ap.parse_args()
    if a.first_step:
        print(json.dumps(first_step(a.first_step)))
        return
    rows = []
    for name in a.models:
        r = {"model": name}
        for mode in ("traced", "replayed"):
            r[mode] = run_mode(name, mode, a.steps, a.warmup)
        r["host_ratio"] = r["traced"]["host_ms"] / max(r["replayed"]["host_ms"], 1e-9)
        rows.append(r)
    print(f"{'model':<8} {'traced host ms':>15} {'replayed host ms':>17} {'ratio':>7} "
          f"{'device ms':>10} {'replays':>8} {'loss traced':>12} {'loss replayed':>14}")
    for r in rows:
        t, p = r["traced"], r["replayed"]
        print(f"{r['model']:<8} {t['host_ms']:>15.2f} {p['host_ms']:>17.3f} {r['host_ratio']:>6.1f}x "
              f"{p['device_ms']:>10.2f} {p['replays']:>8} {t['loss']:>12.6f} {p['loss']:>14.6f}")
    startup = {name: cache_startup(name) for name in a.models}
    print(f"\n{'model':<8} {'cold 1st step s':>16} {'warm 1st step s':>16} {'speedup':>8} {'warm compiles':>14} "
          f"{'cold compile s':>15} {'warm load s':>12} {'1st execute s (cold/warm)':>26}")
    for name, r in startup.items():
        c, w = r["cold"], r["warm"]
        print(f"{name:<8} {c['first_step_s']:>16.2f} {w['first_step_s']:>16.2f} "
              f"{r['speedup']:>7.1f}x {w['compiles']:>14} {c['compile_s']:>15.2f} {w['persistent_cache_load_s']:>12.2f} "
              f"{c['execute_s']:>12.2f} / {w['execute_s']:<11.2f}")
    _harness.write_report(a.out, SCHEMA, cache_startup=startup, steps=a.steps, warmup=a.warmup, rows=rows)


if __name__ == "__main__":
    main()
