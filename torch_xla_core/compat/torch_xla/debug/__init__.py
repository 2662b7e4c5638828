"""torch_xla.debug: metrics (met) and profiler (xp)."""
from . import metrics, profiler  # noqa: F401
