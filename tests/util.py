"""Test helpers: run a function on CPU eager and on the xla device, and
compare outputs and gradients."""
import torch
import torch.utils._pytree as pytree

import torch_xla_core as txc


def to_xla(x):
    return pytree.tree_map(lambda t: t.to(txc.device()) if isinstance(t, torch.Tensor) else t, x)


def to_cpu(x):
    return pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, x)


def assert_matches_cpu(fn, *args, grad=None, atol=1e-5, rtol=1e-5, no_fallback=True, equal_nan=False, **kwargs):
    """fn(*args) on CPU and on xla agree (values, dtypes, shapes); with
    floating-point inputs that require grad, so do the gradients of
    sum(outputs * fixed random weights) w.r.t. those inputs. equal_nan: NaNs
    in the same places of the outputs count as equal."""
    before = dict(txc.metrics.fallbacks())
    cpu_args = pytree.tree_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad)
                               if isinstance(t, torch.Tensor) else t, args)
    xla_args = pytree.tree_map(lambda t: t.detach().to(txc.device()).requires_grad_(t.requires_grad)
                               if isinstance(t, torch.Tensor) else t, args)
    out_c = fn(*cpu_args, **kwargs)
    out_x = fn(*xla_args, **kwargs)
    flat_c, _ = pytree.tree_flatten(out_c)
    flat_x, _ = pytree.tree_flatten(out_x)
    assert len(flat_c) == len(flat_x)
    for c, x in zip(flat_c, flat_x):
        if isinstance(c, torch.Tensor):
            assert x.device.type == "xla", f"output on {x.device}"
            torch.testing.assert_close(x.cpu(), c.detach(), atol=atol, rtol=rtol, equal_nan=equal_nan)
        else:
            assert c == x
    leaves = [t for t in pytree.tree_flatten(args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
    if leaves and (grad is None or grad):
        outs_c = [c for c in flat_c if isinstance(c, torch.Tensor) and c.requires_grad]
        outs_x = [x for x in flat_x if isinstance(x, torch.Tensor) and x.requires_grad]
        g = torch.Generator().manual_seed(0)
        ws = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c in outs_c]
        sc = sum((c * w).sum() for c, w in zip(outs_c, ws))
        sx = sum((x * w.to(txc.device())).sum() for x, w in zip(outs_x, ws))
        sc.backward()
        sx.backward()
        ca = [t for t in pytree.tree_flatten(cpu_args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        xa = [t for t in pytree.tree_flatten(xla_args)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        for c, x in zip(ca, xa):
            assert (c.grad is None) == (x.grad is None)
            if c.grad is not None:
                torch.testing.assert_close(x.grad.cpu(), c.grad, atol=atol * 10, rtol=rtol * 10)
    if no_fallback:
        after = txc.metrics.fallbacks()
        new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
        assert not new, f"unexpected CPU fallbacks: {new}"
    return out_x


def assert_scan_layers_match_loop(layers, x, dev, atol=1e-5, grad_atol=None):
    """`layers` (a ModuleList on the CPU) run as an unrolled CPU loop and as
    txc.scan.scan_layers on `dev`: one traced body for all layers; output,
    input gradient and every parameter gradient match; no fallback."""
    from torch_xla_core.scan import clear_cache, scan_layers
    grad_atol = atol if grad_atol is None else grad_atol
    ref_in = x.clone().requires_grad_()
    out_c = ref_in
    for layer in layers:
        out_c = layer(out_c)
    out_c.sum().backward()
    grads_c = [p.grad.clone() for p in layers.parameters()]
    layers_x = layers.to(dev)
    layers_x.zero_grad(set_to_none=True)
    xx = x.to(dev).requires_grad_()
    clear_cache()
    txc.metrics.clear()
    out_x = scan_layers(layers_x, xx)
    assert txc.metrics.counters().get("scan_trace") == 1  # one traced body for every layer
    out_x.sum().backward()
    torch.testing.assert_close(out_x.detach().cpu(), out_c.detach(), atol=atol, rtol=atol)
    torch.testing.assert_close(xx.grad.cpu(), ref_in.grad, atol=atol, rtol=atol)
    for p, g in zip(layers_x.parameters(), grads_c):
        torch.testing.assert_close(p.grad.cpu(), g, atol=grad_atol, rtol=grad_atol)
    assert not txc.metrics.fallbacks()


def opinfo_shard(shards: int, shard: int) -> list:
    """Every `shards`-th op of PyTorch's OpInfo database, from the `shard`-th:
    an OpInfo-wide test parametrized over its shards runs as that many cases,
    which pytest-xdist spreads over its workers (one case would hold one
    worker for minutes at the end of the suite)."""
    from torch.testing._internal.common_methods_invocations import op_db  # lazy: ~1 s, only these tests
    return op_db[shard::shards]
