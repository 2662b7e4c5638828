#!/usr/bin/env python
"""Tracing overhead of torch_xla_core ("txc") and, side by side, torch-xla (the peer).

A program, not a test: it prints a table and writes JSON. Per model
(bench/_models.py: a 64-layer residual MLP and a small GPT-style decoder) it
measures

  trace fwd       forward under torch.no_grad(), traced without syncing
  trace fwd+bwd   forward + loss + backward, traced without syncing
                  -> ms per step, and µs per aten op (ops counted on CPU eager
                     under a TorchDispatchMode, in the backend's own interpreter)
  first step      trace + sync + wait of the first step: compile seconds (the
                  backend's compile timer) and wall seconds
  cached step     trace + sync (compile-cache hit) + wait; overhead = that
                  wall time minus device execution time (the backend's execute
                  timer: run until outputs are ready)
  train step      zero_grad + forward + backward + AdamW step + wait, host ms
                  per step (wall minus the execute timer), per way of running
                  it: ours per-op tracing ("traced"), trace once and replay
                  ("txc.compile"), torch.compile(backend="torch_xla_core");
                  the peer's per-op tracing and its assume_pure (PureModule
                  around the model: forward and backward traced once; the
                  optimizer per op)

Usage:
  python bench/trace_overhead.py                               # our backend
  nox -s bench_peer                                            # txc vs torch-xla (makes its venv)
  python bench/trace_overhead.py --peer PEER_PYTHON            # the same, given the peer's interpreter
  PEER_PYTHON bench/trace_overhead.py --backend torch_xla

With --peer, each backend runs in its own worker process (ours under this
interpreter, the peer under the given one); the driver interleaves their
repeats and prints one table with both columns and the ratio txc/torch_xla.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

from _harness import (BENCH_DIR, BackendUnavailable, LocalWorker, RemoteWorker,  # noqa: F401
                      WorkerError, serve, stats, worker_env)
OURS, PEER = "txc", "torch_xla"
SCHEMA = "torch_xla_core/bench/trace_overhead/1"


# =========================================================== backends (worker)

class TxcBackend:
    """torch_xla_core: txc.device(), txc.sync(wait=True), txc.metrics.{counters,timers,clear}."""

    name = OURS

    def __init__(self):
        try:
            import torch_xla_core as txc
        except Exception as e:  # ImportError, or a broken build raising anything
            raise BackendUnavailable(
                f"torch_xla_core is not importable under {sys.executable} "
                f"({type(e).__name__}: {e}). Install it into this interpreter "
                "(`pip install -e .` in the repository root) or run only the peer with "
                "`<peer python> bench/trace_overhead.py --backend torch_xla`.") from e
        missing = [a for a in ("device", "sync", "metrics") if not hasattr(txc, a)]
        missing += [f"metrics.{a}" for a in ("counters", "timers")
                    if hasattr(txc, "metrics") and not hasattr(txc.metrics, a)]
        if missing:
            raise BackendUnavailable(
                f"torch_xla_core at {getattr(txc, '__file__', '?')} lacks {', '.join(missing)}, "
                "which this benchmark needs")
        self.txc = txc
        self.device = txc.device()

    def info(self):
        import torch
        txc = self.txc
        plat = None
        rt = getattr(txc, "runtime", None)
        for attr in ("platform", "platform_name", "device_type"):
            v = getattr(rt, attr, None) if rt is not None else None
            if v is not None:
                try:
                    plat = v() if callable(v) else v
                    break
                except Exception:
                    pass
        return {"backend": self.name, "version": getattr(txc, "__version__", "unknown"),
                "torch": torch.__version__, "device": str(self.device), "platform": plat}

    def sync_wait(self):
        self.txc.sync(wait=True)

    def snapshot(self):
        timers = self.txc.metrics.timers()
        counters = self.txc.metrics.counters()
        ex_n, ex_s = timers.get("execute", (0, 0.0))
        co_n, co_s = timers.get("compile", (0, 0.0))
        return {"execute_s": float(ex_s), "executes": int(ex_n),
                "compile_s": float(co_s),
                "compiles": int(counters.get("compile", counters.get("cache_miss", co_n))),
                "cache_hits": int(counters.get("cache_hit", 0))}


    STEP_MODES = ("traced", "txc.compile", "torch.compile")

    def train_step(self, case, mode, opt, inputs):
        """A zero-argument callable running one training step of `case` in `mode`."""
        import torch
        import _models
        model = case.model
        if mode == "txc.compile":
            compiled = self.txc.compile(_models.train_step, wait=True)
            return lambda: compiled(model, opt, inputs, case.loss)
        if mode == "torch.compile":
            from torch_xla_core import dynamo
            dynamo.WAIT = True  # each dynamo graph waits for its results (its execute timer)
            torch._dynamo.reset()
            model = torch.compile(model, backend="torch_xla_core", dynamic=False)
        return _synced_step(self, model, opt, inputs, case.loss)


class TorchXlaBackend:
    """torch-xla: torch_xla.device(), torch_xla.sync() + xm.wait_device_ops(), debug.metrics."""

    name = PEER

    def __init__(self):
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        try:
            import torch_xla
            import torch_xla.core.xla_model as xm
            import torch_xla.debug.metrics as met
        except Exception as e:
            raise BackendUnavailable(
                f"torch_xla is not importable under {sys.executable} ({type(e).__name__}: {e}). "
                "Pass the peer's interpreter with --peer (`nox -s bench_peer` makes one: .nox/peer_torch_xla, "
                "a venv with torch==2.9.1 torch-xla==2.9.0).") from e
        self.torch_xla, self.xm, self.met = torch_xla, xm, met
        self.device = torch_xla.device()

    def info(self):
        import torch
        try:
            import torch_xla.runtime as xr
            plat = xr.device_type()
        except Exception:
            plat = os.environ.get("PJRT_DEVICE")
        return {"backend": self.name, "version": self.torch_xla.__version__,
                "torch": torch.__version__, "device": str(self.device), "platform": plat}

    def sync_wait(self):
        self.torch_xla.sync(wait=True)
        self.xm.wait_device_ops()

    def _metric(self, name):
        data = self.met.metric_data(name)          # (count, total_ns, samples) or None
        return (0, 0.0) if data is None else (int(data[0]), float(data[1]) * 1e-9)

    def snapshot(self):
        ex_n, ex_s = self._metric("ExecuteTime")
        co_n, co_s = self._metric("CompileTime")
        return {"execute_s": ex_s, "executes": ex_n, "compile_s": co_s,
                "compiles": int(self.met.counter_value("UncachedCompile") or 0),
                "cache_hits": int(self.met.counter_value("CachedCompile") or 0)}


    STEP_MODES = ("traced", "assume_pure")

    def train_step(self, case, mode, opt, inputs):
        model = case.model
        if mode == "assume_pure":
            try:  # torch_xla[pallas]'s jax, torchax and flax: see `nox -s bench_peer`
                from torch_xla.experimental.assume_pure import PureModule
                model = _int32_inputs(PureModule(model))
            except Exception as e:
                raise BackendUnavailable(f"assume_pure is not usable here ({type(e).__name__}: {e})") from e
        return _synced_step(self, model, opt, inputs, case.loss)


def _int32_inputs(pure):
    """The model under assume_pure, given its integer inputs as int32: jax
    (without x64) traces an int64 argument as s32, and torch-xla then fails
    the call ("Call parameter must match argument"). One cast per integer
    input per step, outside the pure part; the decoder's token ids (< 256)
    are the same numbers in int32."""
    import torch

    class Int32Inputs(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pure = pure

        def forward(self, *args):
            return self.pure(*(a.to(torch.int32) if isinstance(a, torch.Tensor) and a.dtype == torch.int64 else a
                               for a in args))

    return Int32Inputs()


BACKENDS = {OURS: TxcBackend, PEER: TorchXlaBackend}


def _synced_step(backend, model, opt, inputs, loss_fn):
    """A training step traced per op (_models.train_step), then the backend's sync and wait."""
    import _models

    def fn():
        out = _models.train_step(model, opt, inputs, loss_fn)
        backend.sync_wait()
        return out
    return fn


