#!/usr/bin/env python
"""Data-parallel training of the bench decoder (bench/_models.py TinyGPT,
AdamW) on 1, 2 and 4 processes, each job started by torchrun with no TXC_*
variable, the same model and global batch in every row (each process takes
global / N sequences):

  torch_gloo   torch's DistributedDataParallel over gloo on CPU tensors (the peer)
  xla_ddp      DistributedDataParallel on xla tensors over our "xla" backend
               (init_process_group("xla", init_method="xla://"))
  xla_optstep  txc.optimizer_step(opt): gradients all-reduced (mean) in the step's graph
  xla_compiled that step under txc.compile: recorded once, then replayed (one launch a step)

A program, not a test: it prints a table and writes JSON (bench/results/dp.json
by default). Per row: ms/step (median of the timed steps, process 0, the step
ending when its values are on the host), scaling efficiency against the
same method on one process (strong scaling: t1 / (N * tN)), the gradient
bytes each process all-reduces per step (the parameters' bytes; a ring
all-reduce moves 2 (N-1)/N of that in and out of each process), and the
last loss. On a CPU machine the processes share its cores, so the
efficiency says how much the method costs, not what a cluster would do.
On a GPU (bench/device_check.sh) the xla rows run XLA's NCCL collectives.

  python bench/dp.py                          # every method x 1, 2, 4 processes
  python bench/dp.py --procs 2 --methods torch_gloo xla_optstep --steps 8
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("torch_gloo", "xla_ddp", "xla_optstep", "xla_compiled")


def worker(method: str, out: str, steps: int, warmup: int, batch: int, seq: int) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from _models import TinyGPT

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if batch % world:
        raise SystemExit(f"bench/dp.py: the global batch {batch} does not split over {world} processes")
    xla = method != "torch_gloo"
    if xla:
        import torch_xla_core as txc
        dev = torch.device("xla")
    else:
        dev = torch.device("cpu")
    torch.manual_seed(0)
    model = TinyGPT(max_seq=seq).to(dev)
    if method == "torch_gloo":
        dist.init_process_group("gloo")
        model = DDP(model)
    elif method == "xla_ddp":
        dist.init_process_group("xla", init_method="xla://")
        model = DDP(model, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    g = torch.Generator().manual_seed(1)
    times, loss = [], None

    def train_step(x):
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1))
        loss.backward()
        if method in ("xla_optstep", "xla_compiled"):
            txc.optimizer_step(opt)
        else:
            opt.step()
        opt.zero_grad()
        return loss

    if method == "xla_compiled":
        train_step = txc.compile(train_step)
    for i in range(warmup + steps):
        tokens = torch.randint(0, 256, (batch, seq + 1), generator=g)[rank::world]
        t0 = time.perf_counter()
        loss = train_step(tokens.to(dev))
        if xla:
            txc.sync()  # the step's graph, as users write it (torch_xla: xm.mark_step()); without it the pending
            #             updates would grow into every later step's graph (loss.item() computes the loss alone)
        value = loss.item()  # the step's values on the host: for xla, the graph ran
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if dist.is_initialized():
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(dict(method=method, processes=world, ms_per_step=1e3 * statistics.median(times),
                           allreduce_bytes=grad_bytes if world > 1 else 0, loss=value, steps=steps,
                           batch=batch, seq=seq), f)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(method: str, nproc: int, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(_port()), __file__, "--worker", method, "--out", out, "--steps", str(args.steps), "--warmup",
               str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq)]
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return dict(method=method, processes=nproc, error=f"timed out after {args.timeout:g} s (--timeout)")
        if r.returncode != 0 or not os.path.exists(out):
            tail = r.stderr.strip().splitlines()[-3:]
            return dict(method=method, processes=nproc, error=f"rc={r.returncode}: {' | '.join(tail)[-400:]}")
        return json.load(open(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences)")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "dp.json"))
    ap.add_argument("--worker", choices=METHODS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker, args.out, args.steps, args.warmup, args.batch, args.seq)
        return 0
    rows = []
    for method in args.methods:
        for n in args.procs:
            row = run(method, n, args)
            rows.append(row)
            print(f"  {method} x{n}: {row.get('ms_per_step', row.get('error'))}", file=sys.stderr, flush=True)
    base = {r["method"]: r["ms_per_step"] for r in rows if r.get("processes") == 1 and "ms_per_step" in r}
    peer = {r["processes"]: r["ms_per_step"] for r in rows if r["method"] == "torch_gloo" and "ms_per_step" in r}
    print(f"\nbench/dp.py: TinyGPT, global batch {args.batch} x {args.seq} tokens, AdamW, {args.steps} timed steps, "
          f"{os.cpu_count()} CPUs")
    print(f"{'method':<12} {'procs':>5} {'ms/step':>9} {'scaling eff':>11} {'vs gloo':>8} {'all-reduce B':>13} "
          f"{'loss':>8}")
    for r in rows:
        if "ms_per_step" not in r:
            print(f"{r['method']:<12} {r['processes']:>5}  failed: {r['error']}")
            continue
        t, n = r["ms_per_step"], r["processes"]
        r["scaling_efficiency"] = base[r["method"]] / (n * t) if r["method"] in base else None
        r["speed_vs_torch_gloo"] = peer[n] / t if n in peer else None
        eff = f"{r['scaling_efficiency']:.2f}" if r["scaling_efficiency"] is not None else "-"
        vs = f"{r['speed_vs_torch_gloo']:.2f}x" if r["speed_vs_torch_gloo"] is not None else "-"
        print(f"{r['method']:<12} {n:>5} {t:>9.1f} {eff:>11} {vs:>8} {r['allreduce_bytes']:>13,} {r['loss']:>8.4f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(batch=args.batch, seq=args.seq, steps=args.steps, cpus=os.cpu_count(), rows=rows), f,
                  indent=1)
    print(f"wrote {args.json}")
    return 0 if all("ms_per_step" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
