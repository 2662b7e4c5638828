"""Interpolation on xla (F.interpolate / nn.Upsample): forward and the
gradient (torch_xla_core/_ops/upsample.py) match CPU eager for every mode,
antialiased ones included, with no CPU fallback; a training step compiles
once. Grid sampling (F.grid_sample, _ops/nn_grads.py) in bf16: coordinates,
indices and weights computed in float32, as CPU."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc


@pytest.mark.parametrize("shape,kw", [
    ((1, 2, 5), dict(scale_factor=2, mode="nearest")),
    ((1, 2, 5), dict(size=7, mode="linear", align_corners=False)),
    ((1, 2, 5), dict(size=9, mode="nearest-exact")),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="nearest")),
    ((2, 3, 4, 5), dict(size=(7, 3), mode="bilinear", align_corners=True)),
    ((2, 3, 4, 5), dict(scale_factor=1.5, mode="bilinear")),
    ((1, 2, 6, 6), dict(size=(9, 4), mode="bicubic")),
    ((1, 2, 5, 5), dict(scale_factor=0.5, mode="nearest")),
    ((1, 1, 3, 4, 5), dict(scale_factor=2, mode="trilinear")),
    ((1, 1, 3, 4, 5), dict(size=(2, 5, 7), mode="nearest")),
    ((1, 2, 8, 8), dict(size=(3, 5), mode="bilinear", antialias=True)),
    ((1, 2, 8, 8), dict(size=(12, 5), mode="bicubic", antialias=True)),
], ids=lambda p: str(p) if not isinstance(p, dict) else p["mode"] + ("_aa" if p.get("antialias") else ""))
def test_interpolate_forward_and_grad_match_cpu(shape, kw):
    torch.manual_seed(0)
    x = torch.randn(shape)
    a, b = x.clone().requires_grad_(), x.clone().to(txc.device()).requires_grad_()
    before = dict(txc.metrics.fallbacks())
    ya, yb = F.interpolate(a, **kw), F.interpolate(b, **kw)
    w = torch.randn(ya.shape)
    (ya * w).sum().backward()
    (yb * w.to(txc.device())).sum().backward()
    torch.testing.assert_close(yb.detach().cpu(), ya.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad.cpu(), a.grad, atol=1e-5, rtol=1e-5)
    assert dict(txc.metrics.fallbacks()) == before


def test_upsample_training_step_compiles_once():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 2, 3, padding=1), torch.nn.Upsample(scale_factor=2, mode="bilinear"))
    m = m.to(txc.device())
    x = torch.randn(1, 2, 4, 4).to(txc.device())

    def step():
        m(x).square().mean().backward()
        txc.sync()                                # computes the grads (upsample's backward)
        m.zero_grad(set_to_none=True)

    step()
    misses = txc.metrics.counters().get("cache_miss", 0)
    step()
    assert txc.metrics.counters().get("cache_miss", 0) == misses


def _errors(f, *args):
    """max |xla - float64| and max |cpu - float64| of f's output and of the
    gradients of sum(output * w), all from the same bf16 inputs."""
    g = torch.Generator().manual_seed(1)
    res = []
    for dev, dt in (("cpu", torch.float64), ("cpu", None), (txc.device(), None)):
        xs = [a.detach().to(dev, dt or a.dtype).requires_grad_() for a in args]
        y = f(*xs)
        w = torch.randn(y.shape, generator=g if not res else torch.Generator().manual_seed(1)).to(y.dtype)
        grads = torch.autograd.grad((y * w.to(y.device)).sum(), xs)
        res.append([t.detach().cpu().double() for t in (y, *grads)])
    ref, cpu, xla = res
    return ([float((a - r).abs().max()) for a, r in zip(xla, ref)],
            [float((a - r).abs().max()) for a, r in zip(cpu, ref)])


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_3d_bf16(mode):
    # 8*8*8 positions: flat gather indices past 256 are not integers in bf16
    # (the gather's indices went out of range at the sync)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 8, 8, 8, generator=g).bfloat16()
    grid = (torch.rand(1, 3, 4, 5, 3, generator=g) * 2.2 - 1.1).bfloat16()
    ours, cpu = _errors(lambda x, gr: F.grid_sample(x, gr, mode=mode, align_corners=False), x, grid)
    assert ours[0] <= cpu[0] + 1e-6 and ours[1] <= cpu[1] + 1e-6, (ours, cpu)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_2d_bf16_coordinates_in_float32(padding_mode):
    # coordinates unnormalized in bf16 put samples off by up to 0.5 here (CPU's
    # bf16 kernel does that: it is the less accurate one in this test)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 50, generator=g).bfloat16()
    grid = (torch.rand(2, 6, 7, 2, generator=g) * 2.2 - 1.1).bfloat16()
    f = lambda x, gr: F.grid_sample(x, gr, padding_mode=padding_mode, align_corners=False)  # noqa: E731
    ours, cpu = _errors(f, x, grid)
    assert ours[0] <= cpu[0] + 1e-6 and ours[1] <= max(cpu[1], 2e-2), (ours, cpu)
    y = f(x.to(txc.device()), grid.to(txc.device()))
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu(), f(x.float(), grid.float()).bfloat16(), atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("padding_mode", ["border", "reflection"])
def test_grid_sample_grad_at_the_border(dims, padding_mode):
    # grid points exactly on the border (common in bf16): torch's kernels give
    # the clipped coordinate gradient 0 there; torch.clamp's passes it
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, *([4] * dims), generator=g, requires_grad=True)
    grid = torch.rand(1, *([3] * dims), dims, generator=g) * 2 - 1
    grid.view(-1)[::3] = 1.0
    grid.view(-1)[1::5] = -1.0
    grid.requires_grad_()
    f = lambda x, gr: F.grid_sample(x, gr, padding_mode=padding_mode, align_corners=True)  # noqa: E731
    w = torch.randn(f(x, grid).shape, generator=g)
    cpu = torch.autograd.grad((f(x, grid) * w).sum(), [x, grid])
    d = txc.device()
    xd, gd = x.detach().to(d).requires_grad_(), grid.detach().to(d).requires_grad_()
    ours = torch.autograd.grad((f(xd, gd) * w.to(d)).sum(), [xd, gd])
    for a, c in zip(ours, cpu):
        torch.testing.assert_close(a.cpu(), c, atol=1e-5, rtol=1e-5)
