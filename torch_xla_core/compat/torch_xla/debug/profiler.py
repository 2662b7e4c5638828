"""torch_xla.debug.profiler (xp) over txc.profiler: Trace / StepTrace spans,
trace_me, start_trace / stop_trace (a Chrome trace JSON in the directory,
with JAX's PJRT/XLA trace merged in), start_server (JAX's profiler server,
for TensorBoard's capture)."""
import functools

import jax

from ...._features import profiler

_recording = None  # the txc.profiler.trace context start_trace entered


class Trace:
    """A named span in the trace being recorded (torch_xla's TraceMe)."""

    def __init__(self, name: str, **kwargs):
        self.name, self.kwargs = name, kwargs
        self._cm = None

    def __enter__(self):
        self._cm = profiler.span(self.name, **self.kwargs)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class StepTrace(Trace):
    """A training step's span: step_num=N marks step N."""

    def __init__(self, name: str, **kwargs):
        super().__init__(name, **kwargs)
        self._step = kwargs.get("step_num")

    def __enter__(self):
        if self._step is None:
            return super().__enter__()
        self._cm = profiler.step(self._step)
        self._cm.__enter__()
        return self


def trace_me(name: str):
    """A decorator: each call of the function is a span named `name`."""
    def deco(fn):
        @functools.wraps(fn)
        def run(*args, **kwargs):
            with Trace(name):
                return fn(*args, **kwargs)
        return run
    return deco


def start_trace(log_dir: str) -> None:
    """Starts recording a trace into log_dir (stop_trace writes it)."""
    global _recording
    if _recording is not None:
        raise RuntimeError("start_trace: a trace is already being recorded; call stop_trace() first")
    cm = profiler.trace(log_dir)
    cm.__enter__()
    _recording = cm


def stop_trace() -> None:
    """Ends the trace start_trace began and writes it."""
    global _recording
    if _recording is None:
        raise RuntimeError("stop_trace: no trace is being recorded (start_trace(log_dir) starts one)")
    cm, _recording = _recording, None
    cm.__exit__(None, None, None)


def start_server(port: int, only_on_master: bool = True):
    """JAX's profiler server on `port` (TensorBoard's profile plugin captures
    PJRT and XLA activity from it)."""
    return jax.profiler.start_server(port)
