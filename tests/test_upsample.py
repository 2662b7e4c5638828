"""Interpolation on xla (F.interpolate / nn.Upsample): forward and the
gradient (torch_xla_core/_ops/upsample.py) match CPU eager for every mode,
antialiased ones included, with no CPU fallback; a training step compiles
once."""
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
