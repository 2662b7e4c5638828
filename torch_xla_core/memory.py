"""Memory statistics: what the last executed graph needed (XLA's compiled
memory statistics of its executable) and what the device holds now (PJRT's
allocator statistics, where the platform reports them).

The public face of torch_xla_core/_features/memory.py (the implementation: read it there)."""
from ._features.memory import last_graph, device_info, live_bytes, report_lines  # noqa: F401

__all__ = ["last_graph", "device_info", "live_bytes", "report_lines"]
