#!/usr/bin/env python
"""SPMD scaling of a decoder training step (tests/models.py GPT, AdamW):
1, 2, 4 and 8 CPU devices in one process, and 2 processes x 2 devices
through torch_xla_core.launch.

A program, not a test: it prints a table and writes JSON
(bench/results/spmd.json by default). Each configuration runs in its own
process (the device count is fixed when a process's runtime starts). The
batch is split over a 1-D mesh ("fsdp") and every parameter whose first
dimension divides is sharded along it (FSDP-style), so per-device argument
bytes shrink about 1/N. Per row: the median step time of the cached steps,
the compiled program's collectives (all-reduce / all-gather /
reduce-scatter / all-to-all, counted in XLA's optimized HLO), the
per-device compiled statistics (argument / temp bytes), the last loss
(equal across rows up to reduction order), and a sharded checkpoint of
model + optimizer state (torch.distributed.checkpoint with
torch_xla_core.distributed_checkpoint's planners): the bytes process 0
wrote (each process writes its own pieces) and the save / load times. CPU devices share this
machine's cores, so step time does not scale here; the numbers that
matter are the loss, the collectives and the per-device bytes.

  python bench/spmd.py                 # all rows
  python bench/spmd.py --devices 1 8   # some rows, no multi-process row: --no-procs
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def worker(out_dir: str, steps: int) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    import torch
    import torch_xla_core as txc
    import torch_xla_core.sharding as xs
    from torch_xla_core import executor
    from models import GPT

    torch.manual_seed(0)
    model = GPT(vocab=97, d=64, layers=2, heads=4).to("xla")
    n = len(txc.runtime.global_devices())
    mesh = xs.Mesh(range(n), (n,), ("fsdp",))
    if n > 1:
        for p in model.parameters():
            if p.dim() >= 1 and p.shape[0] % n == 0:
                xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    times, loss = [], None
    for _ in range(steps):
        tokens = torch.randint(0, 97, (8, 32), generator=g)
        t0 = time.perf_counter()
        x = tokens.to("xla")
        if n > 1:
            xs.mark_sharding(x, mesh, ("fsdp", None))
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 97), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        txc.sync(wait=True)
        times.append(time.perf_counter() - t0)
    exe = executor._last
    hlo = "\n".join(m.to_string() for m in exe.hlo_modules())
    counts = {c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}
    st = executor.last_memory_stats()
    out = dict(devices=n, processes=txc.world_size(), step_s=statistics.median(times[2:]) if len(times) > 2
               else times[-1], loss=loss.item(), collectives=counts,
               argument_bytes=st.get("argument_size_in_bytes"), temp_bytes=st.get("temp_size_in_bytes"))
    out.update(_checkpoint(model, opt, out_dir))
    with open(os.path.join(out_dir, f"rank{txc.global_ordinal()}.json"), "w") as f:
        json.dump(out, f)


def _checkpoint(model, opt, out_dir: str) -> dict:
    """Saves and loads model + optimizer state as sharded DCP checkpoint."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import torch_xla_core as txc
    from torch_xla_core.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
    if txc.world_size() > 1:
        dist.init_process_group("gloo")  # torch_xla_core.launch set MASTER_ADDR etc.
    path = os.path.join(out_dir, "ckpt")
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=path, planner=SPMDSavePlanner())
    t1 = time.perf_counter()
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
    txc.sync(wait=True)
    t2 = time.perf_counter()
    mine = Path(path, f"__{txc.global_ordinal()}_0.distcp").stat().st_size
    if txc.world_size() > 1:
        dist.destroy_process_group()
    return dict(ckpt_bytes=mine, ckpt_save_s=t1 - t0, ckpt_load_s=t2 - t1)


def _run(devices: int, procs: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        env.setdefault("PJRT_DEVICE", "CPU")
        me = [str(Path(__file__).resolve()), "--worker", d, "--steps", str(steps)]
        if procs == 1:
            env["TXC_NUM_CPU_DEVICES"] = str(devices)
            cmd = [sys.executable] + me
        else:
            cmd = [sys.executable, "-m", "torch_xla_core.launch", "--nproc", str(procs), "--devices",
                   str(devices)] + me
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise RuntimeError(f"{procs} x {devices}: {r.stderr[-3000:]}")
        return json.loads(Path(d, "rank0.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--no-procs", action="store_true", help="skip the 2 processes x 2 devices row")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "spmd.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.steps)
    rows = [(1, n) for n in a.devices] + ([] if a.no_procs else [(2, 2)])
    results = []
    head = f"{'config':>10} {'step ms':>9} {'loss':>12} " + " ".join(f"{c:>9}" for c in ("all-red", "all-gath",
                                                                                         "red-scat")) + \
        f" {'arg KiB/dev':>12} {'temp KiB/dev':>13} {'ckpt KiB/p0':>12} {'save ms':>8} {'load ms':>8}"
    print(head)
    for procs, n in rows:
        r = _run(n, procs, a.steps)
        r["config"] = f"{procs}x{n}" if procs > 1 else f"{n} dev"
        results.append(r)
        c = r["collectives"]
        print(f"{r['config']:>10} {r['step_s'] * 1e3:>9.1f} {r['loss']:>12.7f} {c['all-reduce']:>9} "
              f"{c['all-gather']:>9} {c['reduce-scatter']:>9} {r['argument_bytes'] / 1024:>12.1f} "
              f"{r['temp_bytes'] / 1024:>13.1f} {r['ckpt_bytes'] / 1024:>12.1f} {r['ckpt_save_s'] * 1e3:>8.1f} "
              f"{r['ckpt_load_s'] * 1e3:>8.1f}", flush=True)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(rows=results, steps=a.steps), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
