"""Attention kernels on xla tensors, through call_jax (one node in the graph,
gradients through jax.vjp, usable inside scan / scan_layers).

flash_attention(q, k, v, causal=False, q_segment_ids=None,
                kv_segment_ids=None, sm_scale=1.0, ab=None)
    q [B, H, S, D], k/v [B, Hkv, T, D] with H a multiple of Hkv (GQA: kv
    heads are repeated for the kernel), segment ids int [B, S] / [B, T]
    (only equal ids attend), ab an additive bias [B, H, S, T]. Defaults as
    torch_xla's (sm_scale=1.0, bias named ab).
    impl (None: the platform's best):
      "pallas": TPU: jax's Pallas flash_attention (pallas/ops/tpu), compiled
        by Mosaic (the default there). GPU: jax's Pallas GPU kernel
        (pallas/ops/gpu/attention.mha, Triton; forward and backward
        kernels), the default for bf16/f16 calls it takes: q and kv of one
        length S (a multiple of 128, or 32/64), head_dim 16..256, no bias,
        segment ids given as one tensor for q and kv. Measured on an H200
        (bf16, B=2, H=8, D=64, causal, fwd+bwd): 2.2-2.5x faster than
        "reference" at S=1024 and 4096. float32 keeps "reference" by default
        (Triton's dots round through TF32).
      "cudnn": GPU: XLA's cuDNN fused (flash) attention, as
        jax.nn.dot_product_attention(implementation="cudnn") emits: bf16/f16,
        head_dim a multiple of 8 up to 128, no bias or segment ids (GQA and
        causal taken as they are). The default on CUDA for the calls it takes
        when TXC_SDPA_KERNEL / set_sdpa_kernel is "cudnn".
      "interpret": the GPU kernel through Pallas' interpreter (plain HLO,
        any platform: how CPU tests check its numerics; slow).
      "reference": the same math written in jax with the fused kernels'
        numerics (attention_jax.py: products on operands of the input dtype,
        scores and softmax in float32; kernels/reference.py is the plain
        torch definition; the default on CPU): jax's TPU kernel runs on CPU only
        under force_tpu_interpret_mode, which emits Python callbacks and so
        cannot live inside our graph.

multi_queries_paged_attention(q, k_pages, v_pages, kv_lens, page_indices,
        effective_q_lens, num_kv_pages_per_compute_block,
        num_queries_per_compute_block, attn_logits_soft_cap=None)
    torch_xla's multi-query paged attention: q [B, Q, Hq, D] (pre-scaled;
    no softmax scale inside), pages [Hkv, total_pages, page_size, D],
    kv_lens / effective_q_lens int32 [B], page_indices int32 [B, pps].
    Query i of sequence b sees kv positions < kv_lens[b] and
    <= kv_lens[b] - effective_q_lens[b] + i (prefix caching / chunked
    prefill); a query that sees nothing gives zeros. The block sizes are
    validated as torch_xla does (pps % num_kv_pages_per_compute_block == 0).
    Two implementations (paged_attention.py), chosen by impl= or
    TXC_PAGED_ATTENTION_IMPL:
      "pallas": the Pallas kernel written here. TPU: compiled by Mosaic (the
        default there). CPU/GPU: the same kernel body through Pallas'
        interpreter (pallas_call(interpret=True): plain HLO, stays in our
        graph and in scan bodies; slow, for correctness).
      "xla": gather the pages + masked softmax in XLA ops (the default off
        TPU, where it is much faster than the interpreted kernel).
    Differentiable either way (the kernel's backward is the gather
    implementation's vjp).

F.scaled_dot_product_attention goes to flash_attention where set_sdpa_kernel /
TXC_SDPA_KERNEL allow it, counted as "sdpa_flash" in metrics; the rest keeps
the fused core sdpa op. Modes: "auto" (the default): on TPU for calls the
kernel takes with kv length >= 1024; on CUDA for bf16/f16 calls the Pallas
GPU kernel takes (no mask, causal or not, GQA as transformers' Llama calls
it: one length for q and kv, a multiple of 128 or 32/64, head_dim 16..256);
"flash": every platform, every call without mask or dropout; "cudnn": on
CUDA, the calls cuDNN's fused attention takes, run by it; "xla": never.

Under SPMD both kernels run per shard (kernels/per_shard.py: jax.shard_map's
manual region around the call) when given partition_spec= (q's layout,
torch_xla's name; only batch and heads may be split) and mesh= (default
sharding.get_global_mesh()), or, without them, when q's layout is known
while tracing (device data laid out by mark_sharding, or a value
mark_sharding annotated): its batch and heads entries. Otherwise the call
is one node the partitioner handles (the interpreted/reference paths are
plain HLO and get partitioned; a Mosaic custom call on TPU would be
gathered), counted as "kernel_per_shard" when it runs per shard.

Bad input raises before anything compiles (shapes, dtypes, head ratios,
block sizes); page indices out of range raise at the sync that computes
them (a deferred check, as the index ops do)."""
import warnings

