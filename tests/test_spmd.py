"""GSPMD sharding on 8 CPU devices (in a child process:
tests/multidevice.py): Mesh, mark_sharding, propagation (get_sharding),
local_shards, clear_sharding, the emitted StableHLO, compile counts, and a
data- and tensor-parallel training step against CPU eager."""
import re

import pytest
import torch

import torch_xla_core as txc
import torch_xla_core.sharding as xs
from torch_xla_core._execution import spmd as _spmd
from torch_xla_core import executor, metrics
from multidevice import on_devices

pytestmark = pytest.mark.xdist_group("devices8")  # one child process per module


def _mesh():
    return xs.Mesh(range(8), (4, 2), ("data", "model"))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@on_devices(8)
def test_bad_mesh_and_spec_are_refused_before_compiling():
    with pytest.raises(ValueError, match=r"6 device ids do not fill mesh_shape \(4, 2\)"):
        xs.Mesh(range(6), (4, 2))
    with pytest.raises(ValueError, match=r"device ids \[8, 9\] are not devices: this process has 8"):
        xs.Mesh([0, 1, 8, 9], (2, 2))
    with pytest.raises(ValueError, match="name a device twice"):
        xs.Mesh([0, 0], (2,))
    mesh = _mesh()
    t = torch.ones(8, 6, device="xla")
    with pytest.raises(ValueError, match=r"has 1 entries but the tensor has 2 dimensions"):
        xs.mark_sharding(t, mesh, ("data",))
    with pytest.raises(ValueError, match=r"unknown mesh axis 'rows'.*\['data', 'model'\]"):
        xs.mark_sharding(t, mesh, ("rows", None))
    with pytest.raises(ValueError, match="used twice"):
        xs.mark_sharding(t, mesh, ("model", "model"))
    with pytest.raises(ValueError, match="expected an xla tensor"):
        xs.mark_sharding(torch.ones(8, 6), mesh, ("data", None))
    assert xs.get_sharding(t) is None  # nothing was changed


@on_devices(8)
def test_device_data_is_sharded_not_copied_everywhere():
    a = torch.randn(8, 6)
    t = a.to("xla")
    xs.mark_sharding(t, _mesh(), ("data", None))
    shards = xs.local_shards(t)
    assert [s.device for s in shards] == list(range(8))
    assert all(s.shape == (2, 6) for s in shards)  # a quarter per device, replicated over "model"
    assert shards[2].index[0] == slice(2, 4)
    s = xs.get_sharding(t)
    assert s.mesh == _mesh() and s.partition_spec == ("data", None)
    torch.testing.assert_close(t.cpu(), a)  # .cpu() gathers
    # axis indices and tuples of axes, as torch_xla takes them
    xs.mark_sharding(t, _mesh(), ((0, 1), None))  # resharding an existing tensor
    assert [s.shape for s in xs.local_shards(t)] == [(1, 6)] * 8
    assert xs.get_sharding(t).partition_spec == (("data", "model"), None)
    torch.testing.assert_close(t.cpu(), a)
    xs.mark_sharding(t, _mesh(), (None, None))  # replicated: every device holds all of it
    assert [s.shape for s in xs.local_shards(t)] == [(8, 6)] * 8
    xs.clear_sharding(t)
    assert xs.get_sharding(t) is None and len(xs.local_shards(t)) == 1
    torch.testing.assert_close((t * 2).cpu(), a * 2)


@on_devices(8)
def test_mesh_over_a_subset_of_devices_1d():
    mesh = xs.Mesh([7, 6, 5, 4], (4,), ("x",))
    a = torch.randn(8, 3)
    t = a.to("xla")
    xs.mark_sharding(t, mesh, ("x", None))
    assert [s.device for s in xs.local_shards(t)] == [4, 5, 6, 7]
    assert xs.local_shards(t)[-1].index[0] == slice(0, 2)  # device 7 holds the first rows
    y = (t.exp() * 2).sum(1)
    text = txc.debug.stablehlo([y])
    assert "mhlo.num_partitions = 4 : i32" in text
    assert xs.get_sharding(y).partition_spec == ("x",)  # propagated to the output
    torch.testing.assert_close(y.cpu(), (a.exp() * 2).sum(1))