def _delta(after, before):
    return {k: after[k] - before[k] for k in after}


# ================================================================ the worker

class Worker:
    """Runs one backend. Every method returns JSON-able data; the driver calls
    them directly (one backend) or through RemoteWorker (a subprocess)."""

    def __init__(self, backend_name):
        self.backend_name = backend_name
        self.backend = None
        self.case = None

    def hello(self):
        self.backend = BACKENDS[self.backend_name]()
        return {"python": sys.version.split()[0], "executable": sys.executable,
                "pid": os.getpid(), "step_modes": list(self.backend.STEP_MODES), **self.backend.info()}

    def setup(self, model, seed):
        import torch
        import _models
        case = _models.make_case(model, seed)
        counts = _models.count_aten_ops(case)
        self.case = case.to(self.backend.device)
        self.backend.sync_wait()                    # flush transfers before measuring
        return {"description": case.description, "ops": counts,
                "parameters": sum(p.numel() for p in case.model.parameters()),
                "threads": torch.get_num_threads()}

    def teardown(self):
        self.case = None
        gc.collect()
        self.backend.sync_wait()
        return {}

    # --- one measurement each ------------------------------------------------
    @staticmethod
    def _timed(fn):
        """(out, wall seconds, process CPU seconds). CPU time leaves out the time
        other processes held the cores: the steadier number on a shared machine.
        Process-wide, not per thread: backward on a non-CPU device runs on
        autograd's device thread, not the caller's."""
        gc.collect()
        gc.disable()
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            out = fn()
            t1, c1 = time.perf_counter(), time.process_time()
            return out, t1 - t0, c1 - c0
        finally:
            gc.enable()

    def _trace_only(self, fn):
        self.case.clear_grads()
        out, wall, cpu = self._timed(fn)
        del out
        self.case.clear_grads()
        self.backend.sync_wait()                    # nothing live: keeps state bounded
        return wall, cpu

    def _step(self, fn):
        """trace + sync + wait. Returns timings and metric deltas; keeps the output."""
        self.case.clear_grads()
        gc.collect()
        before = self.backend.snapshot()
        gc.disable()
        try:
            t0 = time.perf_counter()
            out = fn()
            t1 = time.perf_counter()
            self.backend.sync_wait()
            t2 = time.perf_counter()
        finally:
            gc.enable()
        d = _delta(self.backend.snapshot(), before)
        return out, {"total_s": t2 - t0, "trace_s": t1 - t0, "sync_s": t2 - t1,
                     "execute_s": d["execute_s"], "overhead_s": (t2 - t0) - d["execute_s"],
                     "compile_s": d["compile_s"], "compiles": d["compiles"],
                     "cache_hits": d["cache_hits"], "executes": d["executes"]}

    def first_steps(self):
        """The first step of each kind: compiles. Also checks the loss against CPU."""
        out, fwd = self._step(self.case.forward)
        del out
        loss, fb = self._step(self.case.forward_backward)
        fb["loss"] = float(loss.detach().cpu())
        del loss
        return {"forward": fwd, "forward_backward": fb}

    def sample(self, trace_iters=1):
        r = {}
        for kind, fn in (("forward", self.case.forward),
                         ("forward_backward", self.case.forward_backward)):
            wall_cpu = [self._trace_only(fn) for _ in range(trace_iters)]
            r[f"trace_{kind}_s"] = [w for w, _ in wall_cpu]
            r[f"trace_{kind}_cpu_s"] = [c for _, c in wall_cpu]
        out, r["step_forward"] = self._step(self.case.forward)
        del out
        out, r["step_forward_backward"] = self._step(self.case.forward_backward)
        del out
        return r

    def train_steps(self, model, mode, seed, warmup, steps):
        """Host ms per training step of a fresh copy of `model` run in `mode`
        (medians over `steps` after `warmup`), and the last loss."""
        import _harness
        import _models
        import torch
        case = _models.make_case(model, seed).to(self.backend.device)
        opt = torch.optim.AdamW(case.model.parameters(), lr=1e-6)  # (the MLP loss is a plain sum: a small lr)
        fn = self.backend.train_step(case, mode, opt, [x.detach() for x in case.inputs])
        snap = self.backend.snapshot
        r = _harness.host_steps(fn, warmup, steps, executed=lambda: snap()["execute_s"], counters=snap)
        compiles = snap()["compiles"] - r["counters_at_start"]["compiles"]
        out = {"host_ms": r["host_ms"], "wall_ms": r["wall_ms"], "device_ms": r["device_ms"],
               "loss": float(r["result"].cpu()), "compiles_timed": compiles}
        del case, opt, fn, r
        gc.collect()
        self.backend.sync_wait()
        return out

    def warmup(self, n):
        for _ in range(n):
            self.sample(trace_iters=1)
        return {}


