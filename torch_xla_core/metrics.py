"""Counters and timers of the runtime: compiles, cache hits and misses,
lowering/compile/execute/transfer times, and per-op CPU fallbacks.
`report()` renders them as text (with a memory section from
torch_xla_core/_features/memory.py), `short_report()` as a few key lines; `clear()`
resets them. Timers keep their last samples for percentiles
(timer_stats). torch_xla's metric API reads the same data under torch_xla's
names (metric_data, counter_value, metric_names, counter_names; e.g.
CompileTime = our "compile" timer, CachedCompile = our "cache_hit" counter):
aliases only, our own names and units (seconds) stay; torch_xla's units
(nanoseconds) and report format are torch_xla_core.compat.torch_xla.debug.metrics'. Listeners (add_listener) see every timed span as it ends: the
profiler (torch_xla_core/_features/profiler.py) is one; with none installed a timer
costs one list test more."""
import collections
import threading
import time
from contextlib import contextmanager

_counters = collections.Counter()
_timers = {}  # name -> [count, total seconds, deque of the last SAMPLES (unix time, seconds)]
SAMPLES = 1024  # samples kept per timer for percentiles
_lock = threading.Lock()  # threads (and the compile workers) update these
_listeners = []  # fn(name, start, end): perf_counter seconds, called on the timing thread


def counter_add(name: str, n: int = 1) -> None:
    """Adds n to a counter."""
    with _lock:
        _counters[name] += n


def timer_add(name: str, seconds: float) -> None:
    """Records a timer sample of `seconds` (and tells the listeners)."""
    with _lock:
        t = _timers.get(name)
        if t is None:
            _timers[name] = [1, seconds, collections.deque(((time.time(), seconds),), maxlen=SAMPLES)]
        else:
            t[0] += 1
            t[1] += seconds
            t[2].append((time.time(), seconds))
    if _listeners:
        end = time.perf_counter()
        for fn in tuple(_listeners):
            fn(name, end - seconds, end)


def add_listener(fn) -> None:
    """fn(name, start, end) is called as each timed span ends (perf_counter
    seconds; on the thread that timed it: compiles run on worker threads)."""
    with _lock:
        _listeners.append(fn)


def remove_listener(fn) -> None:
    """Stops calling fn (add_listener's)."""
    with _lock:
        if fn in _listeners:
            _listeners.remove(fn)


@contextmanager
def timed(name: str):
    """A context manager that records its body's wall time as a sample of timer `name`."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timer_add(name, time.perf_counter() - t0)


def counters() -> dict:
    """Counter name -> count."""
    with _lock:
        return dict(_counters)


def timers() -> dict:
    """Timer name -> (count, total seconds)."""
    with _lock:
        return {k: (v[0], v[1]) for k, v in _timers.items()}


def timer_stats(name: str) -> dict:
    """count, total, mean, min, max and the 50/90/99th percentiles (over the
    last SAMPLES samples) of a timer, in seconds; {} for a timer never timed."""
    with _lock:
        t = _timers.get(name)
        if t is None:
            return {}
        n, total, samples = t[0], t[1], sorted(s for _, s in t[2])

    def pct(q):  # nearest rank
        return samples[min(len(samples) - 1, max(0, -(-q * len(samples) // 100) - 1))]
    return {"count": n, "total": total, "mean": total / n, "min": samples[0], "max": samples[-1],
            "p50": pct(50), "p90": pct(90), "p99": pct(99)}


# torch_xla's metric names -> ours (torch_xla.debug.metrics reads these).
# ExecuteTime: "execute" when syncs wait for results, "execute_launch" when they only launch.
TIMER_ALIASES = {"CompileTime": ("compile",), "ExecuteTime": ("execute", "execute_launch"),
                 "TransferToDeviceTime": ("transfer_to_device",), "TransferFromDeviceTime": ("transfer_to_host",),
                 "LoweringTime": ("lower",)}
COUNTER_ALIASES = {"UncachedCompile": "compile", "CachedCompile": "cache_hit", "ExecuteCount": "execute",
                   "MarkStep": "mark_step"}  # mark_step: torch_xla's sync/mark_step/step (compat layer)


def metric_data(name: str):
    """torch_xla's metric_data: (count, total seconds, [(unix time, seconds) of the
    kept samples]) of a timer, by our name or torch_xla's; None if never
    timed. Seconds, as timers() (torch_xla reports nanoseconds: its
    torch_xla_core.compat.torch_xla.debug.metrics does too)."""
    with _lock:
        t = next((_timers[n] for n in TIMER_ALIASES.get(name, (name,)) if n in _timers), None)
        if t is None:
            return None
        return t[0], t[1], list(t[2])


def counter_value(name: str):
    """torch_xla's counter_value: a counter by our name or torch_xla's
    (fallbacks also as "aten::<op>"); None if it never counted."""
    if name.startswith("aten::"):
        name = "fallback::" + name[len("aten::"):]
    with _lock:
        return _counters.get(COUNTER_ALIASES.get(name, name))


def metric_names() -> list:
    """Timer names that have samples, ours and torch_xla's aliases of them."""
    with _lock:
        names = set(_timers)
    return sorted(names | {a for a, ours in TIMER_ALIASES.items() if names.intersection(ours)})


