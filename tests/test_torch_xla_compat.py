"""torch_xla's names over torch_xla_core (torch_xla_core/compat/torch_xla,
docs/porting.md): each behaviour pytorch/xla's own tests check of them, in
our own tests, numerics against CPU eager; and the differences issue 44
found (a scan body's exception leaves no trace, uneven sharding, tuple
carries in scan_layers, torch_xla's metric names and units)."""
import pytest
import torch
import torch.nn as nn

import torch_xla_core as txc
from torch_xla_core.scan import scan, scan_layers


# --- a failed scan/scan_layers trace leaves nothing pending ---------------------

class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x) * 2  # body values the traceback's frame holds
        raise RuntimeError(f"layer failed on {tuple(h.shape)}")


def test_exception_in_a_scan_body_leaves_no_pending_body_value(dev):
    def fn(c, x):
        y = (c + x).sin()  # noqa: F841  (held by the frame in the traceback)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        scan(fn, torch.zeros(3, device=dev), torch.ones(4, 3, device=dev))
    held = info.value  # a user's `except` that keeps the exception
    assert held.__traceback__ is not None
    a = torch.arange(4.0, device=dev) * 3
    txc.sync()  # used to raise "a value computed inside a scan body was used outside of it"
    torch.testing.assert_close(a.cpu(), torch.arange(4.0) * 3)
    # the body's tensors the traceback holds say what happened when used
    frame_locals = [tb.tb_frame.f_locals for tb in _tracebacks(held)]
    y = next(v["y"] for v in frame_locals if "y" in v and isinstance(v["y"], torch.Tensor))
    with pytest.raises(RuntimeError, match="inside a scan body whose trace raised ValueError: boom"):
        y.cpu()


def test_exception_in_a_scan_layers_layer_leaves_no_pending_body_value(dev):
    layers = nn.ModuleList([_Raises(), _Raises()]).to(dev)
    x = torch.randn(2, 3).to(dev)
    with pytest.raises(RuntimeError, match=r"layer failed on \(2, 3\)") as info:
        scan_layers(layers, x)
    kept = info.value  # noqa: F841
    w = layers[0].lin.weight * 1  # the layers' own tensors are untouched
    txc.sync()
    torch.testing.assert_close(w.cpu(), layers[0].lin.weight.detach().cpu())
    torch.testing.assert_close(x.cpu() + 1, (x + 1).cpu())


def _tracebacks(exc):
    tb = exc.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


# --- scan_layers with a tuple carry: layer(*x) ---------------------------------

class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x, y):
        return self.a(x) + y, self.b(y) * x


def test_scan_layers_unpacks_a_tuple_carry_into_the_layer_arguments(dev):
    layers = nn.ModuleList([_Two() for _ in range(3)])
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    ref = (x, y)
    for layer in layers:
        ref = layer(*ref)
    out = scan_layers(layers.to(dev), (x.to(dev), y.to(dev)))
    assert isinstance(out, tuple) and len(out) == 2
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.cpu(), r.detach(), atol=1e-5, rtol=1e-5)


# --- the compat layer: torch_xla's module names --------------------------------

import numpy as np  # noqa: E402
from functorch.compile import default_partition, min_cut_rematerialization_partition  # noqa: E402

import torch_xla_core.compat.torch_xla as torch_xla  # noqa: E402
import torch_xla_core.compat.torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla_core.compat.torch_xla.debug.metrics as met  # noqa: E402
import torch_xla_core.compat.torch_xla.debug.profiler as xp  # noqa: E402
import torch_xla_core.compat.torch_xla.distributed.parallel_loader as pl  # noqa: E402
import torch_xla_core.compat.torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla_core.compat.torch_xla.experimental.scan as scan_module  # noqa: E402
import torch_xla_core.compat.torch_xla.experimental.scan_layers as scan_layers_module  # noqa: E402
import torch_xla_core.compat.torch_xla.runtime as xr  # noqa: E402
import torch_xla_core.compat.torch_xla.utils.serialization as xser  # noqa: E402
import torch_xla_core.compat.torch_xla.utils.utils as xu  # noqa: E402
from torch_xla_core.compat.torch_xla.experimental import custom_kernel  # noqa: E402
from multidevice import on_devices  # noqa: E402


