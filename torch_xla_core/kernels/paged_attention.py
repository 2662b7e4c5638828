"""Multi-query paged attention: a Pallas TPU kernel written here (jax ships
no multi-query version; torch_xla's design is the model), and the jax
gather + masked-softmax implementation it is checked against. Both are JAX
functions taking jax arrays; attention.py's multi_queries_paged_attention
validates torch inputs and calls one of them through call_jax.

Semantics (torch_xla's): q [B, Q, Hq, D] pre-scaled (no softmax scale
inside), pages [Hkv, total_pages, page_size, D], kv_lens / effective_q_lens
int32 [B], page_indices int32 [B, pages_per_seq]. Query i of sequence b sees
kv position t iff t < kv_lens[b] and t <= kv_lens[b] - effective_q_lens[b] + i
(the causal offset of prefix caching / chunked prefill). A sequence with
kv_lens 0 gives zeros. Optional logit soft cap tanh(s / cap) * cap before
the mask.

The kernel (paged_attention_pallas):
  grid (B, Hkv, cdiv(Q, bq), pages_per_seq / ppcb), bq =
  num_queries_per_compute_block, ppcb = num_kv_pages_per_compute_block;
  the last axis walks kv blocks of ppcb pages ("arbitrary"; the others are
  "parallel": no state crosses them).
  * Scalar prefetch (SMEM): kv_lens, page_indices flattened, effective_q_lens.
  * K/V pages: BlockSpecs whose index maps read the page table: the pages
    array is passed ppcb times, operand j fetching page j of kv block k
    (one [page_size, D] tile each; Pallas double-buffers every operand). For
    kv blocks past the last useful one the index map repeats the last useful
    block's pages, so the pipeline issues no DMA for them and the body
    skips them (pl.when).
  * GQA: one grid step serves every q head of its kv head (q is viewed as
    [B, Hkv, Hq/Hkv, Q, D]); a page is loaded once for all of them.
  * Online softmax in f32 VMEM scratch: m and l [Hq/Hkv, bq, 128] (128 lanes,
    as jax's flash kernel keeps them), acc [Hq/Hkv, bq, D]. The output block's
    index map ignores the kv axis, so it stays resident in VMEM; the kernel
    normalizes and writes it only at the last useful kv block of its q block
    (the last block holding a position any of its queries sees), and Pallas
    writes it to HBM once per (b, kv head, q block).
  * Masked logits get MASK_VALUE (-0.7 * f32 max), as the reference does.
TPU: compiled by Mosaic. Elsewhere: the same pallas_call with interpret=True,
which jax lowers to plain HLO (a while loop over the grid, dynamic slices for
the blocks), so the kernel body stays inside our graph and scan bodies; it
is slow (correctness only). Gradients: a custom_vjp whose backward is the
vjp of the gather implementation (the kernel is forward-only, as
torch_xla's)."""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .reference import MASK_VALUE

LANES = 128  # m / l scratch width: one vreg lane row per query


def _repeat_heads(x, h):
    return x if x.shape[1] == h else jnp.repeat(x, h // x.shape[1], axis=1)


def paged_attention_xla(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, *, soft_cap=None):
    """The gather implementation: gather every sequence's pages, masked
    softmax over all of them (XLA ops only; fastest off TPU)."""
    b, nq, hq, d = q.shape
    hkv, _, page, _ = k_pages.shape
    pps = page_indices.shape[1]
    k = jnp.take(k_pages, page_indices, axis=1).reshape(hkv, b, pps * page, d).transpose(1, 0, 2, 3)
    v = jnp.take(v_pages, page_indices, axis=1).reshape(hkv, b, pps * page, d).transpose(1, 0, 2, 3)
    k, v = _repeat_heads(k, hq).astype(jnp.float32), _repeat_heads(v, hq).astype(jnp.float32)
    logits = jnp.einsum("bqhd,bhtd->bhqt", q.astype(jnp.float32), k)
    if soft_cap is not None:
        logits = jnp.tanh(logits / soft_cap) * soft_cap
    t = jnp.arange(pps * page)
    limit = (kv_lens - eff_q_lens)[:, None] + jnp.arange(nq)[None, :]
    mask = (t[None, None, :] <= limit[:, :, None]) & (t[None, None, :] < kv_lens[:, None, None])
    logits = jnp.where(mask[:, None], logits, MASK_VALUE)
    p = jax.nn.softmax(logits, axis=-1)
    o = jnp.einsum("bhqt,bhtd->bqhd", p, v)
    o = jnp.where(mask.any(-1)[:, :, None, None], o, 0.0)
    return o.astype(q.dtype)


def _last_kv_block(kv_len, eff_len, qi, *, bq, nq, blk):
    """Index of the last kv block holding a position some query of q block
    qi sees; -1 when the sequence is empty."""
    last_row = jnp.minimum((qi + 1) * bq, nq) - 1
    last_pos = jnp.minimum(kv_len - 1, kv_len - eff_len + last_row)
    return jnp.where(kv_len > 0, jax.lax.div(jnp.maximum(last_pos, 0), blk), -1)  # non-negative: div == floor


def _lanes(x, n):
    """A [rows, LANES] row-constant (m, l, alpha) as [rows, n], the way jax's
    and torch_xla's TPU kernels broadcast it: whole-vreg tiling when n is a
    multiple of 128, a lane slice when n < 128 (static shapes: the same
    choice on every platform)."""
    if n % LANES == 0:
        return jnp.tile(x, (1, n // LANES))
    if n < LANES:
        return x[:, :n]
    return jnp.broadcast_to(x[:, :1], (x.shape[0], n))


def _kernel(lens_ref, pidx_ref, eff_ref, q_ref, *refs, ppcb, page, bq, nq, r, soft_cap):
    k_refs, v_refs = refs[:ppcb], refs[ppcb:2 * ppcb]
    o_ref, m_sc, l_sc, acc_sc = refs[2 * ppcb:]
    b, qi, ki = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    blk = ppcb * page
    kv_len, eff_len = lens_ref[b], eff_ref[b]
    last = _last_kv_block(kv_len, eff_len, qi, bq=bq, nq=nq, blk=blk)

    @pl.when(ki == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, jnp.float32)
        l_sc[...] = jnp.zeros(l_sc.shape, jnp.float32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, jnp.float32)

    @pl.when(ki <= last)
    def _compute():
        k = jnp.concatenate([ref[...] for ref in k_refs], axis=0) if ppcb > 1 else k_refs[0][...]
        v = jnp.concatenate([ref[...] for ref in v_refs], axis=0) if ppcb > 1 else v_refs[0][...]
        rows = kv_len - eff_len + qi * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, blk), 0)
        cols = ki * blk + jax.lax.broadcasted_iota(jnp.int32, (bq, blk), 1)
        visible = (cols <= rows) & (cols < kv_len)
        for h in range(r):  # the q heads sharing this kv head reuse the loaded pages
            s = jax.lax.dot_general(q_ref[h], k, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            if soft_cap is not None:
                s = jnp.tanh(s / soft_cap) * soft_cap
            s = jnp.where(visible, s, MASK_VALUE)
            m_prev, l_prev = m_sc[h], l_sc[h]
            m_next = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))  # [bq, LANES]
            alpha = jnp.exp(m_prev - m_next)
            p = jnp.exp(s - _lanes(m_next, blk))
            l_sc[h] = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
            m_sc[h] = m_next
            pv = jax.lax.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
            acc_sc[h] = acc_sc[h] * _lanes(alpha, acc_sc.shape[-1]) + pv

    @pl.when(ki == jnp.maximum(last, 0))
    def _store():  # the only write of the output block: at the last useful kv block
        for h in range(r):
            l = l_sc[h]
            o = acc_sc[h] * _lanes(jnp.where(l == 0.0, 1.0, 1.0 / l), acc_sc.shape[-1])
            o_ref[h] = jnp.where(kv_len > 0, o, 0.0).astype(o_ref.dtype)


