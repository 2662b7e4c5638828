"""Soak: many training steps of a small decoder; resident memory and the
compile count must stay flat.

    python bench/soak.py                  # 10,000 steps (AdamW, dropout, new batch each step)
    python bench/soak.py --steps 2000 --every 250

Each step: a fresh batch moved to the device, forward with dropout (the RNG
state is threaded through every step), cross-entropy, backward, AdamW step,
sync; every 10th step also reads the loss with .item() (a partial sync).
Prints a table (step, RSS MiB, compiles, cache entries, live storages, loss)
and writes bench/results/soak.json. Flat means: after warm-up (the first
checkpoint), RSS grows less than --rss-slack MiB and no compile happens; the
program exits non-zero otherwise, and says which.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
import torch_xla_core as txc  # noqa: E402
from torch_xla_core import _C, executor  # noqa: E402
from _models import TinyGPT  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=1000, help="checkpoint interval (steps)")
    ap.add_argument("--rss-slack", type=float, default=64.0, help="allowed RSS growth after warm-up, MiB")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "soak.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = txc.device()
    vocab, seq, batch = 256, 32, 4
    model = TinyGPT(vocab=vocab, dim=64, layers=2, heads=4, max_seq=seq)
    for block in model.blocks:  # dropout: the device RNG runs every step
        block.register_forward_hook(lambda m, i, o: F.dropout(o, 0.1, m.training))
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)

    rows = []
    print(f"{'step':>7} {'RSS MiB':>9} {'compiles':>9} {'cache':>6} {'live':>6} {'loss':>8} {'seconds':>8}")
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        data = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        tokens, targets = data[:, :-1].to(dev), data[:, 1:].to(dev)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        txc.sync()
        if step % 10 == 0:
            last = loss.item()
        if step % args.every == 0 or step == 1:
            rows.append({"step": step, "rss_mib": round(rss_mib(), 1),
                         "compiles": txc.metrics.counters().get("compile", 0),
                         "cache_entries": executor.cached_count(), "live_storages": _C.live_count(),
                         "loss": round(float(last if step > 1 else loss.item()), 4),
                         "seconds": round(time.perf_counter() - t0, 1)})
            r = rows[-1]
            print(f"{r['step']:>7} {r['rss_mib']:>9.1f} {r['compiles']:>9} {r['cache_entries']:>6} "
                  f"{r['live_storages']:>6} {r['loss']:>8.4f} {r['seconds']:>8.1f}", flush=True)

    warm = rows[1] if len(rows) > 2 else rows[0]
    end = rows[-1]
    growth = end["rss_mib"] - warm["rss_mib"]
    new_compiles = end["compiles"] - warm["compiles"]
    flat = growth <= args.rss_slack and new_compiles == 0
    summary = {"steps": args.steps, "rss_growth_after_warmup_mib": round(growth, 1),
               "compiles_after_warmup": new_compiles, "flat": flat,
               "steps_per_second": round(args.steps / (time.perf_counter() - t0), 1)}
    print(f"\nafter warm-up (step {warm['step']}): RSS {growth:+.1f} MiB, {new_compiles} new compiles, "
          f"{summary['steps_per_second']} steps/s -> {'FLAT' if flat else 'NOT FLAT'}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "summary": summary, "platform": txc.runtime.platform()}, f, indent=1)
    sys.exit(0 if flat else 1)


if __name__ == "__main__":
    main()
