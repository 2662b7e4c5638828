#!/usr/bin/env python
"""A profiler example: trace a few training steps, then draw the trace.

A program, not a test. It trains the small GPT decoder of tests/models.py
for --steps AdamW steps over a txc.data.DeviceLoader inside
txc.profiler.trace(...) with txc.profiler.step(n) marks, then

- prints where the time went (total ms and count per span name) and writes
  it as JSON (bench/results/profile_timeline.json),
- draws the Chrome trace the profiler wrote as a timeline PNG, one row per
  thread (the training thread, the compile workers, the loader) plus the
  step marks (bench/results/profile_timeline.png; needs matplotlib),
- leaves the trace JSON itself for Perfetto (ui.perfetto.dev: Open trace
  file) or chrome://tracing, and prints its path.

  python bench/profile_timeline.py [--steps 6] [--out bench/results]
"""
import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import torch_xla_core as txc  # noqa: E402
from tests.models import GPT  # noqa: E402

COLORS = {"trace": "#9ecae1", "sync": "#d9d9d9", "lower": "#fdae6b", "compile": "#e6550d",
          "execute": "#31a354", "execute_launch": "#74c476", "transfer_to_device": "#756bb1",
          "transfer_to_host": "#bcbddc", "step": "#636363"}


def train(trace_dir, steps):
    torch.manual_seed(0)
    dev = txc.device()
    model = GPT(vocab=97, d=64, layers=2, heads=4).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [torch.randint(0, 97, (8, 33)) for _ in range(steps)]
    with txc.profiler.trace(trace_dir) as t:
        for n, batch in enumerate(txc.data.DeviceLoader(batches, prefetch=2)):
            with txc.profiler.step(n):
                loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
                opt.zero_grad()
                loss.backward()
                opt.step()
        txc.sync(wait=True)
    return t.path


def summarize(events):
    spans = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") == "X":
            name = "step" if e["name"].startswith("step ") else e["name"]
            spans[name][0] += 1
            spans[name][1] += e["dur"] / 1e3
    return {k: {"count": c, "total_ms": ms} for k, (c, ms) in sorted(spans.items(), key=lambda kv: -kv[1][1])}


def _panel(ax, spans, rows, names, lo, hi, title):
    import matplotlib
    for e in spans:
        start, dur = e["ts"] / 1e3, e["dur"] / 1e3
        if start + dur < lo or start > hi:
            continue
        step = e["name"].startswith("step ")
        row = 0 if step else rows.index(names.get(e["tid"], str(e["tid"])))
        kind = "step" if step else e["name"]
        ax.broken_barh([(start, max(dur, (hi - lo) / 2000))], (row - 0.35, 0.7),
                       facecolors=COLORS.get(kind, "#bdbdbd"), edgecolor="none")
        if step and dur > (hi - lo) / 40:
            ax.text(max(start, lo) + (hi - lo) / 200, row, e["name"], va="center", fontsize=7, color="white")
    ax.set_xlim(lo, hi)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9)
    return matplotlib


def draw(events, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    rows = ["steps"] + [names.get(t, str(t)) for t in dict.fromkeys(e["tid"] for e in spans)]
    end = max((e["ts"] + e["dur"]) / 1e3 for e in spans)
    last_compile = max(((e["ts"] + e["dur"]) / 1e3 for e in spans if e["name"] == "compile"), default=0.0)
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(12, 1.2 * len(rows) + 2))
    _panel(a1, spans, rows, names, 0, end, "whole run: the first two steps compile (on the compile worker thread)")
    _panel(a2, spans, rows, names, last_compile, end,
           "after the last compile: cached steps (trace = Python + the core recording ops; execute runs async)")
    a2.set_xlabel("ms since the trace started")
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in COLORS.items()]
    a2.legend(handles=handles, ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.suptitle("torch_xla_core profiler: a decoder's first training steps")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = train(tempfile.mkdtemp(prefix="txc-prof-"), args.steps)
    # ours only (this process's pid): the merged JAX/PJRT events are for Perfetto
    events = [e for e in json.loads(Path(path).read_text())["traceEvents"] if e.get("pid") == os.getpid()]
    summary = summarize(events)
    print(f"{'span':<20} {'count':>6} {'total ms':>10}")
    for k, v in summary.items():
        print(f"{k:<20} {v['count']:6d} {v['total_ms']:10.1f}")
    (out / "profile_timeline.json").write_text(json.dumps({"trace": path, "spans": summary}, indent=1))
    print(f"trace (open in ui.perfetto.dev or chrome://tracing): {path}")
    try:
        draw(events, out / "profile_timeline.png")
        print(f"wrote {out / 'profile_timeline.png'}")
    except ImportError as e:
        print(f"no chart: {e} (pip install matplotlib)", file=sys.stderr)


if __name__ == "__main__":
    main()