@on_devices(8)
def test_annotation_of_a_pending_value_is_in_the_graph():
    a, w = torch.randn(8, 4), torch.randn(4, 6)
    x, ww = a.to("xla"), w.to("xla")
    xs.mark_sharding(ww, _mesh(), (None, "model"))
    y = x @ ww
    xs.mark_sharding(y, _mesh(), ("data", None))  # pending: annotated, not computed
    assert not y._lt.is_data
    z = torch.tanh(y)
    text = txc.debug.stablehlo([z])
    assert re.search(r'stablehlo.custom_call.*call_target_name = "Sharding".*'
                     r'mhlo.sharding = "\{devices=\[4,1,2\]<=\[8\] last_tile_dim_replicate\}"', text)
    assert 'mhlo.sharding = "{devices=[1,2,4]<=[4,2]T(1,0) last_tile_dim_replicate}"' in text  # ww's argument
    assert "mhlo.num_partitions = 8 : i32" in text
    # the annotation is part of the graph's hash
    y2 = x @ ww
    assert txc.debug.cache_key([torch.tanh(y2)]).graph != txc.debug.cache_key([z]).graph
    assert xs.get_sharding(z).partition_spec == ("data", None)
    torch.testing.assert_close(z.cpu(), torch.tanh(a @ w), rtol=1e-5, atol=1e-6)


@on_devices(8)
def test_meshes_over_different_devices_in_one_graph_are_refused():
    a = torch.ones(4, 2, device="xla")
    b = torch.ones(4, 2, device="xla")
    xs.mark_sharding(a, xs.Mesh([0, 1, 2, 3], (4,), ("x",)), ("x", None))
    xs.mark_sharding(b, xs.Mesh([4, 5, 6, 7], (4,), ("x",)), ("x", None))
    with pytest.raises(RuntimeError, match="two different meshes"):
        (a + b).cpu()


def _train(model, opt, steps, shard_input=None):
    losses = []
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
        if shard_input is not None:
            x, y = x.to("xla"), y.to("xla")
            shard_input(x)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if shard_input is not None:
            txc.sync()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("layout", ["data_parallel", "tensor_parallel"])
@on_devices(8)
def test_mlp_training_step_matches_cpu(layout):
    torch.manual_seed(0)
    ref = MLP()
    model = MLP()
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    mesh = _mesh()
    if layout == "tensor_parallel":  # Megatron-style: fc1 split by rows, fc2 by columns
        xs.mark_sharding(model.fc1.weight, mesh, ("model", None))
        xs.mark_sharding(model.fc1.bias, mesh, ("model",))
        xs.mark_sharding(model.fc2.weight, mesh, (None, "model"))
    ref_losses = _train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    executor.clear_cache()
    metrics.clear()
    compiles = []

    def shard_batch(x):
        xs.mark_sharding(x, mesh, ("data", None))
        compiles.append(metrics.counters().get("compile", 0))

    losses = _train(model, opt, 4, shard_batch)
    compiles.append(metrics.counters().get("compile", 0))
    # step 1 (no optimizer state yet) and step 2 (with it) compile; later steps reuse step 2's
    assert compiles == [0, 1, 2, 2, 2]
    assert executor.last_memory_stats()["alias_size_in_bytes"] > 0  # the old parameters were donated
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=name)
    spec = xs.get_sharding(model.fc1.weight).partition_spec
    assert spec == (("model", None) if layout == "tensor_parallel" else (None, None))


@on_devices(8)
def test_grad_sharding_is_propagated_and_stablehlo_carries_shardings():
    model = MLP().to("xla")
    mesh = _mesh()
    xs.mark_sharding(model.fc1.weight, mesh, ("model", None))
    x = torch.randn(8, 16).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    model(x).sum().backward()
    text = txc.debug.stablehlo()
    assert "mhlo.num_partitions = 8 : i32" in text
    assert 'mhlo.sharding = "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"' in text  # the batch
    assert 'mhlo.sharding = "{devices=[2,1,4]<=[4,2]T(1,0) last_tile_dim_replicate}"' in text  # fc1.weight
    assert 'mhlo.sharding = "{replicated}"' in text  # the rest
    txc.sync()
    g = xs.get_sharding(model.fc1.weight.grad)
    assert g.mesh == mesh and g.partition_spec == ("model", None)  # chosen by XLA, like its weight
    assert [s.shape for s in xs.local_shards(model.fc1.weight.grad)] == [(16, 16)] * 8
    assert txc.debug.cache_key([model.fc1.weight]).spmd is None  # nothing pending