def test_devices_and_device_names():
    n = xr.global_runtime_device_count()
    assert torch_xla.device() == torch_xla.device(None) == xm.xla_device() == torch.device("xla:0")
    assert torch_xla.devices() == [torch.device(f"xla:{i}") for i in range(n)]
    assert torch_xla.device_count() == n == len(xm.get_xla_supported_devices())
    assert torch_xla.real_devices() == [f"{xr.device_type()}:{i}" for i in range(n)]
    assert xm.xla_device_hw(torch_xla.device()) == xr.device_type() == "CPU"
    assert xm.is_xla_tensor(torch.ones(1, device="xla")) and not xm.is_xla_tensor(torch.ones(1))
    with pytest.raises(RuntimeError, match="device index 99 is out of range"):
        torch_xla.device(99)


def test_sync_and_step_count_mark_steps_and_run_the_graph():
    met.clear_all()
    a = torch.ones(3, 3, device=torch_xla.device()) * 2
    torch_xla.sync()
    assert met.counter_value("MarkStep") == 1
    with pytest.raises(RuntimeError, match="inside the step"):
        with torch_xla.step():  # syncs on entry and on exit, also when the block raises
            b = a + 1
            raise RuntimeError("inside the step")
    assert met.counter_value("MarkStep") == 3
    assert "MarkStep" in met.counter_names()
    torch.testing.assert_close(b.cpu(), torch.full((3, 3), 3.0))


def test_training_in_steps_with_optimizer_step_matches_cpu():
    torch.manual_seed(0)
    cpu = nn.Linear(10, 10)
    model = nn.Linear(10, 10).to("xla")
    model.load_state_dict(cpu.state_dict())
    opt_c, opt_x = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (cpu, model))
    data = [(torch.randn(4, 10), torch.randn(4, 10)) for _ in range(3)]
    for x, y in data:
        opt_c.zero_grad()
        nn.functional.mse_loss(cpu(x), y).backward()
        opt_c.step()
        with torch_xla.step():
            opt_x.zero_grad()
            nn.functional.mse_loss(model(x.to("xla")), y.to("xla")).backward()
            xm.optimizer_step(opt_x)
    torch.testing.assert_close(model.weight.detach().cpu(), cpu.weight.detach(), atol=1e-5, rtol=1e-5)


def test_compile_runs_the_function_as_one_step_and_full_graph_refuses_host_reads():
    @torch_xla.compile
    def step(x):
        return (x * 2).sum()

    x = torch.arange(4.0)
    assert step(x.to("xla")).item() == 12.0

    @torch_xla.compile(full_graph=True)
    def reads(x):
        y = x * 2
        if y.sum() > 0:  # a host read cuts the step into two graphs
            y = y + 1
        return y

    with pytest.raises(RuntimeError, match="full_graph=True"):
        reads(x.to("xla"))
    seen = []
    torch_xla.launch(lambda index, v: seen.append((index, v)), args=(5,))
    assert seen == [(0, 5)]


def test_metric_data_is_in_nanoseconds_under_torch_xlas_names(dev):
    met.clear_all()
    a = torch.arange(6.0).to(dev)
    torch_xla.sync()
    (a * 3).cpu()
    (a * 3).cpu()  # the same graph again: a cached compile
    ours = txc.metrics.timers()
    for theirs, name in (("CompileTime", "compile"), ("TransferToDeviceTime", "transfer_to_device"),
                         ("TransferFromDeviceTime", "transfer_to_host")):
        count, total_ns, samples = met.metric_data(theirs)
        assert count == ours[name][0] and total_ns == int(ours[name][1] * 1e9)
        assert len(samples) == count and all(v > 0 for _, v in samples)
        assert theirs in met.metric_names()
    assert met.metric_data("ExecuteTime")[0] >= 2
    assert met.counter_value("CachedCompile") >= 1 and met.counter_value("UncachedCompile") >= 1
    report = met.short_metrics_report()
    assert "CompileTime" in report and "ExecuteTime" in report and "CachedCompile" in report
    assert "TotalSamples" in met.metrics_report()
    met.clear_metrics()
    assert met.metric_names() == [] and met.metric_data("CompileTime") is None
    assert met.counter_value("CachedCompile") >= 1
    met.clear_counters()
    assert met.counter_names() == [] and met.counter_value("CachedCompile") is None


