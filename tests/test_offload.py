"""Host offload (torch_xla_core/_features/offload.py, csrc/ops/placement.cpp): the
placement ops' StableHLO, memory kinds of results and arguments, the cache
key, gradients, offload_activations vs CPU eager, and bad input."""
import copy
import gc

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import offload, runtime
from torch_xla_core._features import offload as offload_impl  # place(): not in the public face
from torch_xla_core.offload import offload_activations, place_to_device, place_to_host

from models import MLP, Block

ANN = '"stablehlo.custom_call"'
TO_HOST = '_xla_buffer_placement = "pinned_host"'
TO_DEV = '_xla_buffer_placement = "device"'


@pytest.fixture(autouse=True)
def _nothing_pending():
    gc.collect()
    txc.sync()


def _annotations(text):
    lines = [ln for ln in text.splitlines() if "annotate_device_placement" in ln]
    return [("host" if TO_HOST in ln else "device") for ln in lines]


def test_placement_ops_lower_to_annotate_device_placement(dev):
    x = torch.randn(4, 3).to(dev)
    h = place_to_host(x * 2)
    y = place_to_device(h) + 1
    text = txc.debug.stablehlo([h, y])
    assert _annotations(text) == ["host", "device"]
    line = next(ln for ln in text.splitlines() if TO_HOST in ln)
    assert ANN in line and 'call_target_name = "annotate_device_placement"' in line
    assert "has_side_effect = true" in line and "mhlo.frontend_attributes" in line
    # h is a result that lives on the host; y on the device
    assert '-> (tensor<4x3xf32> {mhlo.memory_kind = "pinned_host"}, tensor<4x3xf32>)' in text
    txc.sync()
    torch.testing.assert_close(y.cpu(), x.cpu() * 2 + 1)
    torch.testing.assert_close(h.cpu(), x.cpu() * 2)


def test_direction_is_part_of_the_key(dev):
    x = torch.randn(8).to(dev)
    a, b = x * 2, x * 2
    ha, db = place_to_host(a), place_to_device(b)
    assert ha._lt.hash != db._lt.hash
    ka, kb = txc.debug.cache_key([ha]), txc.debug.cache_key([db])
    assert ka.graph != kb.graph
    assert ka.memory == ((), ((0, "pinned_host"),)) and kb.memory == ()
    assert txc.debug.cache_key([x * 2]).memory == ()


def test_host_result_stays_on_host_and_comes_back_when_used(dev):
    x = torch.randn(5, 2).to(dev)
    h = place_to_host(x + 1)
    txc.sync()
    assert offload.memory_kind(h) == "pinned_host"
    assert h._lt.data.sharding.memory_kind == "pinned_host"   # jaxlib's own report of the buffer
    z = h * 3
    assert txc.debug.cache_key([z]).memory == (((0, "pinned_host"),), ())
    text = txc.debug.stablehlo([z])
    assert '%arg0: tensor<5x2xf32> {mhlo.memory_kind = "pinned_host"}' in text
    assert _annotations(text) == ["device"]   # brought to the device before the multiply
    txc.sync()
    assert offload.memory_kind(z) == "device"
    assert z._lt.data.sharding.memory_kind == "device"
    torch.testing.assert_close(z.cpu(), (x.cpu() + 1) * 3)


def test_host_buffer_is_never_donated(dev):
    w = place_to_host(torch.ones(16, 16).to(dev) * 2)
    txc.sync()
    w.add_(1)   # the new value is a device value of the same type
    assert txc.debug.cache_key().aliases == ()
    txc.sync()
    assert w.cpu().eq(3).all()


def test_gradient_passes_through(dev):
    x = torch.randn(6, 4, requires_grad=True)
    xx = x.detach().to(dev).requires_grad_()
    out_c = (x.sin() * 3).sum()
    out_x = (place_to_device(place_to_host(xx.sin())) * 3).sum()
    out_c.backward()
    out_x.backward()
    torch.testing.assert_close(out_x.cpu(), out_c.detach())
    torch.testing.assert_close(xx.grad.cpu(), x.grad)


def _train_grads(model, x, ctx):
    model.zero_grad()
    with ctx:
        loss = model(x).pow(2).mean()
    loss.backward()
    return loss, [p.grad for p in model.parameters()]


class _Null:
    def __enter__(self):
        pass

    def __exit__(self, *a):
        pass


@pytest.mark.parametrize("make,shape", [(lambda: MLP(16, 32, 4), (8, 16)), (lambda: Block(32, 4), (2, 8, 32))])
def test_offload_activations_matches_cpu_eager(dev, make, shape):
    m = make()
    x = torch.randn(*shape)
    loss_c, g_c = _train_grads(m, x, _Null())
    mx = copy.deepcopy(m).to(dev)
    loss_x, g_x = _train_grads(mx, x.to(dev), offload_activations(threshold_bytes=0))
    text = txc.debug.stablehlo([loss_x, *g_x])
    ann = _annotations(text)
    assert ann.count("host") >= 2 and ann.count("device") >= ann.count("host")
    # each round trip (host, then device for the backward) has an optimization barrier between its
    # placements: without it XLA:GPU folds the two copies away (ops/placement.cpp)
    assert text.count("stablehlo.optimization_barrier") == ann.count("host")
    torch.testing.assert_close(loss_x.cpu(), loss_c.detach(), atol=1e-5, rtol=1e-5)
    for a, b in zip(g_x, g_c):
        torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)
    # the same step without offload: the same numbers (up to the order of float operations: XLA:CPU drops the
    # placements but keeps the barriers, which bound its fusions)
    loss_y, g_y = _train_grads(mx, x.to(dev), _Null())
    text_y = txc.debug.stablehlo([loss_y, *g_y])
    assert _annotations(text_y) == [] and "optimization_barrier" not in text_y
    torch.testing.assert_close(loss_y.cpu(), loss_x.cpu(), atol=1e-7, rtol=1e-6)
    for a, b in zip(g_y, g_x):
        torch.testing.assert_close(a.cpu(), b.cpu(), atol=1e-7, rtol=1e-6)