@on_devices(8)
def test_donated_parameter_keeps_its_layout_when_propagation_prefers_another():
    # fc1.bias is replicated; propagation from fc2.weight's split would shard its update, but a donated
    # buffer's output must lie as the parameter does (XLA refused the alias before the result was pinned)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 8))
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 8))
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    mesh = xs.Mesh(range(4), (2, 2), ("a", "b"))
    xs.mark_sharding(model[0].weight, mesh, ("a", "b"))
    xs.mark_sharding(model[1].weight, mesh, (None, "b"))
    x = torch.randn(2, 4)
    opt, ref_opt = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(ref.parameters(), lr=1e-2)
    ref(x).sum().backward()
    ref_opt.step()
    model(x.to("xla")).sum().backward()
    opt.step()
    text = txc.debug.stablehlo()
    assert re.search(r'%arg\d+: tensor<6xf32> \{tf.aliasing_output = (\d+) : i32, '
                     r'mhlo.sharding = "\{replicated\}"', text)
    pinned, propagate = _spmd.pin_aliased_outputs(text)
    assert propagate.count(False) == 4  # the four donated parameters' results
    results = _spmd._MAIN.search(pinned).group(4)  # @main's result types
    assert results.count('{mhlo.sharding = "{replicated}"}') == 2  # fc1.bias, fc2.bias
    assert results.count('{mhlo.sharding = "{devices=[2,2]<=[4]}"}') == 1  # fc1.weight
    txc.sync()
    assert executor.last_memory_stats()["alias_size_in_bytes"] > 0
    assert [s.shape for s in xs.local_shards(model[0].bias)] == [(6,)] * 4
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


@on_devices(8)
def test_two_graphs_with_the_same_inputs_keep_their_own_output_layouts():
    mesh = _mesh()
    a = torch.randn(8, 8)
    x = a.to("xla")
    xs.mark_sharding(x, mesh, (None, "model"))
    y = x * 2
    xs.mark_sharding(y, mesh, ("data", "model"))
    y.cpu()  # graph 1: one output laid out ("data", "model")
    z = x.sum(0)  # graph 2: the same input and output count, another layout
    torch.testing.assert_close(z.cpu(), a.sum(0))
    assert xs.get_sharding(y).partition_spec == ("data", "model")
    assert xs.get_sharding(z).partition_spec != ("data", "model")


