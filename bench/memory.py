#!/usr/bin/env python
"""Memory of a decoder training step (AdamW) under each memory feature:
donation, scan policies, activation offload.

A program, not a test: it prints a table and writes JSON
(bench/results/memory.json by default) and a chart beside it (.png, needs
matplotlib: bytes of the compiled step per configuration against the model
state, and first-step overhead vs cached step). For a stack of decoder blocks
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
    if d:  # the allocator's peak is per process: main() runs each configuration in its own
        row["device_peak_bytes"] = d.get("peak_bytes_in_use")
        # the part of the peak above the model state: activations and temporaries
        row["activation_peak_bytes"] = d.get("peak_bytes_in_use", 0) - state
    del layers, opt, x
    os.environ.pop("TXC_DONATE", None)
    return row


def _run_in_process(name, a):
    """run() for one configuration in a new process (same model and sizes),
    so that its device_peak_bytes is its own."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "row.json"
        sizes = [f"--{k}={getattr(a, k)}" for k in ("layers", "width", "heads", "batch", "seq", "steps")]
        subprocess.run([sys.executable, __file__, *sizes, "--configs", name, "--out", str(out), "--one-config"],
                       check=True)
        row = json.loads(out.read_text())
        print(f"{name}: {json.dumps(row)}", flush=True)  # each row as soon as it is known
        return row


def _mib(n):
    return "-" if n is None else f"{n / 2**20:9.2f}"


def chart(rows, title, png):
    """Two panels per configuration: the compiled step's device bytes
    (argument + output + temp, minus what aliasing shares) against the model
    state, and the first step's overhead over a cached step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r["config"] for r in rows]
    mib = lambda k: [(r[k] or 0) / 2**20 for r in rows]  # noqa: E731
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 2.2))
    y = range(len(rows))
    left = [0.0] * len(rows)
    for k, c in (("argument_bytes", "#6baed6"), ("output_bytes", "#fd8d3c"), ("temp_bytes", "#bdbdbd")):
        a1.barh(y, mib(k), left=left, color=c, label=k.replace("_bytes", ""))
        left = [a + b for a, b in zip(left, mib(k))]
    a1.barh(y, [-v for v in mib("alias_bytes")], left=left, color="#31a354", alpha=0.6, label="- alias (donated)")
    a1.axvline(rows[0]["state_bytes"] / 2**20, color="k", ls="--", lw=1, label="state (params+grads+moments)")
    a1.set_yticks(list(y), names)
    a1.invert_yaxis()
    a1.set_xlabel("MiB (compiled step)")
    a1.legend(fontsize=7, loc="lower right")
    a2.barh(y, [r["first_overhead_s"] for r in rows], color="#e6550d", label="first step - cached step")
    a2.barh(y, [r["cached_s"] for r in rows], color="#74c476", label="cached step")
    a2.set_yticks(list(y), [])
    a2.invert_yaxis()
    a2.set_xlabel("seconds")
    a2.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


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
    ap.add_argument("--png", default=None, help="chart path (default: --out with .png; needs matplotlib)")
    ap.add_argument("--one-config", action="store_true", help=argparse.SUPPRESS)  # worker: one row as JSON to --out
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    base = nn.ModuleList([Block(a.width, a.heads) for _ in range(a.layers)])
    x_cpu = torch.randn(a.batch, a.seq, a.width)
    # the device's peak bytes are per process (GPU/TPU: one process per configuration);
    # the parent must not start the device itself (jax would take its memory)
    if a.one_config or os.environ["PJRT_DEVICE"].upper() == "CPU" or len(a.configs) == 1:
        rows = [run(n, CONFIGS[n], base, x_cpu, a.steps) for n in a.configs]
    else:
        rows = [_run_in_process(n, a) for n in a.configs]
    if a.one_config:
        Path(a.out).write_text(json.dumps(rows[0]))
        return
    hdr = (f"{'config':16} {'arg MiB':>9} {'out MiB':>9} {'alias MiB':>9} {'temp MiB':>9} {'total MiB':>9} "
           f"{'/state':>7} {'first s':>8} {'cached s':>8} {'overhead':>8}")
    title = (f"decoder step: {a.layers} layers, width {a.width}, batch {a.batch} x seq {a.seq}, AdamW, "
             f"{txc.runtime.platform()}; state (params+grads+2 moments) = {_mib(rows[0]['state_bytes']).strip()} MiB")
    peaks = any(r.get("device_peak_bytes") for r in rows)
    if peaks:
        hdr += f" {'peak MiB':>9} {'act. peak':>9}"
    print(title)
    print(hdr)
    for r in rows:
        ratio = "-" if r["footprint_over_state"] is None else f"{r['footprint_over_state']:7.2f}"
        print(f"{r['config']:16} {_mib(r['argument_bytes'])} {_mib(r['output_bytes'])} {_mib(r['alias_bytes'])} "
              f"{_mib(r['temp_bytes'])} {_mib(r['device_total_bytes'])} {ratio} {r['first_s']:8.2f} "
              f"{r['cached_s']:8.3f} {r['first_overhead_s']:8.2f}" +
              (f" {_mib(r.get('device_peak_bytes'))} {_mib(r.get('activation_peak_bytes'))}" if peaks else ""))
    out = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(), host=platform.node(),
               platform=txc.runtime.platform(), torch=torch.__version__,
               args=vars(a), rows=rows)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")
    png = a.png or str(Path(a.out).with_suffix(".png"))
    try:
        chart(rows, title, png)
        print(f"wrote {png}")
    except ImportError as e:
        print(f"no chart: {e} (pip install matplotlib)", file=sys.stderr)


if __name__ == "__main__":
    main()