def test_fallback_ops_are_counted_as_aten_ops(dev):
    met.clear_all()
    x = torch.tensor([1, 1, 2, 2, 3])
    assert met.executed_fallback_ops() == []
    torch.testing.assert_close(torch.unique_consecutive(x.to(dev)).cpu(), torch.unique_consecutive(x))
    assert met.executed_fallback_ops() == ["aten::unique_consecutive"]
    assert met.counter_value("aten::unique_consecutive") == 1
    assert "aten::unique_consecutive" in met.short_metrics_report(counter_names=["MarkStep"])
    a, b = torch.tensor([12, 18]), torch.tensor([8, 27])  # another namespace's op keeps its own name
    torch.testing.assert_close(torch.ops.prims.gcd(a.to(dev), b.to(dev)).cpu(), torch.ops.prims.gcd(a, b))
    assert met.executed_fallback_ops() == ["aten::unique_consecutive", "prims::gcd"]
    assert met.counter_value("prims::gcd") == 1


def test_python_numbers_read_from_the_device_count_as_local_scalar_dense(dev):
    """torch_xla lists .item() and bool(t) as the fallback aten::_local_scalar_dense."""
    met.clear_all()
    t = torch.tensor(100, device=dev) * 2
    assert met.executed_fallback_ops() == [] and met.counter_value("aten::_local_scalar_dense") is None
    assert t.item() == 200
    if t:
        t += 1
    assert met.executed_fallback_ops() == ["aten::_local_scalar_dense"]
    assert met.counter_value("aten::_local_scalar_dense") == 2
    assert "aten::_local_scalar_dense" in met.short_metrics_report(counter_names=["MarkStep"])


def test_profiler_spans_land_in_the_trace(tmp_path):
    xp.start_trace(str(tmp_path))
    with xp.Trace("my_span"):
        (torch.ones(2, device="xla") + 1).cpu()
    with xp.StepTrace("train", step_num=3):
        pass
    xp.stop_trace()
    import json  # noqa: E402  (stdlib)
    (path,) = tmp_path.glob("txc-trace-*.json")
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert {"my_span", "step 3"} <= names


# --- experimental.scan / scan_layers ---------------------------------------------

def _fn(c, x):
    h = torch.tanh(c @ x)
    return h, h.sum(0)