def worker_main(backend_name, worker_cls=None):
    """Serves a worker (default Worker) of backend_name over stdin/stdout."""
    serve((worker_cls or Worker)(backend_name))


# ================================================================ the driver

def remote_worker(backend_name, python):
    """This program's worker of backend_name in a subprocess under `python`."""
    return RemoteWorker(backend_name, [python, Path(__file__).resolve(), "--worker",
                                       "--backend", backend_name], worker_env())


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def summarize(setup, first, samples):
    ops = setup["ops"]
    n_f, n_fb = ops["forward"], ops["forward_backward"]
    col = lambda key: [x for s in samples for x in s[key]]       # trace_iters per sample
    sub = lambda kind, key: [s[kind][key] for s in samples]
    s = {
        "description": setup["description"], "parameters": setup["parameters"],
        "ops": {"forward": n_f, "forward_backward": n_fb,
                "forward_by_op": ops["forward_by_op"],
                "forward_backward_by_op": ops["forward_backward_by_op"]},
        **{f"trace_{kind}": {
            "step_s": stats(col(f"trace_{kind}_s")),
            "per_op_us": stats([1e6 * x / n for x in col(f"trace_{kind}_s")]),
            "cpu_step_s": stats(col(f"trace_{kind}_cpu_s")),
            "cpu_per_op_us": stats([1e6 * x / n for x in col(f"trace_{kind}_cpu_s")])}
           for kind, n in (("forward", n_f), ("forward_backward", n_fb))},
        "first_step": first,
        "cpu_loss": ops["cpu_loss"],
    }
    for kind in ("step_forward", "step_forward_backward"):
        s["cached_" + kind] = {k: stats(sub(kind, k)) for k in
                               ("total_s", "trace_s", "sync_s", "execute_s", "overhead_s")}
    s["recompiles"] = sum(sum(sub(k, "compiles")) for k in ("step_forward", "step_forward_backward"))
    return s