def paged_attention_pallas(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, *, ppcb, bq,
                           soft_cap=None, interpret=False):
    """The Pallas kernel (see the module comment). interpret=True runs the
    same kernel as plain HLO (any platform)."""
    b, nq, hq, d = q.shape
    hkv, total, page, _ = k_pages.shape
    pps = page_indices.shape[1]
    r = hq // hkv
    bq = min(bq, nq)
    blk = ppcb * page
    # out-of-range indices are reported by the caller's deferred check; clamp
    # so that the DMA can never leave the pages array meanwhile
    pidx = jnp.clip(page_indices, 0, total - 1).reshape(-1)
    qg = q.reshape(b, nq, hkv, r, d).transpose(0, 2, 3, 1, 4)  # [B, Hkv, r, Q, D]

    def page_map(j):
        def index_map(bi, hi, qi, ki, lens_ref, pidx_ref, eff_ref):
            last = _last_kv_block(lens_ref[bi], eff_ref[bi], qi, bq=bq, nq=nq, blk=blk)
            kc = jnp.minimum(ki, jnp.maximum(last, 0))  # past the last useful block: no new DMA
            return hi, pidx_ref[bi * pps + kc * ppcb + j], 0, 0
        return index_map

    page_specs = [pl.BlockSpec((None, None, page, d), page_map(j)) for j in range(ppcb)]
    q_spec = pl.BlockSpec((None, None, r, bq, d), lambda bi, hi, qi, ki, *_: (bi, hi, 0, qi, 0))
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=3,
        grid=(b, hkv, pl.cdiv(nq, bq), pps // ppcb),
        in_specs=[q_spec] + page_specs + page_specs,
        out_specs=q_spec,
        scratch_shapes=[pltpu.VMEM((r, bq, LANES), jnp.float32), pltpu.VMEM((r, bq, LANES), jnp.float32),
                        pltpu.VMEM((r, bq, d), jnp.float32)])
    kernel = functools.partial(_kernel, ppcb=ppcb, page=page, bq=bq, nq=nq, r=r, soft_cap=soft_cap)
    out = pl.pallas_call(
        kernel, grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(qg.shape, q.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
        interpret=interpret, name="multi_queries_paged_attention",
    )(kv_lens, pidx, eff_q_lens, qg, *([k_pages] * ppcb), *([v_pages] * ppcb))
    return out.transpose(0, 3, 1, 2, 4).reshape(b, nq, hq, d)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9))
def paged_attention_kernel(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, ppcb, bq, soft_cap, interpret):
    """paged_attention_pallas made differentiable: the backward is the vjp
    of the gather implementation (same math)."""
    return paged_attention_pallas(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, ppcb=ppcb, bq=bq,
                                  soft_cap=soft_cap, interpret=interpret)


def _kernel_fwd(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, ppcb, bq, soft_cap, interpret):
    out = paged_attention_pallas(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, ppcb=ppcb, bq=bq,
                                 soft_cap=soft_cap, interpret=interpret)
    return out, (q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens)


def _kernel_bwd(ppcb, bq, soft_cap, interpret, res, g):
    q, k_pages, v_pages, kv_lens, page_indices, eff = res
    _, vjp = jax.vjp(lambda a, b, c: paged_attention_xla(a, b, c, kv_lens, page_indices, eff, soft_cap=soft_cap),
                     q, k_pages, v_pages)
    return (*vjp(g), None, None, None)


paged_attention_kernel.defvjp(_kernel_fwd, _kernel_bwd)
