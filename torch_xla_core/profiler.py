"""The profiler: a Chrome trace (the JSON "traceEvents" format that Perfetto,
chrome://tracing and TensorBoard open) of where a training step's time goes.

The public face of torch_xla_core/_features/profiler.py (the implementation: read it there)."""
from ._features.profiler import Trace, span, step, trace  # noqa: F401

__all__ = ["Trace", "span", "step", "trace"]