# table rows: (label, path into a model summary, scale, format, is_stat)
ROWS = [
    ("aten ops / fwd", ("ops", "forward"), 1, "{:.0f}", False),
    ("aten ops / fwd+bwd", ("ops", "forward_backward"), 1, "{:.0f}", False),
    ("trace fwd       µs/op", ("trace_forward", "per_op_us"), 1, "{:.2f}", True),
    ("trace fwd       ms/step", ("trace_forward", "step_s"), 1e3, "{:.2f}", True),
    ("trace fwd       CPU µs/op", ("trace_forward", "cpu_per_op_us"), 1, "{:.2f}", True),
    ("trace fwd+bwd   µs/op", ("trace_forward_backward", "per_op_us"), 1, "{:.2f}", True),
    ("trace fwd+bwd   ms/step", ("trace_forward_backward", "step_s"), 1e3, "{:.2f}", True),
    ("trace fwd+bwd   CPU µs/op", ("trace_forward_backward", "cpu_per_op_us"), 1, "{:.2f}",
     True),
    ("1st step fwd    compile s", ("first_step", "forward", "compile_s"), 1, "{:.3f}", False),
    ("1st step fwd    wall s", ("first_step", "forward", "total_s"), 1, "{:.3f}", False),
    ("1st step fwd+bwd compile s", ("first_step", "forward_backward", "compile_s"), 1, "{:.3f}",
     False),
    ("1st step fwd+bwd wall s", ("first_step", "forward_backward", "total_s"), 1, "{:.3f}", False),
    ("cached fwd      total ms", ("cached_step_forward", "total_s"), 1e3, "{:.2f}", True),
    ("cached fwd      execute ms", ("cached_step_forward", "execute_s"), 1e3, "{:.2f}", True),
    ("cached fwd      overhead ms", ("cached_step_forward", "overhead_s"), 1e3, "{:.2f}", True),
    ("cached fwd+bwd  total ms", ("cached_step_forward_backward", "total_s"), 1e3, "{:.2f}", True),
    ("cached fwd+bwd  execute ms", ("cached_step_forward_backward", "execute_s"), 1e3, "{:.2f}",
     True),
    ("cached fwd+bwd  overhead ms", ("cached_step_forward_backward", "overhead_s"), 1e3,
     "{:.2f}", True),
    ("recompiles (cached steps)", ("recompiles",), 1, "{:.0f}", False),
]


