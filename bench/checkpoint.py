#!/usr/bin/env python
"""Issue 38's measure: the step time of a small decoder training while an
async checkpoint (txc.checkpoint.CheckpointManager) is being written, against
the step time without one, for three ways of writing in one run.

The model: bench/_models.py's decoder (TinyGPT, --layers layers, width
--dim, batch 4 x 64 tokens) on xla, AdamW; one step is train_step + txc.sync()
+ txc.wait_device_ops(), so a step's wall time includes its compute. The
writes compared (--writers): `process`, the manager's (one process: a writer
process started once, the staged tensors in a shared arena); `fork`, a child
forked per save that writes (the manager's route before it, rebuilt here);
`thread`, the write on a thread of the training process (the route of
several processes). Each round takes every writer in turn (the order rotated
each round): --steps steps without a save in flight (that writer's
baseline), then save() of model + optimizer (async: it returns once the
state is taken) and steps until the write is committed (at least --steps).
A step counts as "during a save" when the write was in flight at its start.
Reported per writer: median (p75, max) step ms without and during a save,
the overhead in %, the extra ms a save costs the steps in all (the sum over
its steps during the save of step - the no-save median, per save: the cost
a user pays per checkpoint, which a short write does not dilute), the median
first step after save(), the minor page
faults of the training process per step (mean; copy-on-write faults show
there), the blocking time of save() (the state taken at the step
boundary), the call to commit, the fork() call's time; and a synchronous
save (async_save=False) of the same state. One untimed save per writer
comes first (the writer process starts and imports then).

  python bench/checkpoint.py [--layers 4] [--dim 256] [--rounds 6] [--steps 10] [--runtime traced|compiled]
                             [--writers process,fork,thread] [--out FILE.json]
"""
import argparse
import contextlib
import ctypes
import os
import pathlib
import resource
import sys
import tempfile
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import torch_xla_core as txc  # noqa: E402
from torch_xla_core._features import checkpoint as impl  # noqa: E402
from _harness import stats, write_report  # noqa: E402
from _models import TinyGPT, train_step  # noqa: E402

WRITERS = ("process", "fork", "thread")


def _size(folder) -> int:
    return sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*") if p.is_file())


