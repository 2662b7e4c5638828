"""torch.einsum of two xla tensors is one dot_general (forward, and each
gradient), matching CPU; other equations keep torch's decomposition. The
einsum-based patched nn.Linear (torch_xla's XLAPatchedLinear) matches
nn.Linear and emits no reshape or transpose of its operands."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import metrics
from torch_xla_core.patched_linear import XLAPatchedLinear, apply_xla_patch_to_nn_linear

DEV = txc.device()

CASES = [
    ("bij,bjk->bik", (2, 3, 4), (2, 4, 5), 1),
    ("...n,mn->...m", (2, 3, 8), (4, 8), 1),
    ("ij,kj", (3, 4), (5, 4), 1),                      # implicit output
    ("bhqd,bhkd->bhqk", (2, 2, 3, 4), (2, 2, 5, 4), 1),
    ("i,j->ij", (3,), (4,), 1),                         # outer product
    ("ij,jk->", (2, 3), (3, 4), 1),                     # full contraction
    ("abc,cd->da", (2, 3, 4), (4, 5), 1),               # a lone label (b) summed first, permuted output
    ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5), 1),
    ("ii,ij->j", (3, 3), (3, 4), 0),                    # a diagonal: torch's decomposition
    ("bij,jk->bik", (1, 3, 4), (4, 5), 1),
    ("bij,bjk->bik", (1, 3, 4), (2, 4, 5), 0),          # size-1 broadcasting: torch's decomposition
]


@pytest.mark.parametrize("eq,sa,sb,dots", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_cpu_with_one_dot_per_product(eq, sa, sb, dots):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(sa, generator=g, requires_grad=True), torch.randn(sb, generator=g, requires_grad=True)
    xa, xb = (t.detach().to(DEV).requires_grad_() for t in (a, b))
    r, xr = torch.einsum(eq, a, b), torch.einsum(eq, xa, xb)
    if dots:
        hlo = txc.debug.stablehlo([xr])
        assert hlo.count("stablehlo.dot_general") == 1
        assert "stablehlo.reshape" not in hlo
    w = torch.randn(r.shape, generator=g)
    (r * w).sum().backward()
    metrics.clear()
    (xr * w.to(DEV)).sum().backward()
    if dots:
        assert txc.debug.stablehlo([xa.grad]).count("stablehlo.dot_general") == 1
        assert txc.debug.stablehlo([xb.grad]).count("stablehlo.dot_general") == 1
    torch.testing.assert_close(xr.cpu(), r)
    torch.testing.assert_close(xa.grad.cpu(), a.grad)
    torch.testing.assert_close(xb.grad.cpu(), b.grad)
    assert metrics.fallbacks() == {}


@pytest.mark.parametrize("eq", ["binh,tnh->bnit", "bij,bjk->bik"])
def test_einsum_result_views_can_be_written_in_place(eq):
    """A view of the result may be modified in place, as on CPU (transformers' Funnel does
    `attn = reshape(einsum(...))[..., :n]; attn *= mask`); the result must not be a custom
    Function's view output, which autograd refuses to modify in place."""
    g = torch.Generator().manual_seed(0)
    la, lb = eq.split("->")[0].split(",")
    sizes = dict(b=2, i=3, n=2, h=4, t=5, j=4, k=3)
    a = torch.randn([sizes[c] for c in la], generator=g, requires_grad=True)
    b = torch.randn([sizes[c] for c in lb], generator=g, requires_grad=True)
    xa, xb = (t.detach().to(DEV).requires_grad_() for t in (a, b))
    outs = []
    for u, v in ((a, b), (xa, xb)):
        r = torch.einsum(eq, u, v)
        assert r.stride() == torch.einsum(eq, a.detach(), b.detach()).stride()
        view = r[..., 1:]
        view *= 2.0
        (r * r).sum().backward()
        outs.append(r)
    torch.testing.assert_close(outs[1].detach().cpu(), outs[0].detach())
    torch.testing.assert_close(xa.grad.cpu(), a.grad)
    torch.testing.assert_close(xb.grad.cpu(), b.grad)


def test_einsum_errors_are_torchs():
    a, b = torch.randn(2, 3), torch.randn(4, 5)
    with pytest.raises(RuntimeError) as cpu:
        torch.einsum("ij,jk->ik", a, b)
    with pytest.raises(RuntimeError) as xla:
        torch.einsum("ij,jk->ik", a.to(DEV), b.to(DEV))
    assert str(xla.value) == str(cpu.value)


def _pair(bias=True):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 4, bias=bias)
    xla = torch.nn.Linear(8, 4, bias=bias).to(DEV)
    xla.load_state_dict(cpu.state_dict())
    return cpu, apply_xla_patch_to_nn_linear(xla)


@pytest.mark.parametrize("bias", [True, False])
def test_patched_linear_matches_nn_linear(bias):
    cpu, xla = _pair(bias)
    x = torch.randn(2, 3, 8, requires_grad=True)
    xx = x.detach().to(DEV).requires_grad_()
    cpu(x).square().sum().backward()
    y = xla(xx)
    hlo = txc.debug.stablehlo([y])
    assert "stablehlo.transpose" not in hlo and "stablehlo.reshape" not in hlo
    y.square().sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad)
    torch.testing.assert_close(xla.weight.grad.cpu(), cpu.weight.grad)
    if bias:
        torch.testing.assert_close(xla.bias.grad.cpu(), cpu.bias.grad)
    for t in (xx.grad, xla.weight.grad):  # the forward product (for square's grad) and the gradient's
        hlo = txc.debug.stablehlo([t])
        assert hlo.count("stablehlo.dot_general") == 2
        assert "stablehlo.transpose" not in hlo and "stablehlo.reshape" not in hlo


def test_patched_linear_autocasts_its_product():
    _, xla = _pair()
    x = torch.randn(2, 3, 8, device=DEV, requires_grad=True)
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = xla(x)
    assert "xbf16>) -> tensor<2x3x4xbf16>" in txc.debug.stablehlo([y])  # a bf16 dot_general
    y.sum().backward()
    assert xla.weight.grad.dtype == torch.float32 and x.grad.dtype == torch.float32


def test_patch_leaves_other_modules():
    class Own(torch.nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), Own(3, 3), torch.nn.ReLU())
    apply_xla_patch_to_nn_linear(model)
    assert model[0].forward.__func__.__name__ == "xla_patched_nn_linear_forward"
    assert "forward" not in vars(model[1]) and "forward" not in vars(model[2])
    assert XLAPatchedLinear.apply  # the Function users call directly
