#!/usr/bin/env python
"""Does txc.data.DeviceLoader hide the host->device copy of each batch?

A program, not a test: it prints a table and writes JSON
(bench/results/loader.json by default). A step-time-bound loop (an MLP
forward+backward+SGD step on a batch of --batch x --features floats, sized
so that copying the batch costs a sizable part of a step) runs three ways,
interleaved round by round so that machine noise hits all three alike:

  resident   the batches are already on the device (no transfer): the floor
  plain      `x.to(dev)` at the top of each step, on the training thread
  loader     DeviceLoader(batches, prefetch=--prefetch): copies in the background

Each step ends with txc.sync(wait=True), so a row's time is the real step
time. It reports ms per step (median over rounds of each round's mean) and
the ratios to `resident`; the issue's target is loader <= 1.1x resident.
The batches live in host memory beforehand (no data loading is timed).

  python bench/loader.py                       # default size
  python bench/loader.py --batch 2048 --features 4096 --steps 20 --rounds 5
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

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch_xla_core as txc  # noqa: E402
from _harness import BENCH_DIR, stats  # noqa: E402


def _model(features, dev):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(features, 256), torch.nn.GELU(), torch.nn.Linear(256, features)).to(dev)
    return m, torch.optim.SGD(m.parameters(), lr=1e-3)


def _step(m, opt, x):
    opt.zero_grad()
    torch.nn.functional.mse_loss(m(x), x).backward()
    opt.step()


def run_once(mode, batches, model, dev, prefetch):
    m, opt = model
    t0 = time.perf_counter()
    if mode == "resident":
        for x in batches:
            _step(m, opt, x)
            txc.sync(wait=True)
    elif mode == "plain":
        for x in batches:
            _step(m, opt, x.to(dev))
            txc.sync(wait=True)
    else:
        for x in txc.data.DeviceLoader(batches, prefetch=prefetch, device=dev):
            _step(m, opt, x)
            txc.sync(wait=True)
    return (time.perf_counter() - t0) / len(batches) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--features", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefetch", type=int, default=4)
    ap.add_argument("--json", default=str(BENCH_DIR / "results" / "loader.json"))
    args = ap.parse_args(argv)
    dev = txc.device()
    host = [torch.randn(args.batch, args.features) for _ in range(args.steps)]
    resident = [x.to(dev) for x in host]
    txc.sync(wait=True)
    models = {mode: _model(args.features, dev) for mode in ("resident", "plain", "loader")}
    for mode in models:  # warm-up: compile every graph once
        run_once(mode, (resident if mode == "resident" else host)[:2], models[mode], dev, args.prefetch)
    per_mode = {mode: [] for mode in models}
    for _ in range(args.rounds):
        for mode in models:
            per_mode[mode].append(run_once(mode, resident if mode == "resident" else host, models[mode], dev,
                                           args.prefetch))
    mb = args.batch * args.features * 4 / 2**20
    floor = statistics.median(per_mode["resident"])
    print(f"batch {args.batch}x{args.features} float32 = {mb:.1f} MiB, {args.steps} steps x {args.rounds} rounds, "
          f"prefetch {args.prefetch}, {txc.runtime.platform()}")
    print(f"{'mode':<10} {'ms/step':>9} {'p25':>8} {'p75':>8} {'vs resident':>12}")
    rows = {}
    for mode, xs in per_mode.items():
        s = stats(xs)
        rows[mode] = dict(s, ratio=s["median"] / floor)
        print(f"{mode:<10} {s['median']:9.2f} {s['p25']:8.2f} {s['p75']:8.2f} {s['median'] / floor:11.2f}x")
    out = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
           "cpus": len(os.sched_getaffinity(0)), "platform": txc.runtime.platform(), "args": vars(args),
           "batch_mib": mb, "rows": rows}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
