"""The profiler: a Chrome trace (the JSON "traceEvents" format that Perfetto,
chrome://tracing and TensorBoard open) of where a training step's time goes.

    with txc.profiler.trace("runs/prof") as t:
        for step, batch in enumerate(loader):
            with txc.profiler.step(step):
                train_step(batch)
    print(t.path)        # runs/prof/txc-trace-<pid>-<time>.json

Spans, one track per thread: "trace" (from the end of one sync to the start
of the next: Python running the model and the core recording ops), "sync"
(a whole sync) and inside it "lower", "compile" (on the compile worker's
track), "execute_launch"/"execute"; "transfer_to_device"/"transfer_to_host";
and "step N" around txc.profiler.step(N) blocks. A sync's span names its
graph (hash), node count and the aten ops that made the graph, most frequent
first ("ops" in its args): per-op spans would cost the tracing path time.

The spans come from metrics' timers (metrics.add_listener): nothing is added
to the per-op path, and with no trace active nothing runs at all. To name a
sync's graph, the trace listens to the executor's syncs
(executor.add_sync_listener) while it is active.

device=True (the default) also records JAX's profiler (jax.profiler, which
knows PJRT and XLA: compiler passes, executable launches, the thunk executor
and XLA's thread pools) and merges its Perfetto JSON into the same file, as
a second process track ("/host:CPU", and the devices' tracks where the
platform reports them), on one clock: a "txc_clock" annotation recorded in
both traces aligns them. JAX's own files (xplane.pb for TensorBoard's
profile plugin, perfetto_trace.json.gz) stay under `<dir>/jax/`; the
Trace's `device_dir` names the run's folder. step(n) also marks a
StepTraceAnnotation there, so TensorBoard's step view sees the steps. JAX's
Python tracer is off (it records every Python call: a large overhead).
Only this trace's own JAX run folder is read (one made during the block,
never an older run in the directory, whatever its date); a JAX trace that
cannot be read or written is warned about and the file keeps our spans."""
import collections
import glob
import gzip
import json
import os
import threading
import time
import warnings
import zlib
from contextlib import contextmanager

import jax

from .._execution import executor
from .. import metrics

_active = None  # the Trace being recorded
_lock = threading.Lock()


class Trace:
    """A trace being recorded; `path` is where it is written on exit."""

    def __init__(self, directory: str, top_ops: int, device: bool = False):
        self.dir = directory
        self.top_ops = top_ops
        self.device = device
        self.device_dir = None  # JAX's run folder, set when a device trace was recorded
        self._clock = None  # perf_counter() at our "txc_clock" annotation in JAX's trace
        self.events = []
        self.path = os.path.join(directory, f"txc-trace-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.json")
        self._origin = time.perf_counter()
        self._threads = {}
        self._graphs = collections.deque()  # (graph hash, nodes, top ops) of syncs whose span has not ended
        self._trace_start = self._origin

    def _us(self, t: float) -> float:
        return (t - self._origin) * 1e6

    def _tid(self) -> int:
        th = threading.current_thread()
        if th.ident not in self._threads:
            self._threads[th.ident] = th.name
        return th.ident

    def add(self, name, start, end, args=None):
        e = {"name": name, "ph": "X", "ts": self._us(start), "dur": max(self._us(end) - self._us(start), 0.0),
             "pid": os.getpid(), "tid": self._tid(), "cat": "txc"}
        if args:
            e["args"] = args
        with _lock:
            self.events.append(e)

    def on_timer(self, name, start, end):
        args = None
        if name == "sync":
            with _lock:
                graph = self._graphs.popleft() if self._graphs else None
            if graph is not None:
                args = {"graph": f"{graph[0]:016x}", "nodes": graph[1], "ops": graph[2]}
            if start > self._trace_start:
                self.add("trace", self._trace_start, start)
            self._trace_start = end
        elif name in ("lower", "compile"):
            with _lock:
                graph = self._graphs[-1] if self._graphs else None
            if graph is not None:
                args = {"graph": f"{graph[0]:016x}"}
        self.add(name, start, end, args)

    def on_plan(self, p):
        cut = p.cut
        ops = collections.Counter()
        for k in range(cut.num_nodes):
            origin = cut.node_info(k)["origin"]
            if origin:
                ops[origin] += 1
        top = dict(ops.most_common(self.top_ops))
        with _lock:
            self._graphs.append((p.key.graph, cut.num_nodes, top))

    def start_device(self):
        opts = jax.profiler.ProfileOptions()
        opts.python_tracer_level = 0
        self._runs_before = set(self._runs())
        try:
            # jax's own Perfetto export reads the newest run folder by mtime, whosever it is: ours reads
            # this run's trace (_device_events) and writes perfetto_trace.json.gz beside it
            jax.profiler.start_trace(os.path.join(self.dir, "jax"), create_perfetto_trace=False,
                                     profiler_options=opts)
        except Exception as e:  # jaxlib's JaxRuntimeError is no RuntimeError
            raise RuntimeError(f"txc.profiler.trace(device=True): JAX's profiler would not start in "
                               f"{os.path.join(self.dir, 'jax')!r} ({e}); stop the other profiler session first, "
                               f"pass a directory whose 'jax' entry is a writable folder (or absent), or pass "
                               f"device=False") from None
        t0 = time.perf_counter()
        with jax.profiler.TraceAnnotation("txc_clock"):
            pass
        self._clock = (t0 + time.perf_counter()) / 2

    def _runs(self):
        return glob.glob(os.path.join(self.dir, "jax", "plugins", "profile", "*"))

    def stop_device(self):
        try:
            jax.profiler.stop_trace()
        except Exception as e:  # e.g. the disk filled up: our trace is still written
            try:
                # lazy: jax's private profiler state, on this error path only (absent: the except)
                from jax._src import profiler as jax_profiler
                with jax_profiler._profile_state.lock:
                    jax_profiler._profile_state.reset()  # (stop_trace resets it only when the export succeeded)
            except (ImportError, AttributeError):  # another jax: its next start_trace says what it thinks
                pass
            warnings.warn(f"txc.profiler: JAX's profiler could not write its trace under "
                          f"{os.path.join(self.dir, 'jax')} ({type(e).__name__}: {e}); {self.path} holds "
                          f"torch_xla_core's spans only", RuntimeWarning, stacklevel=4)
        # this trace's run folder: one that was not there before (never an older run's, whatever its mtime)
        runs = sorted((r for r in self._runs() if r not in self._runs_before), key=os.path.getmtime)
        self.device_dir = runs[-1] if runs else None

    def _device_events(self):
        """JAX's Perfetto events and the shift (us) that puts ours on their
        clock. A file that cannot be read (truncated, not gzip or JSON, not a
        trace) is warned about and left in place; the trace keeps our spans."""
        if self.device_dir is None:
            return [], 0.0
        files = glob.glob(os.path.join(self.device_dir, "*.trace.json.gz"))
        if len(files) != 1:
            return [], 0.0
        try:
            with gzip.open(files[0], "rt") as f:
                doc = json.load(f)
            events = doc.get("traceEvents", []) if isinstance(doc, dict) else None
            if not isinstance(events, list):
                raise ValueError("no traceEvents list")
            events = [e for e in events if isinstance(e, dict)]
            doc.pop("metadata", None)  # Perfetto refuses it (as jax's own export)
            with gzip.open(os.path.join(self.device_dir, "perfetto_trace.json.gz"), "wt") as f:
                json.dump(doc, f)
        except (OSError, EOFError, ValueError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            warnings.warn(f"txc.profiler: JAX's device trace {files[0]} could not be read ({type(e).__name__}: "
                          f"{e}); {self.path} holds torch_xla_core's spans only (JAX's files are left as they are)",
                          RuntimeWarning, stacklevel=4)
            return [], 0.0
        mark = next((e for e in events if e.get("name") == "txc_clock" and isinstance(e.get("ts"), (int, float))),
                    None)
        if mark is None:  # cannot align: keep only ours
            return [], 0.0
        dur = mark.get("dur", 0.0)
        shift = mark["ts"] + (dur if isinstance(dur, (int, float)) else 0.0) / 2 - self._us(self._clock)
        return [e for e in events if e is not mark], shift

    def write(self):
        pid = os.getpid()
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "torch_xla_core"}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": -1}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": n}}
                 for tid, n in self._threads.items()]
        device, shift = self._device_events()
        with _lock:
            events = sorted(self.events, key=lambda e: e["ts"])
        if shift:
            events = [dict(e, ts=e["ts"] + shift) for e in events]
        with open(self.path, "w") as f:
            json.dump({"traceEvents": meta + events + device, "displayTimeUnit": "ms"}, f)