@pytest.mark.parametrize("partition_fn", [default_partition, min_cut_rematerialization_partition])
def test_scan_takes_torch_xlas_partition_fns_with_the_same_values_and_grads(dev, partition_fn):
    init = torch.randn(3, 3)
    xs_ = torch.randn(4, 3, 3, requires_grad=True)
    c_ref, ys_ref = init, []
    for i in range(4):
        c_ref, y = _fn(c_ref, xs_[i])
        ys_ref.append(y)
    (c_ref.sum() + torch.stack(ys_ref).sum()).backward()
    xx = xs_.detach().to(dev).requires_grad_()
    c, ys = scan_module.scan(_fn, init.to(dev), xx, partition_fn=partition_fn, is_fn_pure=True)
    (c.sum() + ys.sum()).backward()
    torch.testing.assert_close(c.detach().cpu(), c_ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(xx.grad.cpu(), xs_.grad, atol=1e-5, rtol=1e-5)
    assert _fn in scan_module._SCAN_COMPUTATION_CACHE  # is_fn_pure: recorded, as torch_xla does
    scan_module._SCAN_COMPUTATION_CACHE.clear()
    assert _fn not in scan_module._SCAN_COMPUTATION_CACHE


def test_scan_refuses_a_partition_fn_it_cannot_honour(dev):
    with pytest.raises(ValueError, match="partition_fn 'my_partition' is not supported"):
        def my_partition(*a, **k):
            return default_partition(*a, **k)
        scan_module.scan(_fn, torch.zeros(3, 3, device=dev), torch.zeros(2, 3, 3, device=dev),
                         partition_fn=my_partition)


def test_scan_layers_with_torch_xlas_signature(dev):
    layers = [nn.Linear(8, 8) for _ in range(3)]
    x = torch.randn(2, 8)
    ref = x
    for layer in layers:
        ref = layer(ref)
    lx = [nn.Linear(8, 8).to(dev) for _ in range(3)]
    for a, b in zip(lx, layers):
        a.load_state_dict(b.state_dict())
    out = scan_layers_module.scan_layers(lx, x.to(dev), partition_fn=min_cut_rematerialization_partition,
                                         is_layer_pure=True)
    torch.testing.assert_close(out.cpu(), ref.detach(), atol=1e-5, rtol=1e-5)
    assert (id(min_cut_rematerialization_partition), id(lx[0])) in scan_layers_module._ONE_LAYER_CACHE
    assert scan_layers_module.scan_layers([], x) is x


# --- utils ---------------------------------------------------------------------

def test_utils_helpers(monkeypatch):
    monkeypatch.setenv("TXC_TEST_FLAG", "1")
    assert xu.getenv_as("TXC_TEST_FLAG", bool) is True and xu.getenv_as("TXC_TEST_UNSET", int, 7) == 7
    assert xu.check_env_flag("TXC_TEST_FLAG") and not xu.check_env_flag("TXC_TEST_UNSET")
    assert xu.as_list(3) == [3] and xu.as_list([3]) == [3]
    assert list(xu.SampleGenerator("d", 3)) == ["d"] * 3 and len(xu.SampleGenerator("d", 3)) == 3
    tree = {"a": [torch.ones(1), 2], "b": (torch.zeros(1),)}
    out = xu.for_each_instance_rewrite(tree, lambda v: isinstance(v, torch.Tensor), lambda t: t + 1)
    assert out["a"][0].item() == 2 and out["a"][1] == 2 and out["b"][0].item() == 1
    seen = []
    xu.for_each_instance(tree, lambda v: isinstance(v, torch.Tensor), seen.append)
    assert len(seen) == 2


class _Box:
    def __init__(self, inner, peer=None):
        self.inner, self.peer = inner, peer


def test_for_each_instance_walks_keys_objects_and_cycles_once_per_object():
    shared = _Box(["s", 1.5])
    data = {"k": [shared, shared, ("t", 2.5)], 7: _Box({"x": "y"}, shared)}
    data[7].peer.peer = data[7]  # a cycle through objects' attributes
    visited = []
    xu.for_each_instance(data, lambda v: isinstance(v, (str, int, float)), lambda v: visited.append(v))
    # dict keys too; a shared object once; the cycle ends
    assert sorted(map(str, visited)) == sorted(["k", "s", "1.5", "t", "2.5", "7", "x", "y"])
    out = xu.for_each_instance_rewrite(data, lambda v: isinstance(v, str), str.upper)
    assert set(out) == {"K", 7} and out["K"][0] is out["K"][1] and out["K"][0] is not shared
    assert out["K"][0].inner == ["S", 1.5] and out[7].inner == {"X": "Y"} and out[7].peer is out["K"][0]
    assert out[7].peer.peer is out[7] and shared.inner == ["s", 1.5]  # rebuilt, cycles kept, input untouched


def test_send_cpu_data_to_device_rebuilds_data_wrappers(dev):
    class Pack(xu.DataWrapper):
        def __init__(self, pack):
            super().__init__()
            self.pack = pack

        def get_tensors(self):
            return [self.pack.data, self.pack.sorted_indices, self.pack.unsorted_indices]

        def from_tensors(self, tensors):
            return nn.utils.rnn.PackedSequence(tensors[0], self.pack.batch_sizes, tensors[1], tensors[2])

    batch = torch.tensor([[1.0, 2, 3], [4, 5, 0], [6, 0, 0]]).unsqueeze(-1)
    pack = nn.utils.rnn.pack_padded_sequence(batch, [3, 2, 1], batch_first=True)
    moved = xm.send_cpu_data_to_device(Pack(pack), dev)
    assert isinstance(moved, nn.utils.rnn.PackedSequence) and moved.data.device.type == "xla"
    assert moved.batch_sizes.device.type == "cpu"
    torch.testing.assert_close(moved.data.cpu(), pack.data)
    one = xm.send_cpu_data_to_device(torch.ones(2), dev)  # a lone tensor comes back in a list
    assert isinstance(one, list) and one[0].device.type == "xla"
    d = xm.send_cpu_data_to_device({"a": torch.ones(2)}, dev)
    assert isinstance(d, dict) and d["a"].device.type == "xla"


def test_repeat_with_fixed_output_size_truncates_or_fills_without_a_host_read(dev):
    for total, reps in [(20, [0, 1, 2, 0, 4, 0, 6, 7, 8, 9]), (100, [0, 5, 2, 0, 4, 9, 6, 7, 8, 0])]:
        met.clear_all()
        x, r = torch.randn(len(reps)), torch.tensor(reps)
        base = torch.repeat_interleave(x, r)[:total]
        want = torch.cat((base, x[-1].repeat(total - base.shape[0])))
        got = custom_kernel.repeat_with_fixed_output_size(x.to(dev), r.to(dev), total)
        assert got.shape == (total,) and met.executed_fallback_ops() == [] and txc.metrics.counters().get(
            "transfer_to_host") is None
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="one repeat count per element"):
        custom_kernel.repeat_with_fixed_output_size(torch.ones(3, device=dev), torch.ones(2, device=dev), 4)