def _forked(write, fork_ms):
    """impl.write_step run in a child forked per save (the manager's route before the writer process): the
    child has the staged state by copy-on-write, dies with the writing thread, runs at nice 19; its error comes
    back one line long."""
    def run(*args):
        r, w = os.pipe()
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
                os.setpriority(os.PRIO_PROCESS, 0, 19)
                write(*args)
                code = 0
            except BaseException as e:  # noqa: BLE001  (sent to the parent)
                with contextlib.suppress(BaseException):
                    os.write(w, f"{type(e).__name__}: {e}".encode()[:4000])
            finally:
                os._exit(code)
        fork_ms.append((time.perf_counter() - t0) * 1e3)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            message = f.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise RuntimeError(message or f"the forked writer ended with status {status}")
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runtime", choices=("traced", "compiled"), default="traced",
                    help="the step traced op by op every step, or replayed under txc.compile")
    ap.add_argument("--writers", default=",".join(WRITERS), help=f"a comma-separated subset of {WRITERS}")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "checkpoint.json"))
    args = ap.parse_args()
    writers = args.writers.split(",")
    if not set(writers) <= set(WRITERS):
        ap.error(f"--writers {args.writers}: each must be one of {WRITERS}")

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

    def step():
        """(seconds, the training process's minor page faults) of one step."""
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        one()
        txc.sync()
        txc.wait_device_ops()
        return time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    for _ in range(args.warmup):
        step()
    n_params = sum(p.numel() for p in model.parameters())
    plain_write, fork_ms = impl.write_step, []
    route = {"process": plain_write, "thread": plain_write, "fork": _forked(plain_write, fork_ms)}
    got = {w: {"base": [], "during": [], "first": [], "base_flt": [], "during_flt": [], "blocking": [], "commit": []}
           for w in writers}
    with tempfile.TemporaryDirectory() as d:
        mngrs = {}
        for w in writers:
            impl.PROCESS_WRITES = w == "process"
            mngrs[w] = txc.checkpoint.CheckpointManager(pathlib.Path(d) / w, keep=2)
        impl.PROCESS_WRITES = "process" in writers
        n = 0

        def save(w, record):
            nonlocal n
            n += 1
            impl.write_step = route[w]
            t0 = time.perf_counter()
            mngrs[w].save(n, model=model, optimizer=opt)
            record["blocking"].append(time.perf_counter() - t0)
            taken = 0
            while mngrs[w].is_saving() or taken < args.steps:
                in_flight = mngrs[w].is_saving()
                dt, flt = step()
                if in_flight:
                    if taken == 0:
                        record["first"].append(dt)
                    record["during"].append(dt)
                    record["during_flt"].append(flt)
                taken += 1
            mngrs[w].wait_until_finished()
            record["commit"].append(time.perf_counter() - t0)

        for w in writers:  # untimed: the writer process starts (and imports) here
            save(w, {k: [] for k in got[w]})
        fork_ms.clear()
        for r in range(args.rounds):
            for w in writers[r % len(writers):] + writers[:r % len(writers)]:
                for _ in range(args.steps):
                    dt, flt = step()
                    got[w]["base"].append(dt)
                    got[w]["base_flt"].append(flt)
                save(w, got[w])
        impl.write_step = plain_write
        size = _size(pathlib.Path(d) / writers[0] / f"step_{mngrs[writers[0]].latest_step()}")
        for m in mngrs.values():
            m.close()
        sync_mngr = txc.checkpoint.CheckpointManager(pathlib.Path(d) / "sync", keep=1, async_save=False)
        sync_save = []
        for i in range(3):
            t0 = time.perf_counter()
            sync_mngr.save(i, model=model, optimizer=opt)
            sync_save.append(time.perf_counter() - t0)

    ms = (lambda xs: stats([x * 1e3 for x in xs]))
    print(f"decoder: {args.layers} layers, width {args.dim}, {n_params / 1e6:.2f} M parameters; checkpoint "
          f"{size / 2**20:.1f} MiB (model + AdamW); {txc.runtime.platform()}; step {args.runtime}; "
          f"load {os.getloadavg()[0]:.2f}")
    print(f"{'writer':8s} {'no save ms':>10s} {'during ms':>10s} {'p75':>8s} {'max':>8s} {'n':>4s} {'overhead':>9s} "
          f"{'extra ms/save':>13s} {'1st step ms':>11s} {'faults/step':>17s} {'save() ms':>9s} {'commit ms':>9s}")
    report = {}
    for w in writers:
        g = got[w]
        b, s = ms(g["base"]), ms(g["during"])
        overhead = 100.0 * (s["median"] / b["median"] - 1.0) if s else None
        bf, sf = stats(g["base_flt"]), stats(g["during_flt"])
        blocking, commit = ms(g["blocking"]), ms(g["commit"])
        first = ms(g["first"])
        extra = sum(x * 1e3 - b["median"] for x in g["during"]) / len(g["commit"]) if g["commit"] else None
        report[w] = dict(step_ms=b, step_ms_during_save=s, overhead_pct=overhead, extra_ms_per_save=extra,
                         first_step_ms=first,
                         faults_per_step=bf,
                         faults_per_step_during_save=sf, save_blocking_ms=blocking, async_save_ms=commit)
        if s is None:
            print(f"{w:8s} {b['median']:10.2f}  no step ran while a save was in flight")
            continue
        print(f"{w:8s} {b['median']:10.2f} {s['median']:10.2f} {s['p75']:8.2f} {s['max']:8.2f} {s['n']:4d} "
              f"{overhead:+8.1f}% {extra:13.1f} {first['median']:11.1f} {bf['mean']:8.0f}->{sf['mean']:<8.0f} "
              f"{blocking['median']:9.1f} "
              f"{commit['median']:9.0f}")
    if fork_ms:
        f = stats(fork_ms)
        print(f"fork(): {f['median']:.1f} ms median, {f['max']:.1f} max (the training process's Python waits)")
        report["fork"]["fork_call_ms"] = f
    sync = ms(sync_save)
    print(f"sync save (async_save=False): {sync['median']:.1f} ms; target during an async save: within 10%")
    write_report(args.out, "checkpoint/2", runtime=args.runtime, layers=args.layers, dim=args.dim,
                 parameters=n_params, checkpoint_bytes=size, load=os.getloadavg(), writers=report,
                 sync_save_ms=sync)


if __name__ == "__main__":
    main()