def _get(d, path):
    for p in path:
        if d is None:
            return None
        d = d.get(p)
    return d


def _value(summary, path, is_stat):
    v = _get(summary, path)
    if v is None:
        return None, None
    if is_stat:
        med = v["median"]
        spread = (v["p75"] - v["p25"]) / 2 / med if med else 0.0
        return med, spread
    return v, None


def ratio_table(results, models):
    out = {}
    for m in models:
        a = _get(results, (OURS, "models", m))
        b = _get(results, (PEER, "models", m))
        if not a or not b:
            continue
        out[m] = {}
        for label, path, _, _, is_stat in ROWS[2:-1]:
            va, _ = _value(a, path, is_stat)
            vb, _ = _value(b, path, is_stat)
            if va is not None and vb:
                out[m][label.replace("  ", " ").strip()] = va / vb
    return out


def print_table(results, backends, models, ratios, out=sys.stdout):
    show_ratio = len(backends) == 2
    headers = ["metric"] + list(backends) + ([f"{OURS}/{PEER}"] if show_ratio else [])
    for m in models:
        rows = []
        for label, path, scale, fmt, is_stat in ROWS:
            cells, meds = [label], []
            for b in backends:
                summ = _get(results, (b, "models", m))
                med, spread = _value(summ, path, is_stat) if summ else (None, None)
                meds.append(med)
                if med is None:
                    err = _get(results, (b, "errors", m))
                    cells.append("error" if err else "n/a")
                else:
                    cell = fmt.format(med * scale)
                    if spread is not None:
                        cell += f" ±{100 * spread:.0f}%"
                    cells.append(cell)
            if show_ratio:
                r = ratios.get(m, {}).get(label.replace("  ", " ").strip())
                cells.append(f"{r:.2f}x" if r is not None else "")
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows + [headers]) for i in range(len(headers))]
        desc = next((_get(results, (b, "models", m, "description")) for b in backends
                     if _get(results, (b, "models", m))), "")
        print(f"\n== {m}: {desc}", file=out)
        line = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(cells, widths)))
        print(line(headers), file=out)
        print("  ".join("-" * w for w in widths), file=out)
        for r in rows:
            print(line(r), file=out)
    print("\nmedian ±half the interquartile range, as % of the median; "
          "µs/op divides by each interpreter's own aten count.", file=out)


