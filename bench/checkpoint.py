#!/usr/bin/env python
"""Issue 38's measure: the step time of a small decoder training while an
async checkpoint (txc.checkpoint.CheckpointManager) is being written, against
the step time without one.

The model: bench/_models.py's decoder (TinyGPT, --layers layers, width
--dim, batch 4 x 64 tokens) on xla, AdamW; one step is train_step + txc.sync()
+ txc.wait_device_ops(), so a step's wall time includes its compute. The
run alternates --rounds rounds of: --steps steps without a save in flight
(baseline), then save() of model + optimizer + scheduler-free state (async:
it returns after one sync and the host copies start; the write runs on a
thread) and steps until the write is committed (at least --steps). A step
counts as "during a save" when the write was in flight at its start.
Reported: median (and p25/p75) step ms without and during a save, the
overhead in %, the blocking time of save() itself (the state taken at the
step boundary), the write's duration, the checkpoint's size; and for
comparison a synchronous save (async_save=False) of the same state.

  python bench/checkpoint.py [--layers 4] [--dim 256] [--rounds 6] [--steps 10] [--runtime traced|compiled]
                             [--out FILE.json]
"""
import argparse
import pathlib
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import torch_xla_core as txc  # noqa: E402
from _harness import stats, write_report  # noqa: E402
from _models import TinyGPT, train_step  # noqa: E402


def _size(folder) -> int:
    return sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*") if p.is_file())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runtime", choices=("traced", "compiled"), default="traced",
                    help="the step traced op by op every step, or replayed under txc.compile")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.json"))
    args = ap.parse_args()

    torch.manual_seed(0)
    vocab, seq, batch = 256, 64, 4
    model = TinyGPT(vocab=vocab, dim=args.dim, layers=args.layers, heads=4, max_seq=seq).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, vocab, (batch, seq + 1))
    inputs = [data[:, :-1].contiguous().to("xla"), data[:, 1:].contiguous().to("xla")]

    def loss_fn(m, inp):
        logits = m(inp[0])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), inp[1].reshape(-1))

    one = (lambda: train_step(model, opt, inputs, loss_fn))
    if args.runtime == "compiled":
        one = txc.compile(one)

    def step() -> float:
        t0 = time.perf_counter()
        one()
        txc.sync()
        txc.wait_device_ops()
        return time.perf_counter() - t0

    for _ in range(args.warmup):
        step()
    n_params = sum(p.numel() for p in model.parameters())
    base, during, blocking, writes = [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        mngr = txc.checkpoint.CheckpointManager(pathlib.Path(d) / "async", keep=2)
        n = 0
        for r in range(args.rounds):
            base += [step() for _ in range(args.steps)]
            n += 1
            t0 = time.perf_counter()
            mngr.save(n, model=model, optimizer=opt)
            blocking.append(time.perf_counter() - t0)
            taken = 0
            while mngr.is_saving() or taken < args.steps:
                in_flight = mngr.is_saving()
                dt = step()
                if in_flight:
                    during.append(dt)
                taken += 1
            mngr.wait_until_finished()
            writes.append(time.perf_counter() - t0)
        size = _size(pathlib.Path(d) / "async" / f"step_{n}")
        sync_mngr = txc.checkpoint.CheckpointManager(pathlib.Path(d) / "sync", keep=1, async_save=False)
        sync_save = []
        for i in range(3):
            t0 = time.perf_counter()
            sync_mngr.save(i, model=model, optimizer=opt)
            sync_save.append(time.perf_counter() - t0)

    b, s = stats([x * 1e3 for x in base]), stats([x * 1e3 for x in during])
    overhead = 100.0 * (s["median"] / b["median"] - 1.0) if s else None
    rows = [("step, no save in flight", b), ("step, async save in flight", s),
            ("save() blocking (state taken)", stats([x * 1e3 for x in blocking])),
            ("async save, call to commit", stats([x * 1e3 for x in writes])),
            ("sync save (async_save=False)", stats([x * 1e3 for x in sync_save]))]
    print(f"decoder: {args.layers} layers, width {args.dim}, {n_params / 1e6:.2f} M parameters; checkpoint "
          f"{size / 2**20:.1f} MiB (model + AdamW); {txc.runtime.platform()}; step {args.runtime}")
    print(f"{'':32s} {'median ms':>10s} {'p25':>8s} {'p75':>8s} {'n':>4s}")
    for name, st in rows:
        if st:
            print(f"{name:32s} {st['median']:10.2f} {st['p25']:8.2f} {st['p75']:8.2f} {st['n']:4d}")
    print(f"step time during an async save: {overhead:+.1f}% (target: within 10%)" if overhead is not None
          else "no step ran while a save was in flight (the writes finished within save())")
    write_report(args.out, "checkpoint/1", runtime=args.runtime, layers=args.layers, dim=args.dim, parameters=n_params,
                 checkpoint_bytes=size, step_ms=b, step_ms_during_save=s, overhead_pct=overhead,
                 save_blocking_ms=rows[2][1], async_save_ms=rows[3][1], sync_save_ms=rows[4][1])


if __name__ == "__main__":
    main()
