"""Fake quantization (quantization-aware training: torch.ao.quantization's
FakeQuantize, torch.fake_quantize_per_tensor_affine / _per_channel_affine)
as elementwise device ops, with ATen's arithmetic:

    q    = zero_point + round_half_even(x * (1 / scale))     (float32)
    out  = (clamp(q, quant_min, quant_max) - zero_point) * scale
    mask = quant_min <= q <= quant_max                        (the backward: grad * mask)

Half-precision inputs compute in float32. The tensor-qparams variant (what
FakeQuantize calls) keeps x unchanged where fake_quant_enabled[0] < 1,
decided on the device (no host read)."""
import torch

from . import aten, impl


def _fake_quant(x, scale, zero_point, quant_min, quant_max):
    if quant_min > quant_max:
        raise RuntimeError(f"fake_quantize: quant_min ({quant_min}) must not exceed quant_max ({quant_max})")
    xf = x.float()
    inv_scale = 1.0 / (scale.float() if isinstance(scale, torch.Tensor) else torch.tensor(scale, dtype=torch.float32))
    if isinstance(inv_scale, torch.Tensor) and inv_scale.device != xf.device:
        inv_scale = inv_scale.to(xf.device)
    zp = zero_point.float() if isinstance(zero_point, torch.Tensor) else float(zero_point)
    q = torch.round(xf * inv_scale) + zp  # round half to even, as std::nearbyint
    out = (q.clamp(quant_min, quant_max) - zp) * scale
    mask = (q >= quant_min) & (q <= quant_max)
    return out.to(x.dtype), mask


@impl(aten.fake_quantize_per_tensor_affine_cachemask.default)
def per_tensor(x, scale, zero_point, quant_min, quant_max):
    return _fake_quant(x, float(torch.tensor(scale, dtype=torch.float32)), zero_point, quant_min, quant_max)


@impl(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def per_tensor_qparams(x, scale, zero_point, fake_quant_enabled, quant_min, quant_max):
    out, mask = _fake_quant(x, scale.reshape(()), zero_point.reshape(()), quant_min, quant_max)
    on = fake_quant_enabled.reshape(-1)[0] >= 1
    return torch.where(on, out, x), mask | ~on


@impl(aten.fake_quantize_per_channel_affine_cachemask.default)
def per_channel(x, scale, zero_point, axis, quant_min, quant_max):
    if scale.dim() != 1 or scale.numel() != x.shape[axis] or zero_point.numel() != scale.numel():
        raise RuntimeError(f"fake_quantize_per_channel_affine: scale and zero_point must be 1-D with "
                           f"{x.shape[axis]} elements (dim {axis} of the input), got {tuple(scale.shape)} and "
                           f"{tuple(zero_point.shape)}")
    shape = [1] * x.dim()
    shape[axis] = -1
    return _fake_quant(x, scale.float().reshape(shape), zero_point.reshape(shape), quant_min, quant_max)