def run(workers, models, repeats, warmup, seed, trace_iters, step_runs=None):
    results = {w.name: {"info": None, "models": {}, "errors": {}} for w in workers}
    live = []
    for w in workers:
        try:
            results[w.name]["info"] = w.call("hello")
            live.append(w)
            log(f"[{w.name}] {results[w.name]['info']}")
        except WorkerError as e:
            results[w.name]["errors"]["*"] = str(e)
            log(f"[{w.name}] unavailable: {e}")

    def guarded(w, m, cmd, **kw):
        if m in results[w.name]["errors"]:
            return None
        try:
            return w.call(cmd, **kw)
        except WorkerError as e:
            results[w.name]["errors"][m] = f"{cmd}: {e}"
            log(f"[{w.name}] {m}: {cmd} failed: {e}")
            return None

    for m in models:
        setups, firsts, samples = {}, {}, {w.name: [] for w in live}
        for w in live:
            log(f"[{w.name}] {m}: setup + op count")
            setups[w.name] = guarded(w, m, "setup", model=m, seed=seed)
        for w in live:
            log(f"[{w.name}] {m}: first steps (compile)")
            firsts[w.name] = guarded(w, m, "first_steps")
        for w in live:
            log(f"[{w.name}] {m}: warmup x{warmup}")
            guarded(w, m, "warmup", n=warmup)
        for i in range(repeats):
            order = live if i % 2 == 0 else live[::-1]      # interleave, alternate who goes first
            for w in order:
                r = guarded(w, m, "sample", trace_iters=trace_iters)
                if r is not None:
                    samples[w.name].append(r)
            log(f"[{m}] repeat {i + 1}/{repeats} done")
        for w in live:
            guarded(w, m, "teardown")
            if m in results[w.name]["errors"] or not samples[w.name]:
                continue
            s = summarize(setups[w.name], firsts[w.name], samples[w.name])
            results[w.name]["models"][m] = s
        if step_runs:
            train_steps(live, m, seed, *step_runs, results)
        for w in live:
            s = results[w.name]["models"].get(m)
            if s is None or "first_step" not in s:
                continue
            loss, ref = s["first_step"]["forward_backward"].get("loss"), s["cpu_loss"]
            if loss is not None and abs(loss - ref) > 1e-3 * max(1.0, abs(ref)):
                log(f"[{w.name}] {m}: WARNING first-step loss {loss} != CPU eager {ref}")
    return results


def train_steps(live, m, seed, warmup, steps, results):
    """Every backend's training-step modes for model m, backends interleaved
    (one mode of each in turn). Results under models[m]["train_step"][mode];
    a mode that fails is recorded under errors["m/mode"], the others go on."""
    modes = {w.name: list(results[w.name]["info"].get("step_modes", [])) for w in live}
    for i in range(max((len(v) for v in modes.values()), default=0)):
        for w in live:
            if i >= len(modes[w.name]) or m in results[w.name]["errors"]:
                continue
            mode = modes[w.name][i]
            log(f"[{w.name}] {m}: train step, {mode}")
            try:
                r = w.call("train_steps", model=m, mode=mode, seed=seed, warmup=warmup, steps=steps)
            except WorkerError as e:
                results[w.name]["errors"][f"{m}/{mode}"] = str(e)
                log(f"[{w.name}] {m}: train step {mode} failed: {e}")
                continue
            results[w.name]["models"].setdefault(m, {}).setdefault("train_step", {})[mode] = r