def counter_names() -> list:
    """Counter names, ours and torch_xla's aliases of them."""
    with _lock:
        names = set(_counters)
    return sorted(names | {a for a, ours in COUNTER_ALIASES.items() if ours in names})


def fallbacks() -> dict:
    """aten op name -> number of times it ran on the CPU as a fallback."""
    p = "fallback::"
    return {k[len(p):]: v for k, v in counters().items() if k.startswith(p)}


def clear() -> None:
    """Resets every counter and timer."""
    with _lock:
        _counters.clear()
        _timers.clear()


def clear_counters() -> None:
    """Resets every counter."""
    with _lock:
        _counters.clear()


def clear_timers() -> None:
    """Resets every timer."""
    with _lock:
        _timers.clear()


def report() -> str:
    """Every counter and timer (count, total seconds), as text."""
    cs, ts = counters(), timers()
    lines = ["counters:"]
    for k in sorted(cs):
        lines.append(f"  {k}: {cs[k]}")
    lines.append("timers:")
    for k in sorted(ts):
        st = timer_stats(k)
        if not st:
            continue
        lines.append(f"  {k}: count={st['count']} total={st['total'] * 1e3:.3f}ms mean={st['mean'] * 1e3:.3f}ms "
                     f"p50={st['p50'] * 1e3:.3f}ms p90={st['p90'] * 1e3:.3f}ms p99={st['p99'] * 1e3:.3f}ms")
    for section in _report_sections:
        lines += section()
    return "\n".join(lines)


_report_sections = []  # fn() -> lines, added by modules above this layer (memory.py: device memory)


def add_report_section(fn) -> None:
    """Adds fn() -> list of lines to report(): how a module of a higher layer
    (memory.py reads the executor, which sits above this module) shows its part."""
    if fn not in _report_sections:
        _report_sections.append(fn)


def short_report() -> str:
    """A few key lines: compiles and their time, compile-cache hits and misses,
    executions and execute time, transfers, and the ops that fell back to the
    CPU (the first thing to fix when a step is slow); and, when there were
    any, the value reads whose graph kept growing (growing_graph)."""
    cs, ts = counters(), timers()

    def t(name):
        n, total = ts.get(name, (0, 0.0))
        return f"{total * 1e3:.1f}ms" + (f" ({total / n * 1e3:.2f}ms mean)" if n else "")

    hits, misses = cs.get("cache_hit", 0), cs.get("cache_miss", 0)
    rate = f"{100 * hits / (hits + misses):.0f}%" if hits + misses else "n/a"
    fb = fallbacks()
    top = ", ".join(f"{k} x{v}" for k, v in sorted(fb.items(), key=lambda kv: -kv[1])[:5])
    execute = "execute" if "execute" in ts else "execute_launch"
    lines = [
        f"compiles: {cs.get('compile', 0)} in {t('compile')}, lowering {t('lower')}",
        f"compile cache: {hits} hits, {misses} misses (hit rate {rate})",
        f"executions: {cs.get('execute', 0)}, {execute} {t(execute)}",
        f"transfers: {cs.get('transfer_to_device', 0)} to device ({t('transfer_to_device')}), "
        f"{cs.get('transfer_to_host', 0)} to host ({t('transfer_to_host')})",
        f"cpu fallbacks: {sum(fb.values())}" + (f" ({top})" if top else ""),
    ]
    if cs.get("growing_graph"):  # torch_xla_core/_execution/growth.py
        lines.append(f"growing graphs: {cs['growing_graph']} value reads recomputed every earlier step "
                     f"(no txc.sync() at the end of each step)")
    return "\n".join(lines)


metrics_report = report  # torch_xla's name
