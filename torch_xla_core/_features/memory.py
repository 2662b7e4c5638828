"""Memory statistics: what the last executed graph needed (XLA's compiled
memory statistics of its executable) and what the device holds now (PJRT's
allocator statistics, where the platform reports them).

    import torch_xla_core as txc
    txc.sync()
    txc.memory.last_graph()    # {'argument_size_in_bytes': ..., 'temp_size_in_bytes': ..., ...}
    txc.memory.device_info()   # {'bytes_in_use': ..., 'bytes_limit': ..., 'peak_bytes_in_use': ...} or None
    txc.memory.live_bytes()    # bytes of the device buffers this process holds (every platform)

The numbers come from the executor (executor.last_memory_stats(): the
executable that ran last) and from jax's Device.memory_stats(); this module
only names and sums them. txc.metrics.report() shows both in its memory
section.
"""
from .._execution import executor
from .. import metrics
from .._runtime import runtime

__all__ = ["last_graph", "device_info", "live_bytes", "report_lines"]

_DEVICE_FIELDS = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved", "largest_alloc_size",
                  "num_allocs")


def last_graph() -> dict:
    """The compiled memory statistics of the last executed graph: XLA's
    CompiledMemoryStats fields (argument/output/alias/temp_size_in_bytes,
    generated_code_size_in_bytes, host_argument/output/alias/temp_size_in_bytes
    and peak_memory_in_bytes where jaxlib has it), plus "device_total_bytes"
    (argument + output + temp - alias: what the step needs on the device at
    most) and "host_total_bytes" (the same for host memory). {} before the
    first sync."""
    st = dict(executor.last_memory_stats())
    if not st:
        return {}

    def total(prefix):
        g = lambda f: st.get(prefix + f, 0)  # noqa: E731
        return g("argument_size_in_bytes") + g("output_size_in_bytes") + g("temp_size_in_bytes") - \
            g("alias_size_in_bytes")

    st["device_total_bytes"] = total("")
    st["host_total_bytes"] = total("host_")
    return st


def device_info(device_index: int = 0):
    """The device's allocator statistics as PJRT reports them (jax's
    Device.memory_stats(): bytes_in_use, peak_bytes_in_use, bytes_limit, ...
    on GPU and TPU), or None where the platform reports none (XLA:CPU)."""
    d = runtime.devices()[device_index]
    try:
        st = d.memory_stats()
    except Exception:  # a plugin without allocator statistics
        return None
    if not st:
        return None
    return {k: int(v) for k, v in st.items() if isinstance(v, (int, float))}


def live_bytes(device_index: int = 0) -> int:
    """Bytes of the device buffers this process holds on xla:device_index now
    (jax's live arrays: tensors' values, cached numbers), on every platform,
    XLA:CPU included; what the allocator has reserved beyond them is
    device_info()'s."""
    return runtime.live_bytes(device_index)


def _mib(n) -> str:
    return f"{n / 2**20:.2f} MiB"


def report_lines() -> list:
    """The memory section of txc.metrics.report()."""
    lines = ["memory:"]
    g = last_graph()
    if g:
        for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                  "device_total_bytes", "host_total_bytes", "peak_memory_in_bytes"):
            if k in g:
                lines.append(f"  last_graph.{k}: {g[k]} ({_mib(g[k])})")
    else:
        lines.append("  last_graph: none executed yet")
    d = device_info()
    if d is None:
        lines.append(f"  device: no allocator statistics on {runtime.platform()}")
    else:
        for k in _DEVICE_FIELDS:
            if k in d:
                lines.append(f"  device.{k}: {d[k]}" + ("" if k == "num_allocs" else f" ({_mib(d[k])})"))
    return lines


metrics.add_report_section(report_lines)  # metrics.report() shows the device memory