@on_devices(8)
def test_mark_sharding_inside_scan_and_scan_layers_bodies():
    from torch_xla_core.scan import scan, scan_layers
    mesh = _mesh()
    w, xs_, init = torch.randn(8, 8), torch.randn(3, 4, 8), torch.randn(4, 8)
    W = w.clone().to("xla").requires_grad_()
    xs.mark_sharding(W, mesh, (None, "model"))  # a sharded input: the graph is partitioned

    def fn(c, x):
        h = c @ W + x
        xs.mark_sharding(h, mesh, ("data", "model"))  # pending inside the body: an annotation in the loop
        return torch.tanh(h), h.sum(1)

    c, ys = scan(fn, init.to("xla"), xs_.to("xla"))
    text = txc.debug.stablehlo([c, ys])
    body = text[text.index("stablehlo.while"):]
    assert 'call_target_name = "Sharding"' in body and 'mhlo.sharding = "{devices=[4,2]<=[8]}"' in body
    assert "mhlo.num_partitions = 8 : i32" in text
    (c.sum() + ys.sum()).backward()
    txc.sync()
    wr = w.clone().requires_grad_()
    rc, ry = init, []
    for i in range(3):
        h = rc @ wr + xs_[i]
        rc = torch.tanh(h)
        ry.append(h.sum(1))
    (rc.sum() + torch.stack(ry).sum()).backward()
    torch.testing.assert_close(c.cpu(), rc.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ys.cpu(), torch.stack(ry).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(W.grad.cpu(), wr.grad, rtol=1e-4, atol=1e-5)
    assert xs.get_sharding(W.grad) is not None  # computed on the mesh

    # scan_layers: the annotation in each layer's forward, the layers' weights sharded
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
    ref = xs_[0]
    for layer in layers:
        ref = torch.relu(layer(ref))

    class Sharded(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            y = self.layer(x)
            xs.mark_sharding(y, mesh, ("data", None))
            return torch.relu(y)

    mods = torch.nn.ModuleList([Sharded(layer) for layer in layers]).to("xla")
    for m in mods:
        xs.mark_sharding(m.layer.weight, mesh, ("model", None))
    out = scan_layers(mods, xs_[0].to("xla"))
    assert 'call_target_name = "Sharding"' in txc.debug.stablehlo([out])
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)


@on_devices(8)
def test_annotation_only_inside_a_scan_body_partitions_the_graph():
    from torch_xla_core.scan import scan
    mesh = _mesh()
    w, init, xs_ = torch.randn(8, 8), torch.randn(4, 8), torch.randn(3, 4, 8)
    W = w.to("xla")  # nothing sharded outside the body

    def fn(c, x):
        h = c @ W + x
        xs.mark_sharding(h, mesh, ("data", "model"))
        return torch.tanh(h), h.sum(1)

    c, ys = scan(fn, init.to("xla"), xs_.to("xla"))
    text = txc.debug.stablehlo([c, ys])
    assert "mhlo.num_partitions = 8 : i32" in text  # the body's annotation decides the mesh
    assert 'mhlo.sharding = "{devices=[4,2]<=[8]}"' in text[text.index("stablehlo.while"):]
    executor.clear_cache()
    metrics.clear()
    txc.sync()
    assert metrics.counters().get("compile", 0) == 1
    rc, ry = init, []
    for i in range(3):
        h = rc @ w + xs_[i]
        rc = torch.tanh(h)
        ry.append(h.sum(1))
    torch.testing.assert_close(c.cpu(), rc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ys.cpu(), torch.stack(ry), rtol=1e-5, atol=1e-5)
    assert xs.get_sharding(c) is not None  # computed on the mesh, not on one device


@on_devices(8)
def test_annotation_only_inside_a_nested_scan_body_partitions_the_graph():
    from torch_xla_core.scan import scan
    mesh = _mesh()
    w, init, xs_ = torch.randn(8, 8), torch.randn(4, 8), torch.randn(2, 3, 4, 8)
    W = w.to("xla")

    def inner(c, x):
        h = c @ W + x
        xs.mark_sharding(h, mesh, ("data", "model"))  # the only sharding: two loops deep
        return torch.tanh(h), h.sum(1)

    c, ys = scan(lambda c, x: scan(inner, c, x), init.to("xla"), xs_.to("xla"))
    text = txc.debug.stablehlo([c, ys])
    assert "mhlo.num_partitions = 8 : i32" in text and text.count("stablehlo.while") == 2
    rc, ry = init, []
    for i in range(2):
        for j in range(3):
            h = rc @ w + xs_[i, j]
            rc = torch.tanh(h)
            ry.append(h.sum(1))
    torch.testing.assert_close(c.cpu(), rc, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ys.cpu(), torch.stack(ry).reshape(2, 3, 4), rtol=1e-5, atol=1e-5)
    assert xs.get_sharding(c).partition_spec == ("data", "model")


@on_devices(8)
def test_scan_layers_weights_sharded_only_inside_the_body():
    import copy

    from torch_xla_core.scan import scan_layers
    mesh = _mesh()
    torch.manual_seed(0)
    layers = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(3)])
    x = torch.randn(4, 8)

    class Sharded(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, h):
            # the body's slice of the stacked weights: the only sharding in the program
            xs.mark_sharding(self.layer.weight, mesh, ("model", None))
            return torch.relu(self.layer(h))

    mods = torch.nn.ModuleList([Sharded(copy.deepcopy(layer)) for layer in layers]).to("xla")
    ref = x
    for layer in layers:
        ref = torch.relu(layer(ref))
    ref.sum().backward()
    out = scan_layers(mods, x.to("xla"))
    text = txc.debug.stablehlo([out])
    assert "mhlo.num_partitions = 8 : i32" in text
    body = text[text.index("stablehlo.while"):]
    # the weight [8, 8] split in 2 over "model" (rows), replicated over "data"
    assert re.search(r'call_target_name = "Sharding".*mhlo\.sharding = "\{devices=\[2,1,4\]<=\[4,2\]T\(1,0\) '
                     r'last_tile_dim_replicate\}".*tensor<8x8xf32>', body)
    assert all(xs.get_sharding(m.layer.weight) is None for m in mods)  # outside the body: untouched
    executor.clear_cache()
    metrics.clear()
    out.sum().backward()
    txc.sync()
    assert metrics.counters().get("compile", 0) == 1  # forward and backward: one partitioned graph
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
    for m, layer in zip(mods, layers):
        torch.testing.assert_close(m.layer.weight.grad.cpu(), layer.weight.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.layer.bias.grad.cpu(), layer.bias.grad, rtol=1e-5, atol=1e-5)
    assert xs.get_sharding(out) is not None