def test_xser_save_and_load_a_state_dict(dev, tmp_path):
    model = nn.Linear(4, 3)
    xmodel = nn.Linear(4, 3).to(dev)
    xmodel.load_state_dict(model.state_dict())
    xser.save(xmodel.state_dict(), str(tmp_path / "m.pt"))
    loaded = xser.load(str(tmp_path / "m.pt"))
    assert all(v.device.type == "cpu" for v in loaded.values())
    for k, v in model.state_dict().items():
        torch.testing.assert_close(loaded[k], v, rtol=0, atol=0)


# --- distributed.spmd on 4 devices ---------------------------------------------

@on_devices(4)
def test_mesh_checks_and_op_sharding_as_torch_xla():
    mesh = xs.Mesh(np.arange(4), (1, 4), ("data", "model"))
    assert mesh.device_ids.tolist() == [0, 1, 2, 3] and mesh.mesh_shape == (1, 4) and mesh.size() == 4
    assert xs.Mesh(np.arange(4), (2, 2)).axis_names is None
    assert mesh.get_op_sharding((0, 1)) == mesh.get_op_sharding(("data", "model"))
    assert "devices=[1,4]" in mesh.get_op_sharding((0, 1))
    assert mesh.get_logical_mesh().shape == (1, 4) and mesh.get_axis_name_idx("model") == 1
    with pytest.raises(AssertionError, match="must match the global number of devices"):
        xs.Mesh(np.arange(2), (1, 2))
    with pytest.raises(AssertionError, match="Number of axis names"):
        xs.Mesh(np.arange(4), (1, 4), ("a", "b", "c"))
    with pytest.raises(AssertionError, match="Axis names must be unique"):
        xs.Mesh(np.arange(4), (2, 2), ("a", "a"))
    with pytest.raises(AssertionError, match="must match mesh size"):
        xs.Mesh(np.arange(4), (2, 4))
    with pytest.raises(AssertionError, match="Device IDs must be unique"):
        xs.Mesh(np.array([0, 0, 1, 2]), (4,))
    assert xs.get_1d_mesh("x").shape() == {"x": 4}
    assert xs.HybridMesh(ici_mesh_shape=(2, 2), axis_names=("a", "b")).mesh_shape == (2, 2)


@on_devices(4)
def test_mark_sharding_returns_an_xla_sharded_tensor_that_computes_as_cpu():
    torch.manual_seed(0)
    mesh = xs.Mesh(np.arange(4), (1, 4))
    xc = torch.randn(8, 128)
    xt = xc.to("xla")
    xst = xs.mark_sharding(xt, mesh, (0, 1))
    assert isinstance(xst, xs.XLAShardedTensor) and xst.global_tensor is xt
    assert "devices=[1,4]" in xst.sharding_spec and xst.sharding_type == xs.ShardingType.TILED
    lin = nn.Linear(128, 4)
    lx = nn.Linear(128, 4).to("xla")
    lx.load_state_dict(lin.state_dict())
    out = lx(xst)
    assert isinstance(out, xs.XLAShardedTensor) and "XLAShardedTensor" in str(out)
    assert "XLAShardedTensor" not in str(lx(xt))
    torch.testing.assert_close(out.cpu(), lin(xc).detach(), atol=1e-5, rtol=1e-5)
    out.sum().backward()
    lin(xc).sum().backward()
    torch.testing.assert_close(lx.weight.grad.cpu(), lin.weight.grad, atol=1e-4, rtol=1e-4)
    shards = xst.local_shards
    assert [s.data.shape for s in shards] == [(8, 32)] * 4
    for i, s in enumerate(shards):
        assert s.indices == [slice(0, 8, 1), slice(32 * i, 32 * (i + 1), 1)] and s.replica_id == 0
        torch.testing.assert_close(s.data, xc[tuple(s.indices)])
    rep = xs.mark_sharding(torch.arange(4.0).to("xla"), mesh, (None,))
    assert rep.sharding_type == xs.ShardingType.REPLICATED
    assert [s.indices for s in rep.local_shards] == [Ellipsis] * 4 and [s.replica_id for s in rep.local_shards] == [
        0, 1, 2, 3]
    part = xs.mark_sharding(torch.arange(16.0).reshape(4, 4).to("xla"), xs.Mesh(np.arange(4), (2, 2)), (None, 1))
    assert part.sharding_type == xs.ShardingType.PARTIAL
    assert [s.replica_id for s in part.local_shards] == [0, 0, 1, 1]
    plain = xs.clear_sharding(xst)
    assert plain is xt and xs.wrap_if_sharded(xt) is xt
    torch.testing.assert_close(xt.cpu(), xc)