def print_train_steps(results, backends, models, out=sys.stdout):
    """Host ms per training step, every backend and mode, with ratios to our
    per-op tracing and to the peer's assume_pure."""
    rows = [(m, b, mode, r) for m in models for b in backends
            for mode, r in (_get(results, (b, "models", m, "train_step")) or {}).items()]
    if not rows:
        return
    print("\n== train step: zero_grad + fwd + bwd + AdamW + wait; host ms = wall - execute timer, median",
          file=out)
    print(f"{'model':<8} {'backend':<10} {'mode':<14} {'host ms':>9} {'/ txc traced':>13} "
          f"{'/ peer assume_pure':>19} {'device ms':>10} {'compiles':>9} {'loss':>12}", file=out)
    for m, b, mode, r in rows:
        base = _get(results, (OURS, "models", m, "train_step", "traced", "host_ms"))
        pure = _get(results, (PEER, "models", m, "train_step", "assume_pure", "host_ms"))
        f = lambda ref: f"{r['host_ms'] / ref:.3f}x" if ref else "n/a"
        print(f"{m:<8} {b:<10} {mode:<14} {r['host_ms']:>9.2f} {f(base):>13} {f(pure):>19} "
              f"{r['device_ms']:>10.2f} {r['compiles_timed']:>9} {r['loss']:>12.6f}", file=out)
    for b in backends:
        for k, e in results[b]["errors"].items():
            if "/" in k:
                lines = [x for x in e.strip().splitlines() if x.strip() and x.strip() != "Frames:"]
                print(f"{b} {k}: n/a ({lines[-1][:300] if lines else e})", file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["auto", OURS, PEER], default="auto",
                    help="backend to run in this interpreter (default: txc if importable, "
                         "else torch_xla); ignored with --peer")
    ap.add_argument("--peer", metavar="PYTHON",
                    help="interpreter with torch-xla: compare txc (this interpreter) with it")
    ap.add_argument("--models", default="mlp,decoder", help="comma list of: mlp, decoder, decoder100")
    ap.add_argument("--repeats", type=int, default=None, help="measured repeats (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup repeats (default 3)")
    ap.add_argument("--trace-iters", type=int, default=None,
                    help="trace-only samples per repeat (default 5; 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="3 repeats, 1 warmup (CI smoke)")
    ap.add_argument("--train-steps", type=int, default=None,
                    help="timed training steps per mode (default 10; 3 with --quick; 0: skip them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="where to write JSON (default "
                    "bench/results/trace_overhead_<backend>.json, or _txc_vs_torch_xla.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        worker_main(args.backend)
        return 0

    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    trace_iters = args.trace_iters if args.trace_iters is not None else (1 if args.quick else 5)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    sys.path.insert(0, str(BENCH_DIR))
    import _models
    bad = [m for m in models if m not in _models.CASES]
    if bad:
        ap.error(f"unknown model(s) {bad}; choose from {sorted(_models.CASES)}")

    if args.peer:
        peer = os.path.abspath(args.peer) if os.sep in args.peer else args.peer  # (workers run elsewhere)
        workers = [remote_worker(OURS, sys.executable), remote_worker(PEER, peer)]
        default_json = BENCH_DIR / "results" / f"trace_overhead_{OURS}_vs_{PEER}.json"
    else:
        backend = args.backend
        if backend == "auto":
            import importlib.util
            backend = OURS if importlib.util.find_spec("torch_xla_core") else (
                PEER if importlib.util.find_spec("torch_xla") else OURS)
        os.environ.setdefault("PJRT_DEVICE", "CPU")
        workers = [LocalWorker(backend, Worker(backend))]
        default_json = BENCH_DIR / "results" / f"trace_overhead_{backend}.json"

    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    try:
        n_steps = args.train_steps if args.train_steps is not None else (3 if args.quick else 10)
        results = run(workers, models, repeats, warmup, args.seed, trace_iters,
                      (2 if args.quick else 3, n_steps) if n_steps else None)
    finally:
        for w in workers:
            w.close()
    names = [w.name for w in workers]
    ratios = ratio_table(results, models)
    print_table(results, names, models, ratios)
    print_train_steps(results, names, models)

    doc = {
        "schema": SCHEMA,
        "created": started.isoformat(timespec="seconds"),
        "command": [sys.executable] + sys.argv,
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(),
                 "machine": platform.machine(), "loadavg_before": load_before,
                 "loadavg_after": os.getloadavg()},
        "config": {"models": models, "repeats": repeats, "warmup": warmup,
                   "trace_iters": trace_iters, "seed": args.seed,
                   "pjrt_device": os.environ.get("PJRT_DEVICE", "CPU")},
        "backends": results,
        "ratios": {"numerator": OURS, "denominator": PEER, "by_model": ratios} if ratios else None,
    }
    path = Path(args.json) if args.json else default_json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nwrote {path}")

    failed = {n: {k: e for k, e in r["errors"].items() if "/" not in k} for n, r in results.items()}
    failed = {n: e for n, e in failed.items() if e}  # (a train-step mode that failed is shown in its table)
    for n, errs in failed.items():
        for m, e in errs.items():
            first_line = e.strip().splitlines()[0] if e.strip() else e
            print(f"{n}: {'backend' if m == '*' else m} failed: {first_line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
