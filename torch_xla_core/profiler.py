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
(executor._sync_listeners) while it is active."""
import collections
import json
import os
import threading
import time
from contextlib import contextmanager

from . import executor, metrics

_active = None  # the Trace being recorded
_lock = threading.Lock()


class Trace:
    """A trace being recorded; `path` is where it is written on exit."""

    def __init__(self, directory: str, top_ops: int):
        self.dir = directory
        self.top_ops = top_ops
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

    def write(self):
        pid = os.getpid()
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": "torch_xla_core"}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": n}}
                 for tid, n in self._threads.items()]
        with _lock:
            events = sorted(self.events, key=lambda e: e["ts"])
        with open(self.path, "w") as f:
            json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, f)


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
def trace(directory: str, top_ops: int = 10):
    """Records a Chrome trace of the block into `directory` (made if missing;
    checked writable before the block runs). Yields the Trace (its `path`)."""
    global _active
    if _active is not None:
        raise RuntimeError("txc.profiler.trace: a trace is already being recorded; nest steps with "
                           "txc.profiler.step(n) instead")
    _check_writable(directory)
    t = Trace(directory, top_ops)
    _active = t
    executor._sync_listeners.append(t.on_plan)
    metrics.add_listener(t.on_timer)
    try:
        yield t
    finally:
        metrics.remove_listener(t.on_timer)
        executor._sync_listeners.remove(t.on_plan)
        t.add("trace", t._trace_start, time.perf_counter())  # traced after the last sync
        _active = None
        t.write()


@contextmanager
def step(n):
    """Marks a training step: a "step N" span in the active trace (nothing
    when no trace is being recorded)."""
    t = _active
    start = time.perf_counter()
    try:
        yield
    finally:
        if t is not None:
            t.add(f"step {n}", start, time.perf_counter(), {"step": n})
