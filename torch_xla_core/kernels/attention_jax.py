"""Attention in plain jax with the fused kernels' numerics: flash_attention's
"reference" implementation (the default on CPU, where jax's TPU kernel cannot
run inside our graph) and what the other platforms fall back to.

As FlashAttention-2, cuDNN, torch's CPU flash kernel and our core sdpa op
(csrc/ops/attention.cpp) compute: every product takes operands in the input
dtype and returns float32 (preferred_element_type), the scores stay float32
through the scale, bias, mask and softmax, the unnormalised probabilities are
rounded to the input dtype for p.v and normalised after it in float32; the
backward (a custom vjp) recomputes the probabilities from the logsumexp and
rounds dS, computed in float32, for the dQ/dK products. dS = P (dP - D) takes
D = rowsum(P dP) from those float32 values (torch's softmax backward), not
rowsum(dO o) from the rounded output o: o's rounding (~2^-9 |dO||o|) stays
in dS where the softmax is peaked (dP - D cancels there), which put dQ/dK
of inputs with large scores up to 15x bf16 tolerance from float64. Grouped-query heads
are a dim of the products (q as [B, Hkv, G, S, D]), so dK and dV sum the
groups inside the product, in float32, with no repeated copy of k and v.

Masked scores take MASK_VALUE (finite, as jax's and torch_xla's kernels): a
row that sees nothing averages all values."""
from functools import partial

import jax
import jax.numpy as jnp

from .reference import MASK_VALUE

_F32 = jnp.float32


def _dot(spec, a, b):
    return jnp.einsum(spec, a, b, preferred_element_type=_F32)


def _scores(q, k, ab, mask, scale):
    s = _dot("bkgqd,bktd->bkgqt", q, k) * scale
    if ab is not None:
        s = s + ab.astype(_F32)
    return jnp.where(mask, s, MASK_VALUE)


@partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attend(q, k, v, ab, mask, scale):
    return _attend_fwd(q, k, v, ab, mask, scale)[0]


def _attend_fwd(q, k, v, ab, mask, scale):
    s = _scores(q, k, ab, mask, scale)
    m = s.max(-1, keepdims=True)
    e = jnp.exp(s - m)
    ls = e.sum(-1, keepdims=True)
    o = (_dot("bkgqt,bktd->bkgqd", e.astype(v.dtype), v) / ls).astype(q.dtype)
    return o, (q, k, v, ab, mask, m + jnp.log(ls))


def _attend_bwd(scale, res, g):
    q, k, v, ab, mask, lse = res
    dt = q.dtype
    p = jnp.exp(_scores(q, k, ab, mask, scale) - lse)
    g = g.astype(dt)
    dv = _dot("bkgqt,bkgqd->bktd", p.astype(dt), g).astype(v.dtype)
    dp = _dot("bkgqd,bktd->bkgqt", g, v)
    pdp = p * dp  # dS = P dP - P D with D = rowsum(P dP): as fast as the old D (P (dP - D) was +24% on CPU)
    ds = jnp.where(mask, pdp - p * pdp.sum(-1, keepdims=True), 0.0)
    dab = None if ab is None else ds.astype(ab.dtype)
    ds = (ds * scale).astype(dt)
    dq = _dot("bkgqt,bktd->bkgqd", ds, k).astype(dt)
    dk = _dot("bkgqt,bkgqd->bktd", ds, q).astype(k.dtype)
    return dq, dk, dv, dab, None


_attend.defvjp(_attend_fwd, _attend_bwd)


def attention(q, k, v, ab, q_seg, kv_seg, *, causal, sm_scale):
    """q [B, H, S, D], k/v [B, Hkv, T, D] (H a multiple of Hkv), ab [B, H, S, T]
    or None, segment ids [B, S] / [B, T] or None -> [B, H, S, D]."""
    b, h, s, d = q.shape
    hk, t = k.shape[1], k.shape[2]
    grouped = lambda x: x.reshape(b, hk, h // hk, *x.shape[2:])  # noqa: E731
    mask = jnp.ones((b, 1, 1, s, t), dtype=bool)
    if q_seg is not None:
        mask = mask & (q_seg[:, None, None, :, None] == kv_seg[:, None, None, None, :])
    if causal:
        mask = mask & (jnp.arange(s)[:, None] >= jnp.arange(t)[None, :])
    o = _attend(grouped(q), k, v, None if ab is None else grouped(ab), mask, float(sm_scale))
    return o.reshape(b, h, s, d)
