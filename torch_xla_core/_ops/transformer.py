"""The fused inference ops of nn.MultiheadAttention and
nn.TransformerEncoderLayer (their "fast path", taken in eval mode without
grad on every accelerator device type, ours included):
_native_multi_head_attention, _transformer_encoder_layer_fwd, and
_nested_tensor_from_mask_left_aligned (the padding-mask test
nn.TransformerEncoder asks first). Written with ordinary torch calls on xla
tensors (each a core op), with CPU eager's semantics
(aten/src/ATen/native/transformers): bool masks are True where attention is
NOT allowed, mask_type 0 = [L, S] attention mask, 1 = [B, S] key padding
mask, 2 = a merged mask broadcastable to [B, H, L, S]; a query row with
every key masked gets zero weights (masked softmax), not NaN."""
import math

import torch
import torch.nn.functional as F

from . import aten, impl


def _masked_softmax(scores, mask, mask_type):
    if mask is None:
        return torch.softmax(scores, -1)
    if mask_type == 1:  # key padding [B, S]
        mask = mask.view(mask.shape[0], 1, 1, mask.shape[-1])
    if mask.dtype != torch.bool:  # an additive float mask
        return torch.softmax(scores + mask, -1)
    low = torch.finfo(scores.dtype).min
    return torch.softmax(scores.masked_fill(mask, low), -1).masked_fill(mask, 0.0)


@impl(aten._native_multi_head_attention.default)
def native_multi_head_attention(q, k, v, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    if q.dim() != 3 or q.shape[-1] != embed_dim or embed_dim % num_head:
        raise RuntimeError(f"_native_multi_head_attention: query must be [B, L, {embed_dim}] with embed_dim "
                           f"divisible by num_head={num_head}, got {list(q.shape)}")
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3) if qkv_bias is not None else (None, None, None)
    d = embed_dim // num_head

    def heads(x, w, b):  # [B, T, E] -> [B, H, T, D]
        return F.linear(x, w, b).view(x.shape[0], x.shape[1], num_head, d).transpose(1, 2)

    qh, kh, vh = heads(q, wq, bq), heads(k, wk, bk), heads(v, wv, bv)
    p = _masked_softmax(qh @ kh.transpose(-2, -1) / math.sqrt(d), mask, mask_type)
    o = (p @ vh).transpose(1, 2).reshape(q.shape[0], q.shape[1], embed_dim)
    out = F.linear(o, proj_weight, proj_bias)
    if not need_weights:
        return out, q.new_empty(0)
    return out, (p.mean(1) if average_attn_weights else p)


@impl(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                                  norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    x = norm1(src) if norm_first else src
    x = native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                    mask, False, True, mask_type)[0] + src
    if not norm_first:
        x = norm1(x)
    h = norm2(x) if norm_first else x
    h = F.linear(h, ffn_weight_1, ffn_bias_1)
    h = F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)
    x = x + h
    return x if norm_first else norm2(x)


@impl(aten._nested_tensor_from_mask_left_aligned.default)
def nested_tensor_from_mask_left_aligned(x, mask):
    """Whether every row of `mask` (True = a token) is tokens then padding.
    A Python bool: the answer syncs, as on every device."""
    if mask.dim() != 2 or mask.dtype != torch.bool:
        raise RuntimeError(f"_nested_tensor_from_mask_left_aligned: mask must be a 2-D bool tensor, got "
                           f"{mask.dim()}-D {mask.dtype}")
    return not bool((mask[:, 1:] & ~mask[:, :-1]).any())