@on_devices(4)
def test_uneven_sharding_pads_the_last_pieces_and_results_equal_cpu():
    mesh = xs.Mesh(np.arange(4), (4,))
    t = torch.arange(5.0)
    xst = xs.mark_sharding(t.to("xla"), mesh, (0,))  # 5 over 4 devices: pieces of 2, the last padded
    shards = xst.local_shards
    assert [s.data.shape for s in shards] == [(2,)] * 4
    assert [s.indices for s in shards] == [[slice(0, 2, 1)], [slice(2, 4, 1)], [slice(4, 5, 1)], [slice(5, 5, 1)]]
    torch.testing.assert_close(shards[2].data, torch.tensor([4.0, 0.0]))
    torch.testing.assert_close(shards[3].data, torch.zeros(2))
    for s in shards:
        torch.testing.assert_close(s.unpadded_data, t[tuple(s.indices)])
    torch.testing.assert_close(xst.cpu(), t)
    m = torch.arange(6.0).reshape(2, 3)
    xm_ = m.to("xla")
    xs.mark_sharding(xm_, xs.Mesh(np.arange(4), (1, 4)), (0, 1))  # dim 1: 3 over 4
    torch.testing.assert_close(((xm_ @ xm_.T).sum(0) + xm_.sum(1)).cpu(), (m @ m.T).sum(0) + m.sum(1))
    xm_.add_(1)  # in place on the padded buffer (not donated), twice
    torch_xla.sync()
    xm_.mul_(2)
    torch_xla.sync()
    torch.testing.assert_close(xm_.cpu(), (m + 1) * 2)
    w = xs.mark_sharding(torch.ones(3, 2).to("xla") * 2, xs.Mesh(np.arange(4), (4, 1)), (0, None))  # pending
    torch.testing.assert_close((w.global_tensor + 1).cpu(), torch.full((3, 2), 3.0))
    xs.clear_sharding(xm_)
    torch.testing.assert_close(xm_.cpu(), (m + 1) * 2)


@on_devices(4)
def test_load_local_shards_replaces_the_pieces_and_keeps_the_layout():
    mesh = xs.Mesh(np.arange(4), (4,))
    t = torch.arange(4.0) + 1
    xt = xs.mark_sharding(t.to("xla"), mesh, (0,))
    spec, shards = xt.sharding_spec, xt.local_shards
    for s in shards:
        s.data *= -1  # torch_xla's idiom: change the CPU piece, then load them all back
    xt.load_local_shards_(shards)
    torch.testing.assert_close(xt.cpu(), -t)
    assert xt.sharding_spec == spec and xt.sharding_type == xs.ShardingType.TILED
    torch.testing.assert_close((xt * 2).cpu(), -2 * t)
    with pytest.raises(RuntimeError, match="3 values given for the 4 pieces"):
        xt.load_local_shards_(shards[:-1])
    for s in shards:
        s.data = torch.randn(2)
    with pytest.raises(RuntimeError, match=r"value 0 is torch.float32 \[2\]; its piece \(device 0\) is "):
        xt.load_local_shards_(shards)
    rep = xs.mark_sharding(t.to("xla"), mesh, (None,))
    with pytest.raises(RuntimeError, match="not split over devices"):
        rep.load_local_shards_(rep.local_shards)
    odd = xs.mark_sharding(torch.arange(5.0).to("xla"), mesh, (0,))  # uneven: the padded pieces are loaded
    pieces = odd.local_shards
    odd.load_local_shards_([type(p)(p.data + 10, p.indices, p.shard_device, p.replica_id) for p in pieces])
    torch.testing.assert_close(odd.cpu(), torch.arange(5.0) + 10)


