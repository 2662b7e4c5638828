"""Neural-network aten ops -> fused core ops (csrc/ops/nn.cpp): softmax and
log_softmax, layer norm, RMS norm, nll loss (so cross_entropy), scaled
dot-product attention, embedding, mse, bce-with-logits and multilabel margin
losses, each forward and backward.

Two composite ops never reach __torch_dispatch__ on their own (torch
decomposes them above it, into many small ops); they get xla kernels at the
AutogradPrivateUse1 key instead:
- `scaled_dot_product_attention` -> `_scaled_dot_product_fused_attention_overrideable`
  (torch's autograd formula calls its `_backward`); 2 ops traced forward+backward
  instead of ~50 for the math path. dropout_p > 0 keeps the math path; calls
  the flash kernel takes may go to kernels.flash_attention instead
  (kernels/attention.py: set_sdpa_kernel, TXC_SDPA_KERNEL).
- `rms_norm` -> an autograd.Function over the fused `rms_norm` core ops
  (also the handlers of `_fused_rms_norm` and its backward)."""
import math

import torch

from .._runtime.dtypes import code
from .._tracing import checks as _checks
from .. import metrics
from .._tracing.tensor import OP, XlaTensor, lazy_op, wrapped_op
from . import aten, decomposed, impl
from .dtype_rules import INTEGRAL, INTEGRAL_PROMOTED
from ..kernels import attention as kernels

_F32 = torch.float32
_HALF = (torch.float16, torch.bfloat16)


# ---- softmax -----------------------------------------------------------------
_SM, _SMB = OP.softmax, OP.softmax_backward


def _half_to_float(name, x, half_to_float):
    if not half_to_float:
        return x.dtype
    if x.dtype not in _HALF:
        raise RuntimeError(f"{name}: conversion is supported for Half type only")
    return _F32


@impl(aten._softmax.default)
def _softmax(x, dim, half_to_float):
    return wrapped_op(_SM, (x,), (dim, 0, code(_half_to_float("softmax", x, half_to_float)), 0))


@impl(aten._log_softmax.default)
def _log_softmax(x, dim, half_to_float):
    return wrapped_op(_SM, (x,), (dim, 1, code(_half_to_float("log_softmax", x, half_to_float)), 0))


@impl(aten.softmax.int)
def softmax_int(x, dim, dtype=None):
    return wrapped_op(_SM, (x,), (dim, 0, code(dtype or x.dtype), 0))


@impl(aten.log_softmax.int)
def log_softmax_int(x, dim, dtype=None):
    return wrapped_op(_SM, (x,), (dim, 1, code(dtype or x.dtype), 0))


@impl(aten._safe_softmax.default)
def _safe_softmax(x, dim, dtype=None):
    return wrapped_op(_SM, (x,), (dim, 0, code(dtype or x.dtype), 1))


@impl(aten._softmax_backward_data.default)
def _softmax_backward_data(grad, out, dim, input_dtype):
    return wrapped_op(_SMB, (grad, out), (dim, 0, code(input_dtype)))


@impl(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad, out, dim, input_dtype):
    return wrapped_op(_SMB, (grad, out), (dim, 1, code(input_dtype)))


# ---- layer norm ----------------------------------------------------------------
_LN, _LNB = OP.layer_norm, OP.layer_norm_backward


def _norm_axis(x, normalized_shape, weight=None):
    n = len(normalized_shape)
    axis = x.dim() - n
    if n == 0 or axis < 0 or tuple(x.shape[axis:]) != tuple(normalized_shape):
        shape = list(normalized_shape)
        raise RuntimeError(f"Given normalized_shape={shape}, expected input with shape [*, {', '.join(map(str, shape))}]"
                           f", but got input of size{list(x.shape)}")
    return axis


