"""Counters and timers of the runtime: compiles, cache hits and misses,
lowering/compile/execute/transfer times, and per-op CPU fallbacks.
`report()` renders them as text (with a memory section from
torch_xla_core/memory.py); `clear()` resets them."""
import collections
import threading
import time
from contextlib import contextmanager

_counters = collections.Counter()
_timers = {}  # name -> [count, total seconds]
_lock = threading.Lock()  # threads (and the compile workers) update these


def counter_add(name: str, n: int = 1) -> None:
    with _lock:
        _counters[name] += n


def timer_add(name: str, seconds: float) -> None:
    with _lock:
        t = _timers.get(name)
        if t is None:
            _timers[name] = [1, seconds]
        else:
            t[0] += 1
            t[1] += seconds


@contextmanager
def timed(name: str):
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


def fallbacks() -> dict:
    """aten op name -> number of times it ran on the CPU as a fallback."""
    p = "fallback::"
    return {k[len(p):]: v for k, v in counters().items() if k.startswith(p)}


def clear() -> None:
    with _lock:
        _counters.clear()
        _timers.clear()


def report() -> str:
    cs, ts = counters(), timers()
    lines = ["counters:"]
    for k in sorted(cs):
        lines.append(f"  {k}: {cs[k]}")
    lines.append("timers:")
    for k in sorted(ts):
        n, total = ts[k]
        lines.append(f"  {k}: count={n} total={total * 1e3:.3f}ms mean={total / n * 1e3:.3f}ms")
    from . import memory  # here: memory reads the executor, which imports this module
    lines += memory.report_lines()
    return "\n".join(lines)