import jax
import jax.numpy as jnp
import torch

from .._tracing import checks as _checks
from .. import config, metrics
from .._runtime import runtime
from .._execution import sharding as xs
from . import attention_jax
from . import paged_attention as pa
from . import per_shard
from .call_jax import call_jax

__all__ = ["flash_attention", "multi_queries_paged_attention", "set_sdpa_kernel", "sdpa_kernel"]


def _jax():
    return jax, jnp


def _repeat(jnp, x, h):
    return x if x.shape[1] == h else jnp.repeat(x, h // x.shape[1], axis=1)


def _flash_tpu(q, k, v, ab, q_seg, kv_seg, *, causal, sm_scale):
    from jax.experimental.pallas.ops.tpu import flash_attention as fa  # lazy: TPU only (Pallas' Mosaic kernels)
    _, jnp = _jax()
    h = q.shape[1]
    k, v = _repeat(jnp, k, h), _repeat(jnp, v, h)
    seg = fa.SegmentIds(q=q_seg, kv=kv_seg) if q_seg is not None else None
    s, t = q.shape[2], k.shape[2]
    bq, bk = min(512, s), min(512, t)
    blocks = fa.BlockSizes(block_q=bq, block_k_major=bk, block_k=bk, block_b=1, block_q_major_dkv=bq,
                           block_k_major_dkv=bk, block_k_dkv=bk, block_q_dkv=bq, block_k_major_dq=bk,
                           block_k_dq=bk, block_q_dq=bq)
    return fa.flash_attention(q, k, v, ab=ab, segment_ids=seg, causal=causal, sm_scale=sm_scale, block_sizes=blocks)


def _flash_gpu(q, k, v, seg, *, causal, sm_scale, interpret):
    """jax's Pallas GPU (Triton) flash attention: q [B, H, S, D], k/v
    [B, Hkv, S, D], seg [B, S] or None (one array for q and kv)."""
    _, jnp = _jax()
    with warnings.catch_warnings():  # jax >= 0.11 points at tokamax; the kernel is the same
        warnings.simplefilter("ignore", DeprecationWarning)
        from jax.experimental.pallas.ops.gpu import attention as ga  # lazy: CUDA only (Pallas' Triton kernels)
    h, s = q.shape[1], q.shape[2]
    k, v = _repeat(jnp, k, h), _repeat(jnp, v, h)
    fwd, bwd = min(128, s), min(32, s)
    blocks = ga.BlockSizes(block_q=fwd, block_k=fwd, block_q_dkv=bwd, block_kv_dkv=bwd, block_q_dq=bwd,
                           block_kv_dq=bwd)
    t = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731  (the kernel's layout is [B, S, H, D])
    o = ga.mha(t(q), t(k), t(v), seg, sm_scale=sm_scale, causal=causal, block_sizes=blocks, interpret=interpret)
    return t(o)


def _cudnn_attention(q, k, v, *, causal, sm_scale, implementation="cudnn"):
    """XLA's cuDNN fused attention (jax.nn.dot_product_attention): q [B, H, S, D],
    k/v [B, Hkv, T, D] (GQA as is; jax's layout is [B, S, H, D]).
    implementation="xla" is jax's own math, for checking this layout on CPU."""
    jax, jnp = _jax()
    t = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731
    o = jax.nn.dot_product_attention(t(q), t(k), t(v), scale=sm_scale, is_causal=causal,
                                     implementation=implementation)
    return t(o)


def _cudnn_refusal(q, k, q_segment_ids, ab):
    """Why cuDNN's fused attention cannot take this call (None when it can)."""
    d, s, t = q.shape[3], q.shape[2], k.shape[2]
    if s != t:
        return f"cuDNN's fused attention is used here for q and kv of one length (got {s} and {t})"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"cuDNN's fused attention needs bf16 or f16 (got {q.dtype})"
    if d % 8 or d > 128:
        return f"cuDNN's fused attention needs head_dim a multiple of 8 up to 128 (got {d})"
    if ab is not None or q_segment_ids is not None:
        return "cuDNN's fused attention is used here without bias or segment ids"
    return None


def _flash_entry(*arrays, has_ab, has_seg, causal, sm_scale, impl):
    """impl: "pallas" (TPU, Mosaic), "gpu" (Triton), "interpret" (the GPU
    kernel interpreted) or "reference"."""
    q, k, v = arrays[:3]
    rest = list(arrays[3:])
    ab = rest.pop(0) if has_ab else None
    if impl == "cudnn":
        return _cudnn_attention(q, k, v, causal=causal, sm_scale=sm_scale)
    if impl in ("gpu", "interpret"):
        return _flash_gpu(q, k, v, rest[0] if has_seg else None, causal=causal, sm_scale=sm_scale,
                          interpret=impl == "interpret")
    q_seg, kv_seg = (rest[0], rest[1]) if has_seg else (None, None)
    fn = _flash_tpu if impl == "pallas" else attention_jax.attention
    return fn(q, k, v, ab, q_seg, kv_seg, causal=causal, sm_scale=sm_scale)


def _gpu_kernel_refusal(q, k, q_segment_ids, kv_segment_ids, ab):
    """Why the GPU kernel cannot take this call (None when it can)."""
    s, t, d = q.shape[2], k.shape[2], q.shape[3]
    if s != t:
        return f"the GPU kernel needs q and kv of one length (got {s} and {t})"
    if not (s % 128 == 0 or s in (32, 64)):
        return f"the GPU kernel needs a sequence length that is a multiple of 128, or 32 or 64 (got {s})"
    if not 16 <= d <= 256:
        return f"the GPU kernel needs head_dim 16..256 (got {d})"
    if ab is not None:
        return "the GPU kernel takes no bias (ab)"
    if q_segment_ids is not kv_segment_ids:
        return ("the GPU kernel takes one segment-id tensor for q and kv: pass the same tensor as "
                "q_segment_ids and kv_segment_ids")
    return None


def _need(cond, msg):
    if not cond:
        raise ValueError(msg)


def _shard_plan(op, q, partition_spec, mesh, batch_dim, head_dim, kv_heads, kv_name):
    """How a kernel runs per shard: (mesh, batch entry, heads entry), or None
    to run it once on whole tensors. With partition_spec (q's layout, as in
    torch_xla) only the batch and heads dims may be split (the kernel needs
    whole sequences and head_dim), and the kv heads must split as q's do.
    Without one, q's layout where it is known while tracing (device data
    laid out on a mesh, or mark_sharding's annotation) decides: its batch
    and heads entries (heads only when the kv heads split alike)."""
    if partition_spec is None:
        _need(mesh is None, f"{op}: mesh= given without partition_spec=; give q's partition_spec too")
        known = xs.known_spec(q)
        if known is None:
            return None
        mesh, spec = known
        b, h = spec[batch_dim], spec[head_dim]
        if b is not None and q.shape[batch_dim] % per_shard.axis_size(mesh, b):
            b = None  # an uneven layout (padded pieces): the kernel runs on the whole batch
        if h is not None and kv_heads % per_shard.axis_size(mesh, h):
            h = None
        return (mesh, b, h) if (b, h) != (None, None) else None
    mesh = mesh if mesh is not None else xs.get_global_mesh()
    _need(isinstance(mesh, xs.Mesh), f"{op}: partition_spec needs mesh= (a torch_xla_core.sharding.Mesh) or "
                                     f"sharding.set_global_mesh(mesh); got {mesh!r}")
    spec = xs.tensor_spec_names(mesh, partition_spec, q, op=op)
    split = [d for d in range(len(spec)) if d not in (batch_dim, head_dim) and spec[d] is not None]
    _need(not split, f"{op}: partition_spec {spec} splits dims {split} of q; per shard only its batch (dim "
                     f"{batch_dim}) and heads (dim {head_dim}) may be split: the kernel needs whole sequences and "
                     f"head_dim")
    try:
        per_shard.refuse_uneven(mesh, spec, q.shape, f"{op}: partition_spec {spec} on q")
    except ValueError as e:
        raise ValueError(f"{e} (q of shape {list(q.shape)})") from None
    h = spec[head_dim]
    _need(h is None or kv_heads % per_shard.axis_size(mesh, h) == 0,
          f"{op}: partition_spec splits q's heads over {h!r} ({per_shard.axis_size(mesh, h)} pieces), but "
          f"{kv_name} has {kv_heads} heads, which do not split alike; shard only the batch, or use a mesh axis "
          f"that divides the kv heads")
    return mesh, spec[batch_dim], h


def flash_attention(q, k, v, causal=False, q_segment_ids=None, kv_segment_ids=None, sm_scale=1.0, ab=None,
                    partition_spec=None, mesh=None, *, impl=None):
    """See the module comment. impl: None (the platform's best), "pallas"
    (jax's TPU or GPU kernel), "interpret" (the GPU kernel interpreted) or
    "reference" (jax einsum/softmax).
    partition_spec/mesh (torch_xla's): q's layout, e.g. ("data", None,
    None, None): the kernel runs per shard (_shard_plan)."""
    op = "flash_attention"
    _need(q.dim() == 4 and k.dim() == 4 and v.dim() == 4,
          f"{op}: q, k, v must be [batch, heads, seq, head_dim], got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    b, h, s, d = q.shape
    _need(k.shape == v.shape, f"{op}: k and v must have the same shape, got {list(k.shape)} and {list(v.shape)}")
    _need(k.shape[0] == b and k.shape[3] == d,
          f"{op}: k/v {list(k.shape)} do not fit q {list(q.shape)} (batch and head_dim must match)")
    _need(h % k.shape[1] == 0, f"{op}: q has {h} heads, k/v have {k.shape[1]}; q heads must be a multiple (GQA)")
    _need(q.dtype == k.dtype == v.dtype and q.is_floating_point(),
          f"{op}: q, k, v must share one float dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    t = k.shape[2]
    _need((q_segment_ids is None) == (kv_segment_ids is None),
          f"{op}: pass both q_segment_ids and kv_segment_ids, or neither")
    if q_segment_ids is not None:
        _need(tuple(q_segment_ids.shape) == (b, s) and tuple(kv_segment_ids.shape) == (b, t),
              f"{op}: segment ids must be q [{b}, {s}] and kv [{b}, {t}], got {list(q_segment_ids.shape)} and "
              f"{list(kv_segment_ids.shape)}")
        _need(not q_segment_ids.is_floating_point() and not kv_segment_ids.is_floating_point(),
              f"{op}: segment ids must be integer tensors")
    if ab is not None:
        _need(tuple(ab.shape) == (b, h, s, t), f"{op}: ab must be [{b}, {h}, {s}, {t}], got {list(ab.shape)}")
    platform = runtime.platform()
    gpu_refusal = _gpu_kernel_refusal(q, k, q_segment_ids, kv_segment_ids, ab)
    cudnn_refusal = _cudnn_refusal(q, k, q_segment_ids, ab)
    if impl is None:
        half = q.dtype in (torch.bfloat16, torch.float16)
        if platform == "cuda" and sdpa_kernel() == "cudnn" and cudnn_refusal is None:
            impl = "cudnn"
        else:
            impl = "pallas" if platform == "tpu" or (platform == "cuda" and gpu_refusal is None and half) \
                else "reference"
    _need(impl in ("pallas", "cudnn", "interpret", "reference"),
          f"{op}: impl must be None, 'pallas', 'cudnn', 'interpret' or 'reference', got {impl!r}")
    _need(impl != "cudnn" or platform == "cuda",
          f"{op}: impl='cudnn' (XLA's cuDNN fused attention) needs a CUDA GPU (the platform is {platform}); use "
          f"impl='reference'")
    if impl == "cudnn":
        _need(cudnn_refusal is None, f"{op}: {cudnn_refusal}; use impl='pallas' or 'reference'")
    _need(impl != "pallas" or platform in ("tpu", "cuda"),
          f"{op}: impl='pallas' needs a TPU or a GPU (the platform is {platform}); use impl='interpret' (the GPU "
          f"kernel through Pallas' interpreter) or impl='reference'")
    entry = "gpu" if impl == "pallas" and platform == "cuda" else impl
    if entry in ("gpu", "interpret"):
        _need(gpu_refusal is None, f"{op}: {gpu_refusal}; use impl='reference'")
    if entry == "pallas":
        _need(t % min(512, t) == 0 and (d < 128 or d % 128 == 0),
              f"{op}: the Pallas kernel needs head_dim < 128 or a multiple of 128 (got {d})")
        _need(q_segment_ids is None or t % 128 == 0,
              f"{op}: with segment ids the Pallas kernel needs a kv length that is a multiple of 128 (got {t})")
    arrays = [q, k, v]
    if ab is not None:
        arrays.append(ab.to(q.dtype) if ab.dtype != q.dtype else ab)
    if q_segment_ids is not None:
        arrays += [q_segment_ids.to(torch.int32)]
        if entry not in ("gpu", "interpret"):  # the GPU kernel reads one segment-id array for q and kv
            arrays += [kv_segment_ids.to(torch.int32)]
    kw = {}
    plan = _shard_plan(op, q, partition_spec, mesh, 0, 1, k.shape[1], "k/v")
    if plan is not None:
        m, bs, hs = plan
        qs = (bs, hs, None, None)
        nseg = len(arrays) - 3 - (ab is not None)
        kw = dict(mesh=m, in_specs=[qs] * (len(arrays) - nseg) + [(bs, None)] * nseg, out_specs=qs,
                  check_vma=entry == "reference")  # a pallas_call's results carry no varying-axes types
        metrics.counter_add("kernel_per_shard")
    return call_jax(_flash_entry, *arrays, has_ab=ab is not None, has_seg=q_segment_ids is not None,
                    causal=bool(causal), sm_scale=float(sm_scale), impl=entry, **kw)


def _mqpa_entry(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, *, impl, ppcb, bq, soft_cap):
    if impl == "xla":
        return pa.paged_attention_xla(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, soft_cap=soft_cap)
    return pa.paged_attention_kernel(q, k_pages, v_pages, kv_lens, page_indices, eff_q_lens, ppcb, bq, soft_cap,
                                     impl == "interpret")


_PAGED_IMPLS = config.SETTINGS["TXC_PAGED_ATTENTION_IMPL"].choices  # ("pallas", "xla")


def paged_attention_impl(platform=None) -> str:
    """Which implementation multi_queries_paged_attention uses when impl is
    None: TXC_PAGED_ATTENTION_IMPL ("pallas" or "xla") if set, else "pallas"
    on TPU and "xla" (the gather implementation) elsewhere."""
    env = config.get("TXC_PAGED_ATTENTION_IMPL")
    if env is not None:
        return env
    return "pallas" if (platform or runtime.platform()) == "tpu" else "xla"


def multi_queries_paged_attention(q, k_pages, v_pages, kv_lens, page_indices, effective_q_lens,
                                  num_kv_pages_per_compute_block, num_queries_per_compute_block,
                                  attn_logits_soft_cap=None, *, impl=None, partition_spec=None, mesh=None):
    """See the module comment. impl: None (paged_attention_impl()), "pallas"
    (the Pallas kernel of paged_attention.py: compiled by Mosaic on TPU, run
    as plain HLO through Pallas' interpreter elsewhere) or "xla" (the gather
    implementation). partition_spec/mesh: q's layout ([batch, queries,
    heads, head_dim]; batch and heads may be split): the kernel runs per
    shard, each device on its sequences (the pages whole) and its kv heads'
    pages (_shard_plan)."""
    op = "multi_queries_paged_attention"
    _need(q.dim() == 4, f"{op}: q must be [batch, queries, q_heads, head_dim], got {list(q.shape)}")
    _need(k_pages.dim() == 4 and k_pages.shape == v_pages.shape,
          f"{op}: k_pages and v_pages must both be [kv_heads, total_pages, page_size, head_dim], got "
          f"{list(k_pages.shape)} and {list(v_pages.shape)}")
    b, nq, hq, d = q.shape
    hkv, total, page, d2 = k_pages.shape
    _need(d == d2, f"{op}: q head_dim {d} != pages head_dim {d2}")
    _need(hq % hkv == 0, f"{op}: q has {hq} heads, pages have {hkv} kv heads; q heads must be a multiple")
    _need(q.dtype == k_pages.dtype == v_pages.dtype and q.is_floating_point(),
          f"{op}: q and the pages must share one float dtype, got {q.dtype}, {k_pages.dtype}, {v_pages.dtype}")
    for name, x, shape in (("kv_lens", kv_lens, (b,)), ("effective_q_lens", effective_q_lens, (b,))):
        _need(x.dtype == torch.int32 and tuple(x.shape) == shape,
              f"{op}: {name} must be int32 {list(shape)}, got {x.dtype} {list(x.shape)}")
    _need(page_indices.dtype == torch.int32 and page_indices.dim() == 2 and page_indices.shape[0] == b,
          f"{op}: page_indices must be int32 [{b}, pages_per_seq], got {page_indices.dtype} "
          f"{list(page_indices.shape)}")
    pps = page_indices.shape[1]
    _need(num_kv_pages_per_compute_block > 0 and pps % num_kv_pages_per_compute_block == 0,
          f"{op}: pages_per_seq ({pps}) must be a multiple of num_kv_pages_per_compute_block "
          f"({num_kv_pages_per_compute_block})")
    _need(num_queries_per_compute_block > 0, f"{op}: num_queries_per_compute_block must be positive")
    if hasattr(page_indices, "_lt"):
        _checks.require(_checks.out_of_range(page_indices._lt, 0, total),
                        f"{op}: page_indices out of range: they must lie in [0, {total}) (total_pages)", IndexError)
        _checks.require(((kv_lens > pps * page) | (effective_q_lens > kv_lens) | (kv_lens < 0))._lt,
                        f"{op}: need 0 <= effective_q_lens <= kv_lens <= pages_per_seq * page_size ({pps * page})",
                        ValueError)
    platform = runtime.platform()
    impl = impl or paged_attention_impl(platform)
    _need(impl in _PAGED_IMPLS, f"{op}: impl must be None, 'pallas' or 'xla', got {impl!r}")
    bq = min(num_queries_per_compute_block, nq)
    if impl == "pallas" and platform == "tpu":  # Mosaic's tiling: blocks of (8, 128) or whole dims
        _need(bq == nq or bq % 8 == 0,
              f"{op}: num_queries_per_compute_block ({num_queries_per_compute_block}) must be a multiple of 8 or "
              f">= the query count ({nq}) for the TPU kernel")
        _need(page % 8 == 0, f"{op}: the TPU kernel needs a page_size that is a multiple of 8 (got {page})")
        _need(page * num_kv_pages_per_compute_block % 128 == 0,
              f"{op}: the TPU kernel needs num_kv_pages_per_compute_block * page_size to be a multiple of 128 "
              f"(got {num_kv_pages_per_compute_block} * {page})")
        _need(d < 128 or d % 128 == 0, f"{op}: the TPU kernel needs head_dim < 128 or a multiple of 128 (got {d})")
    if impl == "pallas" and platform != "tpu":
        impl = "interpret"
    kw = {}
    plan = _shard_plan(op, q, partition_spec, mesh, 0, 2, hkv, "k_pages/v_pages")
    if plan is not None:
        m, bs, hs = plan
        pages = (hs, None, None, None)
        # a pallas_call's results carry no varying-axes types: jax's check_vma must be off for it
        kw = dict(mesh=m, in_specs=[(bs, None, hs, None), pages, pages, (bs,), (bs, None), (bs,)],
                  out_specs=(bs, None, hs, None), check_vma=impl == "xla")
        metrics.counter_add("kernel_per_shard")
    return call_jax(_mqpa_entry, q, k_pages, v_pages, kv_lens, page_indices, effective_q_lens, impl=impl,
                    ppcb=int(num_kv_pages_per_compute_block), bq=int(bq),
                    soft_cap=None if attn_logits_soft_cap is None else float(attn_logits_soft_cap), **kw)



# --- F.scaled_dot_product_attention routed to flash_attention ---------------------
# TXC_SDPA_KERNEL (or set_sdpa_kernel): "auto" (default) routes SDPA calls the
# flash kernel can take to it on TPU when the kv length is at least
# _AUTO_MIN_KV (O(S) memory instead of the S x S logits; untimed here: no TPU),
# and on CUDA the bf16/f16 calls the Pallas GPU (Triton) kernel takes: on an
# H200 the issue-29 Llama step's device time was 19.3 ms with it against 47 ms
# with the core op (f32 scores then; cuDNN's kernel is the other candidate,
# bench/device_check.sh measures the three); "flash" routes every call without
# mask or dropout on every platform (CPU: the jax reference; GPU: the Triton
# kernel for bf16/f16 calls it takes, else the reference; for comparison);
# "cudnn" routes the calls cuDNN's fused attention takes on CUDA to it; "xla"
# never routes (the fused core sdpa op, csrc/ops/attention.cpp).
_SDPA_MODES = config.SETTINGS["TXC_SDPA_KERNEL"].choices  # ("auto", "flash", "cudnn", "xla")
_AUTO_MIN_KV = 1024
_sdpa_mode = None


def set_sdpa_kernel(mode: str) -> None:
    """Where F.scaled_dot_product_attention goes: "auto", "flash", "cudnn" or
    "xla" (overrides TXC_SDPA_KERNEL)."""
    global _sdpa_mode
    if mode not in _SDPA_MODES:
        raise ValueError(f"set_sdpa_kernel: mode must be one of {_SDPA_MODES}, got {mode!r}")
    _sdpa_mode = mode


def sdpa_kernel() -> str:
    """Where F.scaled_dot_product_attention goes: set_sdpa_kernel's choice, else TXC_SDPA_KERNEL."""
    if _sdpa_mode is not None:
        return _sdpa_mode
    return config.get("TXC_SDPA_KERNEL")


def sdpa_route(q, k, v, attn_mask, dropout_p, enable_gqa, platform=None) -> bool:
    """Whether this SDPA call goes to flash_attention: the mode allows it and
    the kernel takes it as is (4-D, no mask, no dropout, one float dtype,
    heads equal or GQA asked for; on TPU the Pallas kernel's block and
    head_dim limits)."""
    mode = sdpa_kernel()
    if mode == "xla":
        return False
    platform = platform or runtime.platform()
    if (mode == "auto" and platform not in ("tpu", "cuda")) or (mode == "cudnn" and platform != "cuda"):
        return False
    if attn_mask is not None or dropout_p > 0 or q.dim() != 4 or k.dim() != 4 or v.shape != k.shape:
        return False
    if not (q.dtype == k.dtype == v.dtype and q.is_floating_point()) or q.shape[0] != k.shape[0]:
        return False
    h, hkv, d, t = q.shape[1], k.shape[1], q.shape[3], k.shape[2]
    if q.shape[3] != k.shape[3] or h % hkv or (h != hkv and not enable_gqa):
        return False
    if platform == "tpu":
        if not (d < 128 or d % 128 == 0) or t % min(512, t):
            return False
        if mode == "auto" and t < _AUTO_MIN_KV:
            return False
    if platform == "cuda" and mode == "auto":
        return q.dtype in (torch.bfloat16, torch.float16) and _gpu_kernel_refusal(q, k, None, None, None) is None
    if mode == "cudnn":
        return _cudnn_refusal(q, k, None, None) is None
    return True