@on_devices(4)
def test_minibatch_sharding_with_one_process_is_the_global_batch():
    mesh = xs.get_1d_mesh("data")
    batch = torch.arange(32.0).reshape(8, 4)
    loader = pl.MpDeviceLoader([(batch,)], torch_xla.device(),
                               input_sharding=xs.ShardingSpec(mesh, ("data", None), minibatch=True))
    (x,) = next(iter(loader))
    assert txc.sharding.get_sharding(x).partition_spec == ("data", None)
    torch.testing.assert_close(x.cpu(), batch)
    odd = pl.MpDeviceLoader([(batch[:3],)], torch_xla.device(),
                            input_sharding=xs.ShardingSpec(mesh, ("data", None), minibatch=True))
    with pytest.raises(RuntimeError, match="per-host batch size must be divisible by local runtime device count"):
        next(iter(odd))


@on_devices(4)
def test_mark_sharding_with_gradients_and_data_loader_sharding():
    mesh = xs.Mesh(np.arange(4), (4, 1), ("data", "model"))
    a = torch.randn(8, 4, requires_grad=True)
    ax = a.detach().to("xla").requires_grad_()
    b = xs.mark_sharding_with_gradients(ax, mesh, ("data", None))
    assert txc.sharding.get_sharding(ax) is None  # not in place
    (b * b).sum().backward()
    torch.testing.assert_close(ax.grad.cpu(), 2 * a.detach())
    spec = xs.ShardingSpec(mesh, ("data", None))
    (moved,) = xm.send_cpu_data_to_device([torch.arange(8.0).reshape(8, 1)], torch_xla.device(), input_sharding=spec)
    assert "devices=[4,1]" in xs.XLAShardedTensor(moved).sharding_spec
    loader = pl.MpDeviceLoader([torch.arange(16.0).reshape(8, 2)] * 2, torch_xla.device(), input_sharding=spec)
    batches = list(loader)
    assert len(batches) == 2 and "devices=[4,1]" in xs.XLAShardedTensor(batches[0]).sharding_spec
    torch.testing.assert_close(batches[1].cpu(), torch.arange(16.0).reshape(8, 2))


def test_fork_rng_restores_the_xla_rng(dev):
    xm.set_rng_state(7)
    before = torch.rand(4, device=dev).cpu()
    xm.set_rng_state(7)
    with xm.fork_rng():
        xm.set_rng_state(123)
        torch.rand(4, device=dev).cpu()
    torch.testing.assert_close(torch.rand(4, device=dev).cpu(), before)
    assert xm.get_rng_state() == 7


def test_step_closures_run_after_mark_step(dev):
    seen = []
    t = torch.ones(2, device=dev) * 5
    xm.add_step_closure(lambda v: seen.append(v.cpu().tolist()), args=(t,))
    assert seen == []
    xm.mark_step()
    assert seen == [[5.0, 5.0]]


def test_is_fn_pure_reuses_the_trace_whatever_the_closure_holds(dev):
    calls = 0

    def fn(c, x):
        nonlocal calls  # a closure cell that changes on every call
        calls += 1
        return c + x, x * 2

    init, xs_ = torch.zeros(2, device=dev), torch.arange(6.0).reshape(3, 2).to(dev)
    for _ in range(3):
        c, ys = scan_module.scan(fn, init, xs_, partition_fn=min_cut_rematerialization_partition, is_fn_pure=True)
    assert calls == 1
    torch.testing.assert_close(c.cpu(), torch.tensor([6.0, 9.0]))
    torch.testing.assert_close(ys.cpu(), torch.arange(6.0).reshape(3, 2) * 2)
    for _ in range(2):
        scan_module.scan(fn, init, xs_, partition_fn=min_cut_rematerialization_partition)
    assert calls == 3  # not pure: the changed closure cell means a new trace
