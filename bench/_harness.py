"""Worker processes and statistics shared by the benchmark programs
(bench/trace_overhead.py, bench/flavors.py).

A benchmark runs each backend or build in a worker: an object whose methods
return JSON-able data. The driver calls it in-process (LocalWorker) or in a
subprocess under another interpreter (RemoteWorker), which runs the same
program with --worker and answers JSON lines through serve(). stats() sums up
a list of timings the same way for every table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
# Benchmarks time cold steps and compiles: the persistent compile cache
# (torch_xla_core/_execution/compile_cache.py) stays off unless a run asks for it.
os.environ.setdefault("TXC_COMPILE_CACHE", "off")


class BackendUnavailable(RuntimeError):
    """Raised by a worker when its backend cannot run here (not installed, no
    device): the driver reports it instead of failing."""


class WorkerError(RuntimeError):
    def __init__(self, msg, unavailable=False):
        super().__init__(msg)
        self.unavailable = unavailable


def serve(worker) -> None:
    """JSON lines on stdin -> JSON lines on the original stdout, each request
    {"cmd": method, "args": {...}} answered by worker.method(**args). Anything
    else the process prints (library warnings, C++ logs) goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        req = json.loads(line)
        cmd, kwargs = req["cmd"], req.get("args", {})
        if cmd == "quit":
            break
        try:
            resp = {"ok": True, "result": getattr(worker, cmd)(**kwargs)}
        except BackendUnavailable as e:
            resp = {"ok": False, "error": str(e), "unavailable": True}
        except Exception as e:
            resp = {"ok": False, "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()}
        proto.write(json.dumps(resp) + "\n")
        proto.flush()


class LocalWorker:
    """A worker object called in this process, with a RemoteWorker's errors."""

    def __init__(self, name, worker):
        self.name = name
        self.worker = worker

    def call(self, cmd, **kwargs):
        try:
            return getattr(self.worker, cmd)(**kwargs)
        except BackendUnavailable as e:
            raise WorkerError(str(e), unavailable=True) from e
        except Exception as e:
            raise WorkerError(f"{type(e).__name__}: {e}\n{traceback.format_exc()}") from e

    def close(self):
        pass


def worker_env(*, clean_python_path=False) -> dict[str, str]:
    """The environment of a worker process: CPU PJRT unless set, unbuffered;
    clean_python_path drops PYTHONPATH/PYTHONHOME (a worker of another venv)."""
    env = {k: v for k, v in os.environ.items()
           if not (clean_python_path and k in ("PYTHONPATH", "PYTHONHOME"))}
    env.setdefault("PJRT_DEVICE", "CPU")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class RemoteWorker:
    """A worker in a subprocess: `argv` runs a benchmark program with --worker
    (it calls serve()), in bench/."""

    def __init__(self, name, argv, env):
        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [str(a) for a in argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True, bufsize=1, env=env, cwd=str(BENCH_DIR))

    def _stderr_tail(self, n=3000):
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read()[-n:]

    def call(self, cmd, **kwargs):
        try:
            self.proc.stdin.write(json.dumps({"cmd": cmd, "args": kwargs}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.proc.wait()
            raise WorkerError(f"{self.name} worker exited (rc={self.proc.returncode}) during "
                              f"{cmd!r}; its stderr ends with:\n{self._stderr_tail()}",
                              unavailable=True)
        resp = json.loads(line)
        if not resp["ok"]:
            raise WorkerError(resp["error"] + ("\n" + resp["traceback"] if "traceback" in resp
                                               else ""), resp.get("unavailable", False))
        return resp["result"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
                self.proc.wait()


def stats(xs):
    """median, quartiles, min/max, mean, stdev and the samples in run order
    (None entries, e.g. a failed run, are left out); None when there are none."""
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return None
    s = sorted(xs)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
    return {"median": statistics.median(s), "p25": q[0], "p75": q[2], "min": s[0],
            "max": s[-1], "mean": statistics.fmean(s),
            "stdev": statistics.stdev(s) if len(s) > 1 else 0.0, "n": len(s),
            "samples": xs}


def write_report(out, schema: str, **fields) -> None:
    """Writes a benchmark's JSON: schema, UTC date, Python, torch and
    platform, then the benchmark's own fields; prints where it went."""
    import datetime
    import platform

    import torch
    import torch_xla_core as txc
    doc = {"schema": schema, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "python": platform.python_version(), "torch": torch.__version__, "platform": txc.runtime.platform(),
           **fields}
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


def host_steps(step, warmup: int, steps: int, executed=None, counters=None) -> dict:
    """Runs step() warmup + steps times and times the last `steps`: the wall
    time of each call and its host time (wall minus the growth of the
    runtime's "execute" timer, i.e. everything but device execution).
    Returns medians in ms (host_ms, wall_ms, device_ms = their difference,
    thread_cpu_ms: the calling thread's CPU time, which a loaded machine
    swings less than wall time), the last call's result and the metrics
    counters at the first timed step.
    executed() / counters(): the execute timer's seconds and the counters
    (default torch_xla_core's; another backend passes its own)."""
    import time

    if executed is None or counters is None:
        import torch_xla_core as txc
        executed = executed or (lambda: txc.metrics.timers().get("execute", (0, 0.0))[1])
        counters = counters or txc.metrics.counters

    host, wall, cpu, result, at_start = [], [], [], None, {}
    for i in range(warmup + steps):
        if i == warmup:
            at_start = counters()
        e0, t0, c0 = executed(), time.perf_counter(), time.thread_time()
        result = step()
        c1, t1, e1 = time.thread_time(), time.perf_counter(), executed()
        if i >= warmup:
            wall.append(t1 - t0)
            host.append((t1 - t0) - (e1 - e0))
            cpu.append(c1 - c0)
    h, w = statistics.median(host), statistics.median(wall)
    return {"host_ms": h * 1e3, "wall_ms": w * 1e3, "device_ms": (w - h) * 1e3,
            "thread_cpu_ms": statistics.median(cpu) * 1e3, "result": result, "counters_at_start": at_start}
