#!/usr/bin/env python
"""Memory of a decoder training step (AdamW) under each memory feature:
donation, scan policies, activation offload.

A program, not a test: it prints a table and writes JSON
(bench/results/memory.json by default). For a stack of decoder blocks
(tests/models.py Block: width --width, --layers layers, input
[--batch, --seq, width]) and one configuration per row:

  loop-nodonate    Python loop over the layers, TXC_DONATE=0
  loop             Python loop, donation on (the default)
  scan-recompute   scan_layers(policy="recompute")
  scan-save        scan_layers(policy="save")
  scan-offload     scan_layers(policy="offload")
  loop-offload     Python loop inside offload_activations(threshold_bytes=0)

it reports the compiled statistics of the training step's graph
(txc.memory.last_graph(): argument/output/alias/temp bytes and device total
= argument + output + temp - alias), the model state (params + grads + AdamW
moments) and the ratio device total / state, the first step's wall time,
the median of the later (cached) steps, and the first-step overhead (first -
cached). On a GPU it adds the device's peak bytes (txc.memory.device_info()).
XLA:CPU drops host placements, so offload shows up in the StableHLO only;
its memory effect needs a GPU or TPU.

  python bench/memory.py                     # small default: 4 layers, width 64, batch 2 x 32
  python bench/memory.py --layers 16 --width 512 --batch 8 --seq 1024   # the issue's size
"""
import argparse
import copy
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
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import torch_xla_core as txc  # noqa: E402
from torch_xla_core.offload import offload_activations  # noqa: E402

from models import Block  # noqa: E402

CONFIGS = {
    "loop-nodonate": dict(scan=None, donate=False, offload=False),
    "loop": dict(scan=None, donate=True, offload=False),
    "scan-recompute": dict(scan="recompute", donate=True, offload=False),
    "scan-save": dict(scan="save", donate=True, offload=False),
    "scan-offload": dict(scan="offload", donate=True, offload=False),
    "loop-offload": dict(scan=None, donate=True, offload=True),
}


def _step(layers, opt, x, cfg):
    opt.zero_grad()
    ctx = offload_activations(threshold_bytes=0) if cfg["offload"] else _null()
    with ctx:
        if cfg["scan"]:
            h = txc.scan.scan_layers(layers, x, policy=cfg["scan"])
        else:
            h = x
            for layer in layers:
                h = layer(h)
        loss = h.pow(2).mean()
    loss.backward()
    opt.step()
    txc.sync(wait=True)


class _null:
    def __enter__(self):
        pass

    def __exit__(self, *a):
        pass


def run(name, cfg, base, x_cpu, steps):
    os.environ["TXC_DONATE"] = "1" if cfg["donate"] else "0"
    gc.collect()
    txc.executor.clear_cache()
    txc.scan.clear_cache()
    layers = copy.deepcopy(base).to(txc.device())
    opt = torch.optim.AdamW(layers.parameters(), lr=1e-3)
    x = x_cpu.to(txc.device())
    txc.sync(wait=True)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        _step(layers, opt, x, cfg)
        times.append(time.perf_counter() - t0)
    g = txc.memory.last_graph()
    n_params = sum(p.numel() * p.element_size() for p in layers.parameters())
    state = 4 * n_params  # params + grads + AdamW exp_avg + exp_avg_sq
    cached = statistics.median(times[1:]) if len(times) > 1 else float("nan")
    row = dict(config=name, **cfg, first_s=times[0], cached_s=cached, first_overhead_s=times[0] - cached,
               params_bytes=n_params, state_bytes=state,
               argument_bytes=g.get("argument_size_in_bytes"), output_bytes=g.get("output_size_in_bytes"),
               alias_bytes=g.get("alias_size_in_bytes"), temp_bytes=g.get("temp_size_in_bytes"),
               device_total_bytes=g.get("device_total_bytes"),
               footprint_over_state=(g["device_total_bytes"] / state) if g else None)
    d = txc.memory.device_info()
    if d:
        row["device_peak_bytes"] = d.get("peak_bytes_in_use")
    del layers, opt, x
    os.environ.pop("TXC_DONATE", None)
    return row


def _mib(n):
    return "-" if n is None else f"{n / 2**20:9.2f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory.json"))
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    base = nn.ModuleList([Block(a.width, a.heads) for _ in range(a.layers)])
    x_cpu = torch.randn(a.batch, a.seq, a.width)
    rows = [run(n, CONFIGS[n], base, x_cpu, a.steps) for n in a.configs]
    hdr = (f"{'config':16} {'arg MiB':>9} {'out MiB':>9} {'alias MiB':>9} {'temp MiB':>9} {'total MiB':>9} "
           f"{'/state':>7} {'first s':>8} {'cached s':>8} {'overhead':>8}")
    print(f"decoder step: {a.layers} layers, width {a.width}, batch {a.batch} x seq {a.seq}, AdamW, "
          f"{txc.runtime.platform()}; state (params+grads+2 moments) = {_mib(rows[0]['state_bytes']).strip()} MiB")
    print(hdr)
    for r in rows:
        ratio = "-" if r["footprint_over_state"] is None else f"{r['footprint_over_state']:7.2f}"
        print(f"{r['config']:16} {_mib(r['argument_bytes'])} {_mib(r['output_bytes'])} {_mib(r['alias_bytes'])} "
              f"{_mib(r['temp_bytes'])} {_mib(r['device_total_bytes'])} {ratio} {r['first_s']:8.2f} "
              f"{r['cached_s']:8.3f} {r['first_overhead_s']:8.2f}")
    out = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(), host=platform.node(),
               platform=txc.runtime.platform(), torch=torch.__version__,
               args=vars(a), rows=rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
