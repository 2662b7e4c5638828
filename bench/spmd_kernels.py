#!/usr/bin/env python
"""Kernels under SPMD: flash attention with segment ids (data parallel) and
the interpreted Pallas multi-query paged attention kernel (batch over
"data"), forward + backward, run per shard (kernels/per_shard.py: the manual
region) or left to XLA's partitioner (the same call on a q whose layout is
only known after propagation), on 1, 2, 4 and 8 CPU devices.

A program, not a test: it prints a table and writes JSON
(bench/results/spmd_kernels.json by default). Each device count runs in its
own process. Per row: the median step time of the cached steps, the
compiled program's collectives (counted in XLA's optimized HLO) and the
largest error against the CPU reference (output and q gradient). CPU
devices share this machine's cores, so the times do not scale here; on
TPU the per-shard row is the one whose Mosaic kernel is not gathered onto
every device.

  python bench/spmd_kernels.py                 # all rows
  python bench/spmd_kernels.py --devices 1 8
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


def _flash(q, k, v, seg, **kw):
    from torch_xla_core import kernels
    return kernels.flash_attention(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg, **kw)


def _paged(q, kp, vp, lens, pi, eff, **kw):
    from torch_xla_core import kernels
    return kernels.multi_queries_paged_attention(q, kp, vp, lens, pi, eff, 2, 4, impl="pallas", **kw)


def _inputs(kernel):
    import torch
    g = torch.Generator().manual_seed(0)
    if kernel == "flash":
        q, k, v = (torch.randn(16, 4, 128, 32, generator=g) for _ in range(3))
        seg = torch.randint(0, 4, (16, 128), generator=g).sort(1).values
        return [q, k, v, seg], ("data", None, None, None)
    b, pps, page = 16, 8, 8
    q = torch.randn(b, 8, 4, 32, generator=g)
    kp, vp = (torch.randn(2, b * pps, page, 32, generator=g) for _ in range(2))
    pi = torch.randperm(b * pps, generator=g).reshape(b, pps).to(torch.int32)
    lens = torch.randint(8, pps * page + 1, (b,), generator=g).to(torch.int32)
    return [q, kp, vp, lens, pi, torch.full((b,), 8, dtype=torch.int32)], ("data", None, None, None)


def worker(out_path: str, steps: int) -> None:
    import torch
    import torch_xla_core as txc
    import torch_xla_core.sharding as xs
    from torch_xla_core import executor
    from torch_xla_core.kernels import reference
    n = txc.device_count()
    mesh = xs.Mesh(range(n), (n,), ("data",))
    rows = []
    for kernel, fn, ref_fn in (("flash", _flash, lambda *a: reference.flash_attention(
            *a[:3], causal=True, q_segment_ids=a[3], kv_segment_ids=a[3])),
            ("paged", _paged, reference.multi_queries_paged_attention)):
        args, spec = _inputs(kernel)
        cq = args[0].clone().requires_grad_()
        ref = ref_fn(cq, *args[1:])
        (ref * ref).sum().backward()
        for mode in (("per_shard", "partitioner") if n > 1 else ("one_device",)):
            times, out, grad = [], None, None
            for _ in range(steps):
                t0 = time.perf_counter()
                xa = [a.to("xla") for a in args]
                if n > 1:
                    for a in xa:
                        if a.dim() and a.shape[0] == args[0].shape[0]:
                            xs.mark_sharding(a, mesh, ("data",) + (None,) * (a.dim() - 1))
                q = xa[0].requires_grad_()
                # per shard: q's layout is known (device data); partitioner: a pending copy, laid out by propagation
                out = fn(q if mode == "per_shard" else q * 1, *xa[1:])
                (out * out).sum().backward()
                txc.sync(wait=True)
                times.append(time.perf_counter() - t0)
                grad = q.grad
            hlo = "\n".join(m.to_string() for m in executor._last.hlo_modules())
            err = max((out.cpu() - ref.detach()).abs().max().item(), (grad.cpu() - cq.grad).abs().max().item())
            rows.append(dict(kernel=kernel, devices=n, mode=mode, step_s=statistics.median(times[1:]),
                             max_error=err,
                             collectives={c: len(re.findall(rf"\b{c}(?:-start)?\(", hlo)) for c in COLLECTIVES}))
    with open(out_path, "w") as f:
        json.dump(rows, f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "spmd_kernels.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.steps)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for n in a.devices:
            path = os.path.join(d, f"{n}.json")
            env = dict(os.environ, TXC_NUM_CPU_DEVICES=str(n), PJRT_DEVICE="CPU")
            subprocess.run([sys.executable, __file__, "--worker", path, "--steps", str(a.steps)], env=env,
                           check=True, cwd=ROOT)
            rows += json.load(open(path))
    print(f"{'kernel':>7} {'devices':>7} {'mode':>12} {'step ms':>9} {'max err':>9} {'all-reduce':>10} "
          f"{'all-gather':>10} {'other coll.':>11}")
    for r in rows:
        c = r["collectives"]
        other = sum(v for k, v in c.items() if k not in ("all-reduce", "all-gather"))
        print(f"{r['kernel']:>7} {r['devices']:>7} {r['mode']:>12} {r['step_s'] * 1e3:>9.1f} {r['max_error']:>9.1e} "
              f"{c['all-reduce']:>10} {c['all-gather']:>10} {other:>11}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
