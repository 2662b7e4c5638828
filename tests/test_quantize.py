"""Quantization-aware training on xla: fake quantization (per tensor, per
channel, torch.ao's FakeQuantize module with its observer) matches CPU in
the forward and the straight-through backward, with no CPU fallback. The
x86/fbgemm qconfig's fused observer (_fused_moving_avg_obs_fq_helper, whose
CPU kernel reads its flags and statistics on the host) is a counted CPU
fallback that writes its statistics back: same results, slower."""
import copy

import pytest
import torch

import torch_xla_core as txc


def _no_fallback(fn):
    before = dict(txc.metrics.fallbacks())
    out = fn()
    assert dict(txc.metrics.fallbacks()) == before, "fell back to the CPU"
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fake_quantize_per_tensor_and_channel(dev, dtype):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 6, generator=g) * 4).to(dtype)
    x[0, :3] = torch.tensor([0.25, 0.75, -0.25])  # ties: round half to even (x / scale = 2.5, 7.5, -2.5)
    scale, zp = torch.rand(6, generator=g) * 0.2 + 0.05, torch.randint(-3, 3, (6,), dtype=torch.int32, generator=g)
    for f in (lambda t, s, z: torch.fake_quantize_per_tensor_affine(t, 0.1, 2, -8, 7),
              lambda t, s, z: torch.fake_quantize_per_channel_affine(t, s, z, 1, -8, 7)):
        xc = x.clone().requires_grad_()
        want = f(xc, scale, zp)
        want.backward(torch.arange(24.0).reshape(4, 6).to(dtype))
        xx = x.to(dev).requires_grad_()
        got = _no_fallback(lambda: f(xx, scale.to(dev), zp.to(dev)))
        got.backward(torch.arange(24.0).reshape(4, 6).to(dtype).to(dev))
        assert torch.equal(got.cpu(), want)
        assert torch.equal(xx.grad.cpu(), xc.grad)  # straight through inside [min, max], 0 outside


@pytest.mark.parametrize("qconfig", ["default", "x86"])
def test_qat_step_with_fake_quantize_modules(dev, qconfig):
    """A QAT-prepared model (torch.ao.quantization.prepare_qat: observers + FakeQuantize on weights
    and activations) trains two steps like CPU: loss, gradients, observer statistics."""
    aq = torch.ao.quantization
    torch.manual_seed(0)
    model = torch.nn.Sequential(aq.QuantStub(), torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4),
                                aq.DeQuantStub())
    model.qconfig = aq.default_qat_qconfig if qconfig == "default" else aq.get_default_qat_qconfig(qconfig)
    cpu = aq.prepare_qat(model.train())
    xla = copy.deepcopy(cpu).to(dev)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    before = dict(txc.metrics.fallbacks())
    for m, d in ((cpu, "cpu"), (xla, dev)):
        for _ in range(2):
            m.zero_grad()
            loss = m(x.to(d)).square().mean()
            loss.backward()
        m.loss = loss
    fell_back = {k for k, v in txc.metrics.fallbacks().items() if v != before.get(k, 0)}
    assert fell_back == (set() if qconfig == "default" else {"_fused_moving_avg_obs_fq_helper"})
    torch.testing.assert_close(xla.loss.cpu(), cpu.loss, rtol=1e-5, atol=1e-6)
    for (n, p), (_, q) in zip(cpu.named_parameters(), xla.named_parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6, msg=lambda s: f"{n}: {s}")
    for (n, b), (_, c) in zip(cpu.named_buffers(), xla.named_buffers()):
        torch.testing.assert_close(c.cpu(), b, rtol=1e-5, atol=1e-6, msg=lambda s: f"{n}: {s}")


def test_fake_quantize_refuses_bad_qparams(dev):
    x = torch.randn(2, 3, device=dev)
    with pytest.raises(RuntimeError):
        torch.fake_quantize_per_tensor_affine(x, 0.1, 0, 7, -8)
    with pytest.raises(RuntimeError, match="per_channel"):
        torch.fake_quantize_per_channel_affine(x, torch.ones(2, device=dev), torch.zeros(2, dtype=torch.int32,
                                                                                        device=dev), 1, -8, 7)
