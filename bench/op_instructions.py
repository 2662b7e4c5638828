#!/usr/bin/env python
"""Instructions per traced op, counted by callgrind: the steady measure of the
per-op tracing cost on a shared machine (seconds vary with load; instruction
counts do not).

A program, not a test: it prints a table and writes JSON. It runs itself once
under `valgrind --tool=callgrind --instr-atstart=no` (imports run
uninstrumented, so it takes a minute or two) and, per case, switches
instrumentation on around N1 and then N2 calls of the op (a tiny C helper
built with cc from valgrind's callgrind.h makes the client requests) and
reports (I(N2) - I(N1)) / (N2 - N1): what one more call costs. Nothing is
synced: this is tracing (dispatch, core node, hash, wrapper).

Usage:
  python bench/op_instructions.py                  # every case, table + JSON
  python bench/op_instructions.py --cases add,t    # some
  python bench/op_instructions.py --json PATH      # default bench/results/op_instructions.json
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent

# case -> (setup, one call): x, y are 4x4 float xla tensors, w a 4x4 matrix.
CASES = {
    "add": "x + y",                      # binary elementwise, C++ fast path
    "add_number": "x + 1.5",             # a Python number operand (its dtype rule)
    "neg": "-x",                         # unary
    "t": "w.t()",                        # a view
    "view": "x.view(16)",                # a view with an attribute from an arg
    "mm": "torch.mm(x, w)",              # dot with constant attributes
    "sum_dim": "x.sum(0)",               # a reduction: attrs from args and defaults
    "add_alpha": "torch.add(x, y, alpha=2)",  # the Python handler (a kwarg)
    "relu": "torch.relu(x)",             # a Python handler
}


_HELPER = r"""
#include <valgrind/callgrind.h>
void txc_cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void txc_cg_stop(const char* name) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT(name); }
"""


def measured(cases, n1: int, n2: int, helper: str) -> None:
    """Under callgrind: per case, N1 and N2 calls each between start and stop."""
    import ctypes

    import torch
    import torch_xla_core as txc
    cg = ctypes.CDLL(helper)
    dev = txc.device()
    env = {"torch": torch, "x": torch.randn(4, 4, device=dev), "y": torch.randn(4, 4, device=dev),
           "w": torch.randn(4, 4, device=dev)}
    for case in cases:
        loops = {n: compile(f"for _ in range({n}):\n    r = {CASES[case]}\n", case, "exec") for n in (20, n1, n2)}
        exec(loops[20], env)  # warm-up: dispatch tables, caches
        for n in (n1, n2):
            cg.txc_cg_start()
            exec(loops[n], env)
            cg.txc_cg_stop(f"{case}:{n}".encode())


def instructions(cases, n1: int, n2: int) -> dict:
    """{(case, n): instructions} from one callgrind run."""
    with tempfile.TemporaryDirectory() as d:
        helper = os.path.join(d, "cg.so")
        src = os.path.join(d, "cg.c")
        Path(src).write_text(_HELPER)
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", helper, src], check=True)
        out = os.path.join(d, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
               sys.executable, __file__, "--run", ",".join(cases), str(n1), str(n2), helper]
        env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
        r = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if r.returncode:
            raise RuntimeError(f"callgrind run failed:\n{r.stderr[-3000:]}")
        counts = {}
        for f in Path(d).glob("cg.out*"):
            text = f.read_text(errors="replace")
            m = re.search(r"^desc: Trigger: Client Request: (\S+):(\d+)", text, re.M)
            t = re.search(r"^totals:\s*(\d+)", text, re.M)
            if m and t:
                counts[(m.group(1), int(m.group(2)))] = int(t.group(1))
        return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--n1", type=int, default=200)
    ap.add_argument("--n2", type=int, default=1200)
    ap.add_argument("--json", default=str(BENCH_DIR / "results" / "op_instructions.json"))
    ap.add_argument("--run", nargs=4, metavar=("CASES", "N1", "N2", "HELPER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        measured(a.run[0].split(","), int(a.run[1]), int(a.run[2]), a.run[3])
        return 0
    cases = a.cases.split(",")
    counts = instructions(cases, a.n1, a.n2)
    rows = {}
    print(f"{'case':<12} {'call':<28} {'instructions/op':>16}")
    for case in cases:
        i1, i2 = counts[(case, a.n1)], counts[(case, a.n2)]
        per = (i2 - i1) / (a.n2 - a.n1)
        rows[case] = {"call": CASES[case], "per_op": per, "n1": a.n1, "n2": a.n2, "i1": i1, "i2": i2}
        print(f"{case:<12} {CASES[case]:<28} {per:>16,.0f}", flush=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps({"schema": "torch_xla_core/bench/op_instructions/1", "cases": rows}, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
