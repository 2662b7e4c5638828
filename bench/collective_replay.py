#!/usr/bin/env python
"""Host time of a data-parallel step with collectives, traced every step vs
replayed (txc.compile), in 2 processes (torch_xla_core.launch --nproc 2
--devices 1; started by this program when run alone).

A program, not a test: it prints a table and writes JSON. The step is
bench/_models.py's train_step on each model with txc.optimizer_step (the
gradients' mean across processes: one all-reduce in the step's graph,
issue 42), AdamW, each process on its own batch, timed by bench/replay.py's
run_mode: host ms per step = wall time of the step and its sync(wait=True)
minus the "execute" timer (launch until the outputs are ready, the
collective's wait on the other process included), medians over --steps
after --warmup; and the stepping thread's CPU time per step over the whole
call (on a shared machine wall-clock host time swings with the other
process's compute). No wait counts as host time: the collective's wait on
the other process, and a replay's writes (done while the device runs), lie
inside "execute"; so does PJRT's launch work, which thread CPU counts.

  python bench/collective_replay.py [--models mlp decoder] [--steps 20] [--warmup 3] [--out FILE.json]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("PJRT_DEVICE", "CPU")

import _harness  # noqa: E402  (persistent compile cache off; write_report)

import torch_xla_core as txc  # noqa: E402
from replay import run_mode as replay_mode  # noqa: E402  (bench/replay.py's timing of one mode)

SCHEMA = "torch_xla_core/bench/collective_replay/1"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "decoder"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "collective_replay.json"))
    a = ap.parse_args()
    if txc.world_size() == 1:  # run alone: start the 2-process job
        env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
        sys.exit(subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "1",
                                 __file__, *sys.argv[1:]], env=env).returncode)
    rows = []
    for name in a.models:
        r = {"model": name}
        for mode in ("traced", "replayed"):
            r[mode] = replay_mode(name, mode, a.steps, a.warmup, opt_step=txc.optimizer_step)
        r["host_ratio"] = r["traced"]["host_ms"] / max(r["replayed"]["host_ms"], 1e-9)
        r["thread_cpu_ratio"] = r["traced"]["thread_cpu_ms"] / max(r["replayed"]["thread_cpu_ms"], 1e-9)
        rows.append(r)
    if txc.global_ordinal() != 0:
        return
    print(f"{'model':<8} {'traced host ms':>15} {'replayed host ms':>17} {'ratio':>7} {'thread CPU ms (tr/re)':>22} "
          f"{'ratio':>7} {'wall ms (tr/re)':>16} {'execs/step':>10} {'replays':>8} {'loss traced':>12} "
          f"{'loss replayed':>14}")
    for r in rows:
        t, p = r["traced"], r["replayed"]
        print(f"{r['model']:<8} {t['host_ms']:>15.2f} {p['host_ms']:>17.3f} {r['host_ratio']:>6.1f}x "
              f"{t['thread_cpu_ms']:>10.2f}/{p['thread_cpu_ms']:<11.2f} {r['thread_cpu_ratio']:>6.1f}x "
              f"{t['wall_ms']:>7.2f}/{p['wall_ms']:<8.2f} {p['executions_per_step']:>10.1f} {p['replays']:>8} "
              f"{t['loss']:>12.6f} {p['loss']:>14.6f}")
    _harness.write_report(a.out, SCHEMA, processes=txc.world_size(), steps=a.steps, warmup=a.warmup, rows=rows)


if __name__ == "__main__":
    main()
