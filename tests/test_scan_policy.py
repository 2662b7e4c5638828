"""Scan policies (torch_xla_core/_ops/scan_policy.py): "recompute", "save" and
"offload" give CPU eager's values and gradients; "save" drops the forward's
recomputation from the backward loop; "offload" stacks residuals in host
memory; the policies compile to different graphs; bad policies are refused."""
import copy
import gc

import pytest
import torch
import torch.nn as nn

import torch_xla_core as txc
from torch_xla_core import runtime
from torch_xla_core.scan import scan, scan_layers

from models import MLP, Block

POLICIES = ("recompute", "save", "offload")


@pytest.fixture(autouse=True)
def _nothing_pending():
    gc.collect()
    txc.sync()


def _step(layers, x, policy):
    layers.zero_grad()
    if policy is None:
        h = x
        for layer in layers:
            h = layer(h)
    else:
        h = scan_layers(layers, x, policy=policy)
    loss = h.pow(2).mean()
    loss.backward()
    return loss, [p.grad for p in layers.parameters()]


def _mlp_layer():
    return nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16), nn.Tanh())


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("make,shape", [(_mlp_layer, (4, 16)), (lambda: Block(32, 4), (2, 8, 32))],
                         ids=["mlp", "decoder"])
def test_policy_matches_cpu_eager(dev, policy, make, shape):
    layers = nn.ModuleList([make() for _ in range(3)])
    x = torch.randn(*shape)
    loss_c, g_c = _step(layers, x, None)
    lx = copy.deepcopy(layers).to(dev)
    loss_x, g_x = _step(lx, x.to(dev), policy)
    c0 = txc.metrics.counters().get("compile", 0)
    txc.sync()  # one graph for the loss and every grad (each .cpu() alone would compile its own)
    assert txc.metrics.counters().get("compile", 0) - c0 <= 1
    torch.testing.assert_close(loss_x.cpu(), loss_c.detach(), atol=1e-5, rtol=1e-5)
    for a, b in zip(g_x, g_c):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=1e-4)


def test_policies_agree_exactly_and_differ_in_key(dev):
    lx = nn.ModuleList([_mlp_layer() for _ in range(4)]).to(dev)
    x = torch.randn(4, 16).to(dev)
    keys, results, texts = {}, {}, {}
    for policy in POLICIES:
        loss, g = _step(lx, x, policy)
        keys[policy] = txc.debug.cache_key([loss, *g])
        texts[policy] = txc.debug.stablehlo([loss, *g])
        txc.sync()
        results[policy] = [loss.cpu()] + [t.cpu() for t in g]
    assert len({k.graph for k in keys.values()}) == 3
    for policy in ("save", "offload"):
        for a, b in zip(results[policy], results["recompute"]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    # "save": the backward loop reads the residuals instead of re-running the forward's matmuls
    assert texts["save"].count("stablehlo.dot_general") < texts["recompute"].count("stablehlo.dot_general")
    assert "annotate_device_placement" not in texts["save"]
    # "offload": residuals and carries go to the host in the forward loop and come back in the backward loop
    off = texts["offload"]
    n_host = off.count('_xla_buffer_placement = "pinned_host"')
    n_dev = off.count('_xla_buffer_placement = "device"')
    assert n_host >= 2 and n_dev == n_host


def test_scan_policy_with_carry_and_ys(dev):
    w = torch.randn(3, 3, requires_grad=True)

    def fn(c, x):
        h = torch.tanh(c @ w_ + x)
        return h, h.sin()

    init, xs = torch.randn(2, 3, requires_grad=True), torch.randn(5, 2, 3, requires_grad=True)
    w_ = w
    c, ref = init, []
    for i in range(5):
        c, y = fn(c, xs[i])
        ref.append(y)
    (c.sum() + torch.stack(ref).pow(2).sum()).backward()
    for policy in POLICIES:
        w_ = w.detach().to(dev).requires_grad_()
        i_x = init.detach().to(dev).requires_grad_()
        x_x = xs.detach().to(dev).requires_grad_()
        cx, ys = scan(fn, i_x, x_x, policy=policy)
        (cx.sum() + ys.pow(2).sum()).backward()
        torch.testing.assert_close(cx.cpu(), c.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w_.grad.cpu(), w.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(i_x.grad.cpu(), init.grad, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(x_x.grad.cpu(), xs.grad, atol=1e-4, rtol=1e-4)


def test_policy_training_steps_match_loop(dev):
    layers = nn.ModuleList([MLP(8, 16, 8) for _ in range(3)])
    x = torch.randn(4, 8)
    ref = copy.deepcopy(layers)
    opt_c = torch.optim.SGD(ref.parameters(), lr=0.1)
    lx = copy.deepcopy(layers).to(dev)
    opt_x = torch.optim.SGD(lx.parameters(), lr=0.1)
    for _ in range(2):
        _step(ref, x, None)
        opt_c.step()
        _step(lx, x.to(dev), "save")
        opt_x.step()
        txc.sync()
    for a, b in zip(lx.parameters(), ref.parameters()):
        torch.testing.assert_close(a.cpu(), b.detach(), atol=1e-5, rtol=1e-5)


def test_unknown_policy_is_refused(dev):
    x = torch.zeros(2, 3).to(dev)
    with pytest.raises(ValueError, match=r"scan: unknown policy 'keep'; use 'recompute' .* 'save' .* 'offload'"):
        scan(lambda c, x: (c + x, x), x[0], x, policy="keep")
    with pytest.raises(ValueError, match=r"scan_layers: unknown policy 'remat'"):
        scan_layers([nn.Linear(3, 3).to(dev)], x, policy="remat")


def test_offload_policy_needs_host_memory(dev, monkeypatch):
    monkeypatch.setattr(runtime, "memory_kinds", lambda device_index=0: {"device"})
    x = torch.zeros(2, 3).to(dev)
    with pytest.raises(RuntimeError, match="the cpu devices list no host memory space"):
        scan(lambda c, x: (c + x, x), x[0], x, policy="offload")
