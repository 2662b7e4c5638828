"""call_jax: a JAX function inlined into the lazy graph as one node; numerics
vs CPU eager and vs jax itself, gradients through jax.vjp, inside scan,
64-bit dtypes, the lowering cache, and errors."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core.kernels import call_jax
from torch_xla_core.scan import scan, scan_layers


def _f(x, y, *, scale):
    return jnp.sin(x) @ y * scale, jnp.sum(x)


def _torch_f(x, y, scale):
    return torch.sin(x) @ y * scale, x.sum()


def test_matches_cpu_and_jax(dev):
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    a, b = call_jax(_f, x.to(dev), y.to(dev), scale=2.0)
    ra, rb = _torch_f(x, y, 2.0)
    torch.testing.assert_close(a.cpu(), ra)
    torch.testing.assert_close(b.cpu(), rb)
    ja, jb = _f(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()), scale=2.0)
    np.testing.assert_allclose(a.cpu().numpy(), np.asarray(ja), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(b.cpu().numpy(), np.asarray(jb), rtol=1e-6, atol=1e-6)


def test_one_node_in_the_graph_and_no_host_round_trip(dev):
    x, y = torch.randn(2, 3).to(dev), torch.randn(3, 4).to(dev)
    a, _ = call_jax(_f, x + 1, y, scale=3.0)
    text = txc.debug.stablehlo(a * 2)
    assert text.count("func.call") == 1 and "_main" in text
    assert "callback" not in text
    before = txc.metrics.counters().get("transfer_to_host", 0)
    (a * 2).cpu()
    assert txc.metrics.counters().get("transfer_to_host", 0) == before + 1  # only the result


def test_gradients_match_cpu(dev):
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    xr, yr = x.to(dev).requires_grad_(), y.to(dev).requires_grad_()
    a, b = call_jax(_f, xr, yr, scale=2.0)
    (a.square().sum() + 3 * b).backward()
    xc, yc = x.clone().requires_grad_(), y.clone().requires_grad_()
    ac, bc = _torch_f(xc, yc, 2.0)
    (ac.square().sum() + 3 * bc).backward()
    torch.testing.assert_close(xr.grad.cpu(), xc.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(yr.grad.cpu(), yc.grad, atol=1e-5, rtol=1e-5)


def test_gradient_with_unused_output_and_integer_argument(dev):
    def g(x, idx):
        return jnp.take(x, idx, axis=0) * 2.0, idx + 1
    x = torch.randn(5, 3)
    idx = torch.tensor([4, 0, 0], dtype=torch.int32)
    xr = x.to(dev).requires_grad_()
    out, idx1 = call_jax(g, xr, idx.to(dev))
    assert not idx1.requires_grad and torch.equal(idx1.cpu(), idx + 1)
    out.sum().backward()
    xc = x.clone().requires_grad_()
    (xc[idx.long()] * 2.0).sum().backward()
    torch.testing.assert_close(xr.grad.cpu(), xc.grad)


def test_int64_and_float64_are_not_truncated(dev):
    i = torch.arange(6).reshape(2, 3)
    r = call_jax(lambda t: t * 3_000_000_000, i.to(dev))
    assert r.dtype == torch.int64 and torch.equal(r.cpu(), i * 3_000_000_000)
    d = torch.tensor([1.0 + 2.0 ** -40], dtype=torch.float64)
    r = call_jax(lambda t: t * 1.0, d.to(dev))
    assert r.dtype == torch.float64 and r.cpu().item() == d.item()


def _body_fn(a, b):
    return jnp.tanh(a @ b)


def test_inside_scan_forward_and_backward(dev):
    w = torch.randn(3, 3) * 0.5
    init = torch.randn(2, 3)

    def run(c0, wt, use_jax):
        def body(c, x):
            c2 = call_jax(_body_fn, c, wt) if use_jax else torch.tanh(c @ wt)
            return c2 + x, c2.sum()
        return scan(body, c0, torch.ones(4, 1, 3, device=c0.device) * 0.1) if use_jax else _eager_scan(body, c0)

    def _eager_scan(body, c):
        ys = []
        for _ in range(4):
            c, y = body(c, torch.full((1, 3), 0.1))
            ys.append(y)
        return c, torch.stack(ys)

    wx, ix = w.to(dev).requires_grad_(), init.to(dev).requires_grad_()
    c, ys = run(ix, wx, True)
    (c.sum() + ys.sum()).backward()
    wc, ic = w.clone().requires_grad_(), init.clone().requires_grad_()
    cc, ysc = run(ic, wc, False)
    (cc.sum() + ysc.sum()).backward()
    torch.testing.assert_close(c.cpu(), cc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ys.cpu(), ysc, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wx.grad.cpu(), wc.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ix.grad.cpu(), ic.grad, atol=1e-5, rtol=1e-5)


def test_inside_scan_layers(dev):
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4) * 0.3)

        def forward(self, x):
            return call_jax(_body_fn, x, self.w) if x.device.type == "xla" else torch.tanh(x @ self.w)

    layers = torch.nn.ModuleList([Layer() for _ in range(3)])
    x = torch.randn(2, 4)
    ref = x
    for layer in layers:
        ref = layer(ref)
    out = scan_layers(layers.to(dev), x.to(dev))
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_lowering_is_cached_and_no_recompile(dev):
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    txc.executor.clear_cache()  # count this test's compiles only
    for _ in range(3):
        a, _ = call_jax(_f, x.to(dev), y.to(dev), scale=5.0)
        a.cpu()
    c = txc.metrics.counters()
    assert c["call_jax_lower"] == 1 and c["call_jax_cache_hit"] == 2
    assert c["compile"] == 1
    call_jax(_f, x.to(dev), y.to(dev), scale=6.0)[0].cpu()  # another static value: another lowering
    assert txc.metrics.counters()["call_jax_lower"] == 2


def test_different_functions_never_share_a_cache_entry(dev):
    x = torch.randn(3).to(dev)
    a = call_jax(lambda t: t + 1, x)
    b = call_jax(lambda t: t * 10, x)  # maybe the same id() as a's lambda: the text differs, so the hash does
    torch.testing.assert_close(b.cpu(), x.cpu() * 10)
    torch.testing.assert_close(a.cpu(), x.cpu() + 1)


def test_pallas_interpret_kernel_stays_in_graph(dev):
    from jax.experimental import pallas as pl

    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2.0 + 1.0

    def double(x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)

    x = torch.randn(8, 128)
    out = call_jax(double, x.to(dev))
    assert "callback" not in txc.debug.stablehlo(out)
    torch.testing.assert_close(out.cpu(), x * 2 + 1)


def test_errors(dev):
    with pytest.raises(TypeError, match="on cpu, not on the xla device"):
        call_jax(_f, torch.randn(2, 3), torch.randn(3, 4).to(dev), scale=1.0)
    with pytest.raises(TypeError, match="static arguments must be hashable"):
        call_jax(_f, torch.randn(2, 3).to(dev), torch.randn(3, 4).to(dev), scale=[1.0])

    def noisy(x):
        jax.debug.print("x={x}", x=x)
        return x

    with pytest.raises(RuntimeError, match="host callbacks"):
        call_jax(noisy, torch.randn(2).to(dev))
