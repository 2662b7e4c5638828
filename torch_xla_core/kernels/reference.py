"""Plain-PyTorch reference implementations of the kernels (any device): the
definitions the kernels are tested against. Same arguments and defaults as
the kernels in attention.py / gmm.py.

MASK_VALUE is the jax/torch_xla kernels' mask value (-0.7 * float32 max,
not -inf): a row with nothing visible averages all values, as the kernels
do; the paged attention returns zeros for a query that sees no kv at all."""
import torch

MASK_VALUE = -0.7 * float(torch.finfo(torch.float32).max)


def _repeat_kv(k, h):
    hk = k.shape[1]
    return k if hk == h else k.repeat_interleave(h // hk, dim=1)


def flash_attention(q, k, v, causal=False, q_segment_ids=None, kv_segment_ids=None, sm_scale=1.0, ab=None):
    """q [B, H, S, D], k/v [B, Hkv, T, D] (H a multiple of Hkv) -> [B, H, S, D]."""
    h = q.shape[1]
    k, v = _repeat_kv(k, h).float(), _repeat_kv(v, h).float()
    logits = torch.einsum("bhqd,bhkd->bhqk", q.float(), k) * sm_scale
    if ab is not None:
        logits = logits + ab.float()
    s, t = q.shape[2], k.shape[2]
    mask = torch.ones(q.shape[0], 1, s, t, dtype=torch.bool, device=q.device)
    if q_segment_ids is not None:
        mask = mask & (q_segment_ids[:, None, :, None] == kv_segment_ids[:, None, None, :])
    if causal:
        mask = mask & (torch.arange(s, device=q.device)[:, None] >= torch.arange(t, device=q.device)[None, :])
    logits = torch.where(mask, logits, MASK_VALUE)
    p = torch.softmax(logits, dim=-1)
    return torch.einsum("bhqk,bhkd->bhqd", p, v).to(q.dtype)


def multi_queries_paged_attention(q, k_pages, v_pages, kv_lens, page_indices, effective_q_lens,
                                  attn_logits_soft_cap=None):
    """q [B, Q, Hq, D] (pre-scaled: no softmax scale inside), k/v_pages
    [Hkv, total_pages, page_size, D], kv_lens/effective_q_lens int32 [B],
    page_indices int32 [B, pages_per_seq] -> [B, Q, Hq, D]. Query i of
    sequence b sees kv positions t < kv_lens[b] with
    t <= kv_lens[b] - effective_q_lens[b] + i."""
    b, nq, hq, d = q.shape
    hkv, _, page, _ = k_pages.shape
    pps = page_indices.shape[1]
    k = k_pages[:, page_indices.long()].reshape(hkv, b, pps * page, d).permute(1, 0, 2, 3)
    v = v_pages[:, page_indices.long()].reshape(hkv, b, pps * page, d).permute(1, 0, 2, 3)
    k, v = _repeat_kv(k, hq).float(), _repeat_kv(v, hq).float()
    logits = torch.einsum("bqhd,bhtd->bhqt", q.float(), k)
    if attn_logits_soft_cap is not None:
        logits = torch.tanh(logits / attn_logits_soft_cap) * attn_logits_soft_cap
    t = torch.arange(pps * page, device=q.device)
    limit = (kv_lens - effective_q_lens)[:, None].long() + torch.arange(nq, device=q.device)[None, :]
    mask = (t[None, None, :] <= limit[:, :, None]) & (t[None, None, :] < kv_lens[:, None, None].long())
    logits = torch.where(mask[:, None], logits, MASK_VALUE)
    p = torch.softmax(logits, dim=-1)
    o = torch.einsum("bhqt,bhtd->bqhd", p, v)
    o = torch.where(mask.any(-1)[:, :, None, None], o, 0.0)
    return o.to(q.dtype)


def grouped_matmul(x, w, group_sizes):
    """x [M, K] (rows grouped by expert, in order), w [E, K, N], group_sizes
    int [E] (summing to M) -> [M, N]."""
    offs = torch.cumsum(group_sizes.long(), 0)
    out = []
    start = 0
    for e in range(w.shape[0]):
        end = int(offs[e])
        out.append(x[start:end] @ w[e])
        start = end
    return torch.cat(out, 0)