def _check_writable(directory: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".txc-probe-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise RuntimeError(f"txc.profiler.trace: cannot write the trace into {directory!r} ({e.strerror or e}); "
                           f"pass a directory you can write to") from None


@contextmanager
def trace(directory: str, top_ops: int = 10, device: bool = True):
    """Records a Chrome trace of the block into `directory` (made if missing;
    checked writable before the block runs). Yields the Trace (its `path`).
    device=True merges JAX's profiler trace (PJRT, XLA) into the same file."""
    global _active
    if _active is not None:
        raise RuntimeError("txc.profiler.trace: a trace is already being recorded; nest steps with "
                           "txc.profiler.step(n) instead")
    _check_writable(directory)
    jax_dir = os.path.join(directory, "jax")
    if device and os.path.lexists(jax_dir) and not os.path.isdir(jax_dir):
        raise RuntimeError(f"txc.profiler.trace(device=True): {jax_dir!r} is not a directory, and JAX's profiler "
                           f"writes its files there; remove it, pass another directory, or pass device=False")
    t = Trace(directory, top_ops, device)
    if device:
        t.start_device()
    _active = t
    executor.add_sync_listener(t.on_plan)
    metrics.add_listener(t.on_timer)
    try:
        yield t
    finally:
        metrics.remove_listener(t.on_timer)
        executor.remove_sync_listener(t.on_plan)
        t.add("trace", t._trace_start, time.perf_counter())  # traced after the last sync
        _active = None
        if device:
            t.stop_device()
        t.write()


@contextmanager
def step(n):
    """Marks a training step: a "step N" span in the active trace (nothing
    when no trace is being recorded)."""
    t = _active
    start = time.perf_counter()
    annotation = None
    if t is not None and t.device:
        annotation = jax.profiler.StepTraceAnnotation("train", step_num=n)
        annotation.__enter__()
    try:
        yield
    finally:
        if annotation is not None:
            annotation.__exit__(None, None, None)
        if t is not None:
            t.add(f"step {n}", start, time.perf_counter(), {"step": n})


@contextmanager
def span(name: str, **args):
    """A span named `name` (args shown with it) in the active trace, and a
    TraceAnnotation in JAX's; nothing when no trace is being recorded
    (torch_xla's xp.Trace)."""
    t = _active
    if t is None:
        yield
        return
    start = time.perf_counter()
    with jax.profiler.TraceAnnotation(name, **args) if t.device else _nothing():
        try:
            yield
        finally:
            t.add(name, start, time.perf_counter(), args or None)


@contextmanager
def _nothing():
    yield

