"""Memory statistics (torch_xla_core/_features/memory.py): the last graph's compiled
statistics, host bytes of offloaded results, the device's allocator
statistics (None on CPU), and the memory section of metrics.report()."""
import gc

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import memory, runtime
from torch_xla_core.offload import place_to_host


@pytest.fixture(autouse=True)
def _nothing_pending():
    gc.collect()
    txc.sync()


def test_last_graph_reports_compiled_statistics(dev):
    x = torch.randn(128, 64).to(dev)
    y = (x @ x.T).relu()
    txc.sync()
    g = memory.last_graph()
    for k in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
              "host_argument_size_in_bytes", "host_output_size_in_bytes", "device_total_bytes", "host_total_bytes"):
        assert k in g and isinstance(g[k], int), k
    assert g["argument_size_in_bytes"] >= 128 * 64 * 4
    assert g["output_size_in_bytes"] >= 128 * 128 * 4
    assert g["device_total_bytes"] == (g["argument_size_in_bytes"] + g["output_size_in_bytes"]
                                       + g["temp_size_in_bytes"] - g["alias_size_in_bytes"])
    torch.testing.assert_close(y.cpu(), (x.cpu() @ x.cpu().T).relu(), atol=1e-4, rtol=1e-4)


def test_last_graph_sees_donation(dev):
    w = torch.ones(64, 64).to(dev)
    w.mul_(2)
    txc.sync()
    assert memory.last_graph()["alias_size_in_bytes"] == 64 * 64 * 4


def test_host_output_is_host_memory(dev):
    x = torch.randn(32, 32).to(dev)
    h = place_to_host(x * 2)
    txc.sync()
    # XLA:CPU counts host-space results in the ordinary sizes; the buffer itself reports its kind
    assert h._lt.data.sharding.memory_kind == "pinned_host"
    assert memory.last_graph()["output_size_in_bytes"] >= 32 * 32 * 4


def test_device_info_is_the_allocator_statistics_or_none():
    # None exactly where the platform reports no statistics (XLA:CPU), else
    # PJRT's own numbers as ints, bytes_in_use among them
    st = runtime.devices()[0].memory_stats()
    d = memory.device_info()
    if not st:
        assert d is None
    else:
        assert d == {k: int(v) for k, v in st.items() if isinstance(v, (int, float))}
        assert d["bytes_in_use"] >= 0
    if runtime.platform() == "cpu":
        assert d is None  # XLA:CPU has no allocator statistics: report_lines says so


def test_metrics_report_has_memory_section(dev):
    x = torch.randn(8).to(dev)
    (x + 1).sum()
    txc.sync()
    r = txc.metrics.report()
    assert "memory:" in r and "last_graph.argument_size_in_bytes" in r and "last_graph.device_total_bytes" in r
    assert ("device.bytes_in_use" in r) or ("no allocator statistics on cpu" in r)


def test_live_bytes_counts_the_buffers_tensors_hold(dev):
    """Every platform: a computed tensor's buffer counts while the tensor
    lives; a value an in-place op replaced counts no more once synced."""
    gc.collect()
    txc.sync()
    before = memory.live_bytes()
    x = torch.randn(256, 256).to(dev)
    y = x + x  # (no Python number: numbers are buffers too, cached)
    txc.sync()
    nbytes = x.numel() * x.element_size()
    both = memory.live_bytes()
    assert both - before >= 2 * nbytes
    del x
    gc.collect()
    assert both - memory.live_bytes() == nbytes
    y.add_(y)
    txc.sync()  # y's new value took its old buffer (donated) or replaced it: one buffer either way
    assert both - memory.live_bytes() == nbytes