@impl(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axis = _norm_axis(x, normalized_shape)
    ops = (x,)
    if weight is not None:
        ops += (weight,)
    if bias is not None:
        ops += (bias,)
    hw, hb = weight is not None, bias is not None
    eps = float(eps)
    return (wrapped_op(_LN, ops, (axis, eps, 0, hw, hb)), wrapped_op(_LN, ops, (axis, eps, 1, hw, hb)),
            wrapped_op(_LN, ops, (axis, eps, 2, hw, hb)))


@impl(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    axis = _norm_axis(x, normalized_shape)
    ops = (grad, x, mean, rstd)
    hw = weight is not None
    if hw:
        ops += (weight,)
    gi = wrapped_op(_LNB, ops, (axis, 0, hw, code(x.dtype))) if output_mask[0] else None
    gw = wrapped_op(_LNB, ops, (axis, 1, hw, code(weight.dtype))) if output_mask[1] and hw else None
    gb = (wrapped_op(_LNB, ops, (axis, 2, hw, code(bias.dtype))) if output_mask[2] and bias is not None
          else None)
    return gi, gw, gb


# ---- RMS norm ------------------------------------------------------------------
_RMS, _RMSB = OP.rms_norm, OP.rms_norm_backward


def _rms_eps(x, eps):
    return float(torch.finfo(x.dtype).eps if eps is None else eps)


@impl(aten._fused_rms_norm.default)
def _fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    axis = _norm_axis(x, normalized_shape)
    eps = _rms_eps(x, eps)
    hw = weight is not None
    ops = (x, weight) if hw else (x,)
    return wrapped_op(_RMS, ops, (axis, eps, 0, hw)), wrapped_op(_RMS, ops, (axis, eps, 1, hw))


@impl(aten._fused_rms_norm_backward.default)
def _fused_rms_norm_backward(grad, x, normalized_shape, rstd, weight, output_mask):
    axis = _norm_axis(x, normalized_shape)
    hw = weight is not None
    ops = (grad, x, rstd) + ((weight,) if hw else ())
    gi = wrapped_op(_RMSB, ops, (axis, 0, hw, code(x.dtype))) if output_mask[0] else None
    gw = wrapped_op(_RMSB, ops, (axis, 1, hw, code(weight.dtype))) if output_mask[1] and hw else None
    return gi, gw


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        out, rstd = _fused_rms_norm(x, normalized_shape, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.normalized_shape = normalized_shape
        return out

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        gi, gw = _fused_rms_norm_backward(grad, x, ctx.normalized_shape, rstd, weight, ctx.needs_input_grad[:2])
        return gi, gw, None, None


def _rms_norm_kernel(x, normalized_shape, weight=None, eps=None):
    normalized_shape = tuple(normalized_shape)
    if torch.is_grad_enabled() and (x.requires_grad or (weight is not None and weight.requires_grad)):
        return _RMSNorm.apply(x, weight, normalized_shape, eps)
    return _fused_rms_norm(x, normalized_shape, weight, eps)[0]


# ---- nll loss ------------------------------------------------------------------
_NLL, _NLLB = OP.nll_loss, OP.nll_loss_backward


@impl(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
@_checks.staged
def nll_loss_forward(x, target, weight, reduction, ignore_index):
    if isinstance(target, XlaTensor) and target.dtype in (torch.int64, torch.int32):
        c = x.shape[1] if x.dim() > 1 else x.shape[0]
        t = target._lt
        bad = lazy_op(OP.logical_and, (_checks.out_of_range(t, 0, c), lazy_op(OP.ne, (t, int(ignore_index)), ())), ())
        _checks.require(bad, f"nll_loss: a target class is out of bounds: targets must lie in [0, {c}) "
                             f"or be ignore_index ({ignore_index})")
    ops = (x, target) + ((weight,) if weight is not None else ())
    a = (int(reduction), int(ignore_index))
    hw = weight is not None
    return wrapped_op(_NLL, ops, a + (0, hw)), wrapped_op(_NLL, ops, a + (1, hw))


@impl(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad, x, target, weight, reduction, ignore_index, total_weight):
    ops = (grad, x, target, total_weight) + ((weight,) if weight is not None else ())
    return wrapped_op(_NLLB, ops, (int(reduction), int(ignore_index), weight is not None))


# ---- scaled dot-product attention ------------------------------------------------
_SDPA, _SDPAB = OP.sdpa, OP.sdpa_backward
_EMPTY_I64 = code(torch.int64)


def _sdpa_kernel(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if is_causal and attn_mask is not None:
        raise RuntimeError("scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True")
    if not enable_gqa:
        q, k, v = _sdpa_broadcast(q, k, v)
    if kernels.sdpa_route(q, k, v, attn_mask, dropout_p, enable_gqa):
        metrics.counter_add("sdpa_flash")
        return kernels.flash_attention(q, k, v, causal=is_causal, sm_scale=_scale(q, scale))
    if dropout_p > 0:
        return aten._scaled_dot_product_attention_math(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                                                       enable_gqa=enable_gqa)[0]
    return aten._scaled_dot_product_fused_attention_overrideable(q, k, v, attn_mask, 0.0, is_causal, False,
                                                                 scale=scale)[0]


def _sdpa_broadcast(q, k, v):
    """torch broadcasts the batch dims (all but the last two) of q, k and v
    against each other (a multi-query model passes k/v with one head, Falcon
    does): expand them to the common shape (views; autograd sums the grads
    back), or raise torch's kind of error naming the shapes."""
    bq, bk, bv = q.shape[:-2], k.shape[:-2], v.shape[:-2]
    if bq == bk == bv:
        return q, k, v
    try:
        b = torch.broadcast_shapes(bq, bk, bv)
    except RuntimeError:
        hint = (f" (query has {q.shape[-3]} heads and key/value {k.shape[-3]}: pass enable_gqa=True for "
                f"grouped-query attention)" if q.dim() >= 3 and k.dim() == q.dim() else "")
        raise RuntimeError(f"scaled_dot_product_attention: the batch dims of query {list(q.shape)}, key "
                           f"{list(k.shape)} and value {list(v.shape)} do not broadcast{hint}") from None
    return (q.expand(*b, *q.shape[-2:]), k.expand(*b, *k.shape[-2:]), v.expand(*b, *v.shape[-2:]))


def _scale(q, scale):
    return float(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)


@impl(aten._scaled_dot_product_fused_attention_overrideable.default)
def sdpa_fused(q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    if dropout_p > 0:
        raise RuntimeError("_scaled_dot_product_fused_attention_overrideable: dropout_p > 0 is not supported on "
                           "the xla device (scaled_dot_product_attention uses its math path for dropout)")
    hm = attn_bias is not None
    ops = (q, k, v) + ((attn_bias,) if hm else ())
    a = (_scale(q, scale), bool(is_causal))
    out = wrapped_op(_SDPA, ops, a + (0, hm))
    lse = wrapped_op(_SDPA, ops, a + (1, hm))
    e = wrapped_op(OP.full, (), (0.0, _EMPTY_I64, [0]))
    return out, lse, e, e, q.shape[-2], k.shape[-2], e, e, e


@impl(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_fused_backward(grad, q, k, v, attn_bias, grad_input_mask, out, lse, cum_seq_q, cum_seq_k, max_q, max_k,
                        dropout_p, is_causal, philox_seed, philox_offset, *, scale=None):
    hm = attn_bias is not None
    ops = (q, k, v, grad, out, lse) + ((attn_bias,) if hm else ())
    a = (_scale(q, scale), bool(is_causal))
    r = [wrapped_op(_SDPAB, ops, a + (i, hm)) if grad_input_mask[i] else None for i in range(3)]
    r.append(wrapped_op(_SDPAB, ops, a + (3, hm)) if hm and grad_input_mask[3] and attn_bias.is_floating_point()
             else None)
    return tuple(r)


# torch's CPU flash-attention op, called directly (F.scaled_dot_product_attention on
# xla never reaches it): output [B, H, L, E] and logsumexp [B, H, L] (float32 for
# half inputs) on every torch in range, the same core op. On torch 2.14 torch's
# decomposition of it returns the attention weights [B, H, L, S] as the logsumexp,
# which fed its CPU-fallback backward (grads 1e16 off; bf16: a dtype error).
_FOR_CPU = "scaled_dot_product_attention_flash_attention"


def _for_cpu_args(q, k, v, dropout_p, attn_mask):
    """The CPU kernel's refusals, with its messages."""
    if dropout_p > 0:
        raise RuntimeError(f"{_FOR_CPU}: Currently do not support dropout > 0")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise RuntimeError(f"{_FOR_CPU}: Accept only 4 dims inputs shape of {{B, H, T, K}}")
    if not q.shape[3] == k.shape[3] == v.shape[3]:
        raise RuntimeError(f"{_FOR_CPU}: Q/K/V should have the same head size")
    if attn_mask is not None and attn_mask.dtype not in (_F32, q.dtype):
        raise RuntimeError(f"{_FOR_CPU}: Attention mask is the same data type as query")
    return (q, k, v) + ((attn_mask,) if attn_mask is not None else ())


@impl(aten._scaled_dot_product_flash_attention_for_cpu.default)
def sdpa_for_cpu(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    ops = _for_cpu_args(q, k, v, dropout_p, attn_mask)
    a = (_scale(q, scale), bool(is_causal))
    masked = attn_mask is not None
    return wrapped_op(_SDPA, ops, a + (0, masked)), wrapped_op(_SDPA, ops, a + (1, masked))


@impl(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def sdpa_for_cpu_backward(grad, q, k, v, out, lse, dropout_p, is_causal, *, attn_mask=None, scale=None):
    q, k, v, *m = _for_cpu_args(q, k, v, dropout_p, attn_mask)
    ops = (q, k, v, grad, out, lse, *m)
    a = (_scale(q, scale), bool(is_causal))
    return tuple(wrapped_op(_SDPAB, ops, a + (i, attn_mask is not None)) for i in range(3))


# ---- embedding, losses -------------------------------------------------------------
_EMB = OP.embedding


@impl(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    r = wrapped_op(_EMB, (weight, indices), ())
    if isinstance(indices, XlaTensor):
        _checks.require(_checks.out_of_range(indices._lt, 0, weight.shape[0]),
                        f"embedding: index out of range in self: indices must lie in [0, {weight.shape[0]})")
    return r


@impl(aten.mse_loss.default)
def mse_loss(x, target, reduction=1):
    return wrapped_op(OP.mse_loss, (x, target), (int(reduction),))


@impl(aten.mse_loss_backward.default)
def mse_loss_backward(grad, x, target, reduction):
    return wrapped_op(OP.mse_loss_backward, (grad, x, target), (int(reduction),))


@impl(aten.binary_cross_entropy_with_logits.default)
def bce_with_logits(x, target, weight=None, pos_weight=None, reduction=1):
    ops = (x, target) + ((weight,) if weight is not None else ()) + \
          ((pos_weight,) if pos_weight is not None else ())
    return wrapped_op(OP.bce_logits, ops, (int(reduction), weight is not None, pos_weight is not None))


# ---- multilabel margin loss -------------------------------------------------------
# Per sample (a row of C scores x and labels y, read up to the first -1):
# sum over labels j and non-labels i of max(0, 1 - x[y_j] + x[i]) / C.
# Built from [N, C(j), C(i)] masks: no data-dependent shapes, no scatter.
# (torch._decomp's version adds terms for the slots after the first -1.)
def _mlm_parts(x, target, is_target=None):
    C = x.shape[-1] if x.dim() else 1
    if x.dim() > 2 or C == 0:
        raise RuntimeError(f"multilabel_margin_loss: Expected non-empty vector or matrix with optional 0-dim batch "
                           f"size, but got: {list(x.shape)}")
    if target.shape != x.shape:
        raise RuntimeError(f"multilabel_margin_loss: inconsistent target size: {list(target.shape)} for input of "
                           f"size: {list(x.shape)}")
    x2, t2 = x.reshape(-1, C), target.reshape(-1, C)
    idx = torch.arange(C, device=x.device)
    valid = idx < torch.where(t2 == -1, idx, C).amin(-1, keepdim=True)  # [N, j]: j before the first -1
    if is_target is None:  # forward (the backward's targets were checked there)
        _checks.require(((t2 < -1) | (t2 >= C))._lt,
                        f"multilabel_margin_loss: argument #2 'target' is out of range: targets must lie in "
                        f"[-1, {C})", RuntimeError)
    tj = torch.where(valid, t2, 0)
    onehot = (tj.unsqueeze(-1) == idx) & valid.unsqueeze(-1)  # [N, j, i]: i is label j
    is_t = onehot.any(1) if is_target is None else is_target.reshape(-1, C) != 0
    z = 1 - x2.gather(1, tj).unsqueeze(-1) + x2.unsqueeze(1)  # [N, j, i]
    active = valid.unsqueeze(-1) & ~is_t.unsqueeze(1) & (z > 0)
    return x2, onehot, is_t, z, active


@impl(aten.multilabel_margin_loss_forward.default, refuses=INTEGRAL)
@_checks.staged
def multilabel_margin_loss_forward(x, target, reduction):
    x2, _, is_t, z, active = _mlm_parts(x, target)
    loss = torch.where(active, z, 0).sum((1, 2)) / x2.shape[1]
    loss = loss.mean() if reduction == 1 else loss.sum() if reduction == 2 else loss.reshape(x.shape[:-1])
    return loss, is_t.to(x.dtype).reshape(target.shape)


@impl(aten.multilabel_margin_loss_backward.default)
def multilabel_margin_loss_backward(grad, x, target, reduction, is_target):
    x2, onehot, _, _, active = _mlm_parts(x, target, is_target)
    a = active.to(x.dtype)
    # d/dx[i]: +1 per (label j, non-label i) term that is active, -1 per active
    # term of label j at i = y_j
    g = (a.sum(1) - (onehot.to(x.dtype) * a.sum(2, keepdim=True)).sum(1)) / x2.shape[1]
    if reduction == 1:
        g = g * (grad / x2.shape[0])
    elif reduction == 2:
        g = g * grad
    else:
        g = g * grad.reshape(-1, 1)
    return g.reshape(x.shape)


_lib = torch.library.Library("aten", "IMPL")
_lib.impl("scaled_dot_product_attention", _sdpa_kernel, "AutogradPrivateUse1")
_lib.impl("rms_norm", _rms_norm_kernel, "AutogradPrivateUse1")


# Activations and losses torch's decompositions run, float math that torch's kernels refuse for integers and
# bools (dtype_rules).
decomposed(aten.elu, aten.celu, aten.selu, aten.hardsigmoid, aten.mish, aten.hardswish, aten.softplus,
           aten.softshrink, aten.hardshrink, aten.log_sigmoid_forward, aten.glu, refuses=INTEGRAL)
decomposed(aten.huber_loss, aten.smooth_l1_loss, refuses=INTEGRAL_PROMOTED)