def test_offload_threshold_and_nesting(dev):
    m = MLP(16, 32, 4).to(dev)
    x = torch.randn(8, 16).to(dev)
    # activations here are at most 8*32*4 = 1 KiB (weights 2 KiB): above every tensor, nothing moves
    loss, g = _train_grads(m, x, offload_activations(threshold_bytes=1 << 20))
    assert _annotations(txc.debug.stablehlo([loss, *g])) == []
    txc.sync()
    # the inner context wins: None keeps activations on the device inside an offloading block
    m.zero_grad()
    with offload_activations(threshold_bytes=0):
        with offload_activations(threshold_bytes=None):
            h = m.net[0](x)
        loss = m.net[1:](h).sum()
    loss.backward()
    n_outer = _annotations(txc.debug.stablehlo([loss] + [p.grad for p in m.parameters()])).count("host")
    txc.sync()
    m.zero_grad()
    with offload_activations(threshold_bytes=0):
        loss = m(x).sum()
    loss.backward()
    n_all = _annotations(txc.debug.stablehlo([loss] + [p.grad for p in m.parameters()])).count("host")
    assert 0 < n_outer < n_all


def test_placement_inside_scan(dev):
    def fn(c, x):
        h = place_to_host(c * x)
        return place_to_device(h) + 1, h
    init, xs = torch.randn(3), torch.randn(4, 3)
    c, ys = txc.scan.scan(fn, init.to(dev), xs.to(dev))
    assert _annotations(txc.debug.stablehlo([c, ys])) == ["host", "device"]
    cc, ref = init, []
    for i in range(4):
        ref.append(cc * xs[i])
        cc = ref[-1] + 1
    torch.testing.assert_close(c.cpu(), cc)
    torch.testing.assert_close(ys.cpu(), torch.stack(ref))


# --- bad input ---------------------------------------------------------------

def test_non_xla_tensor_is_refused():
    with pytest.raises(TypeError, match=r"place_to_host: expected a tensor on the xla device, got a tensor on cpu "
                                        r"\(float32\[2, 3\]\); move it with .to\('xla'\)"):
        place_to_host(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="place_to_device: .* got a list"):
        place_to_device([1, 2])


def test_unknown_memory_kind_is_refused(dev):
    x = torch.zeros(2).to(dev)
    with pytest.raises(ValueError, match=r"unknown memory kind 'unpinned'; use 'pinned_host' .* or 'device'"):
        offload_impl.place(x, "unpinned")
    with pytest.raises(RuntimeError, match=r"place: unknown memory kind 'hbm'"):  # the core's own check
        txc._tensor.lazy_op(txc._tensor.OP.place, (x._lt,), ("hbm",))


def test_platform_without_host_memory_is_refused(dev, monkeypatch):
    x = torch.zeros(2).to(dev)
    monkeypatch.setattr(runtime, "memory_kinds", lambda device_index=0: {"device"})
    msg = r"the cpu devices list no host memory space \(their memory kinds: \['device'\]\)"
    with pytest.raises(RuntimeError, match=msg):
        place_to_host(x)
    with pytest.raises(RuntimeError, match=msg):
        with offload_activations():
            pass
    with pytest.raises(ValueError, match="threshold_bytes must be an int >= 0"):
        with offload_activations(threshold_bytes=-1):
            pass


def test_cpu_lists_host_memory():
    assert {"device", "pinned_host"} <= runtime.memory_kinds()


def test_a_cached_executable_keeps_its_outputs_memory_kinds_and_dtypes(dev):
    """runtime._outputs: the first run of an executable builds its outputs
    through jaxlib's general path and keeps a result handler per output;
    later runs build them through those handlers. Both give the same
    shapes, dtypes, memory kinds and values."""
    from torch_xla_core import runtime

    def step(x, n):
        return place_to_host(x + 1), (x * 2).to(torch.bfloat16), n + 1

    seen = []
    for i in range(3):  # the same graph three times: one compile, then two cached runs
        x = torch.full((4, 3), float(i)).to(dev)
        n = torch.tensor([i, 7], dtype=torch.int64).to(dev)
        outs = step(x, n)
        txc.sync()
        seen.append([(t._lt.data.shape, t._lt.data.dtype, t._lt.data.sharding.memory_kind) for t in outs])
        torch.testing.assert_close(outs[0].cpu(), torch.full((4, 3), i + 1.0))
        torch.testing.assert_close(outs[1].cpu(), torch.full((4, 3), 2.0 * i, dtype=torch.bfloat16))
        assert outs[2].cpu().tolist() == [i + 1, 8]
    assert seen[0] == seen[1] == seen[2]
    assert [m for _, _, m in seen[0]] == ["pinned_host", "device", "device"]
    assert str(seen[0][2][1]) == "int64"
    exe = txc.executor._last
    assert runtime._handlers[id(exe)][0] is exe  # later runs went through the kept handlers
