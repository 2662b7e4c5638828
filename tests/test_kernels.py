"""Kernels on xla tensors vs their plain-torch references (CPU eager):
flash_attention (GQA, causal, segment ids, bias, f32/bf16, forward and
backward, inside scan_layers), multi_queries_paged_attention (ragged kv
lengths, partial pages, zero-length sequences, effective_q_lens, GQA),
grouped_matmul (ragged_dot and the megablox kernel interpreted, inside scan_layers
too; megablox lowered for TPU); bad input raises before compiling."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import kernels
from torch_xla_core.kernels import reference
from util import assert_scan_layers_match_loop

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _grads_match(fn_x, fn_c, inputs, tol, dev):
    xs = [t.detach().to(dev).requires_grad_(t.is_floating_point()) for t in inputs]
    cs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    ox, oc = fn_x(*xs), fn_c(*cs)
    torch.testing.assert_close(ox.cpu(), oc.detach(), **tol)
    g = torch.randn(oc.shape).to(oc.dtype)
    ox.backward(g.to(dev))
    oc.backward(g)
    for a, b in zip(xs, cs):
        if b.grad is not None:
            torch.testing.assert_close(a.grad.cpu(), b.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("h,hkv,s,t,causal,seg", [(4, 4, 8, 8, False, False), (4, 2, 8, 8, True, False),
                                                  (6, 2, 5, 9, False, True), (2, 1, 16, 16, True, True)])
def test_flash_attention_matches_reference(dev, dtype, h, hkv, s, t, causal, seg):
    b, d = 2, 16
    q, k, v = torch.randn(b, h, s, d).to(dtype), torch.randn(b, hkv, t, d).to(dtype), torch.randn(b, hkv, t, d).to(dtype)
    qs = torch.randint(0, 2, (b, s)).sort(-1).values if seg else None
    ks = torch.randint(0, 2, (b, t)).sort(-1).values if seg else None
    kw = dict(causal=causal, sm_scale=0.25)

    def fx(q_, k_, v_):
        return kernels.flash_attention(q_, k_, v_, q_segment_ids=None if qs is None else qs.to(dev),
                                       kv_segment_ids=None if ks is None else ks.to(dev), **kw)

    def fc(q_, k_, v_):
        return reference.flash_attention(q_, k_, v_, q_segment_ids=qs, kv_segment_ids=ks, **kw)

    _grads_match(fx, fc, [q, k, v], TOL[dtype], dev)


@pytest.mark.parametrize("size", [1, 9], ids=lambda s: f"x{s}")
def test_flash_attention_reference_bf16_has_the_fused_kernels_numerics(dev, size):
    """The jax path flash_attention runs on CPU (attention_jax.py), bf16, GQA, causal, inputs of std
    1 and 9: every product takes bf16 operands and returns float32 (no float32 copy of q, k or v:
    it cast them before), and output and gradients are as close to float64 as CPU eager's fused
    bf16 SDPA (within 2x; measured <= 1.02x)."""
    import collections
    import re
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 32, 16, generator=g) * size
    k, v = (torch.randn(2, 2, 32, 16, generator=g) * size for _ in range(2))
    go = torch.randn(2, 4, 32, 16, generator=g)

    def run(fn, d, dt):
        a = [t.to(dt).to(d, dt).requires_grad_() for t in (q, k, v)]
        o = fn(*a)
        o.backward(go.to(dt).to(d, dt))
        return [o.detach()] + [t.grad for t in a]

    x = run(lambda *a: kernels.flash_attention(*a, causal=True, sm_scale=0.25, impl="reference"), dev, torch.bfloat16)
    dots = collections.Counter(tuple(re.findall(r"tensor<(?:[0-9]+x)*([a-z]+[0-9]+)>", ln.rsplit(" : ", 1)[-1]))
                               for ln in txc.debug.stablehlo(x).splitlines() if "stablehlo.dot_general" in ln)
    assert set(dots) == {("bf16", "bf16", "f32")}, dots
    sdpa = lambda *a: F.scaled_dot_product_attention(*a, is_causal=True, scale=0.25, enable_gqa=True)  # noqa: E731
    c, e = run(sdpa, "cpu", torch.bfloat16), run(sdpa, "cpu", torch.float64)
    for n, a, b, r in zip(("out", "grad_q", "grad_k", "grad_v"), x, c, e):
        err, err_cpu = (a.cpu().double() - r).abs().max().item(), (b.double() - r).abs().max().item()
        assert err <= 2 * err_cpu, (n, err, err_cpu)


def test_flash_attention_reference_is_sdpa_without_masks():
    q, k, v = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    torch.testing.assert_close(reference.flash_attention(q, k, v, causal=True, sm_scale=0.3), ref)


def test_flash_attention_with_bias(dev):
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    ab = torch.randn(1, 2, 4, 6)
    _grads_match(lambda a, b, c, e: kernels.flash_attention(a, b, c, ab=e),
                 lambda a, b, c, e: reference.flash_attention(a, b, c, ab=e), [q, k, v, ab], TOL[torch.float32], dev)


def test_flash_attention_inside_scan_layers(dev):
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):  # x [B, H, S, D]
            y = self.proj(x)
            attn = kernels.flash_attention if x.device.type == "xla" else reference.flash_attention
            return x + attn(y, y, y, causal=True, sm_scale=0.3)

    assert_scan_layers_match_loop(torch.nn.ModuleList([Layer() for _ in range(3)]), torch.randn(1, 2, 6, 8), dev,
                                  grad_atol=1e-4)


def test_flash_attention_errors(dev):
    q = torch.randn(1, 3, 4, 8, device=dev)
    k = torch.randn(1, 2, 4, 8, device=dev)
    with pytest.raises(ValueError, match="multiple \\(GQA\\)"):
        kernels.flash_attention(q, k, k)
    with pytest.raises(ValueError, match="\\[batch, heads, seq, head_dim\\]"):
        kernels.flash_attention(q[0], k, k)
    with pytest.raises(ValueError, match="both q_segment_ids and kv_segment_ids"):
        kernels.flash_attention(q, q, q, q_segment_ids=torch.zeros(1, 4, dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="ab must be"):
        kernels.flash_attention(q, q, q, ab=torch.zeros(1, 3, 4, 5, device=dev))


def _paged_inputs(b, nq, hq, hkv, d, page, pps, kv_lens, eff, dtype=torch.float32):
    total = b * pps + 2
    q = torch.randn(b, nq, hq, d).to(dtype)
    kp, vp = torch.randn(hkv, total, page, d).to(dtype), torch.randn(hkv, total, page, d).to(dtype)
    pi = torch.randperm(total)[: b * pps].reshape(b, pps).to(torch.int32)
    return q, kp, vp, torch.tensor(kv_lens, dtype=torch.int32), pi, torch.tensor(eff, dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,kv_lens,eff", [(4, 4, [7, 16, 1], [3, 4, 1]),     # partial pages, prefix cache
                                                (8, 2, [0, 9, 12], [0, 4, 4]),     # zero-length sequence, GQA
                                                (2, 1, [16, 5, 3], [4, 1, 2])])    # decode row, chunked prefill
def test_multi_queries_paged_attention_matches_reference(dev, dtype, hq, hkv, kv_lens, eff):
    args = _paged_inputs(3, 4, hq, hkv, 8, 4, 4, kv_lens, eff, dtype)
    kw = dict(num_kv_pages_per_compute_block=2, num_queries_per_compute_block=4)
    out = kernels.multi_queries_paged_attention(*[a.to(dev) for a in args], **kw)
    ref = reference.multi_queries_paged_attention(*args)
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    if kv_lens[0] == 0:
        assert torch.equal(out.cpu()[0], torch.zeros_like(ref[0]))


def test_paged_reference_is_plain_causal_attention_for_full_prefill():
    # one sequence, eff == kv_len: ordinary causal attention over the gathered pages
    q, kp, vp, lens, pi, eff = _paged_inputs(1, 8, 2, 2, 8, 4, 2, [8], [8])
    ref = reference.multi_queries_paged_attention(q, kp, vp, lens, pi, eff)
    k = kp[:, pi[0].long()].reshape(2, 8, 8)[None]
    v = vp[:, pi[0].long()].reshape(2, 8, 8)[None]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True, scale=1.0)
    torch.testing.assert_close(ref, sdpa.transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_paged_attention_gradient(dev):
    args = _paged_inputs(2, 3, 4, 2, 8, 4, 2, [6, 8], [3, 3])
    _grads_match(lambda q, kp, vp: kernels.multi_queries_paged_attention(
                     q, kp, vp, *[a.to(dev) for a in (args[3], args[4], args[5])], 1, 3),
                 lambda q, kp, vp: reference.multi_queries_paged_attention(q, kp, vp, args[3], args[4], args[5]),
                 list(args[:3]), TOL[torch.float32], dev)


def test_paged_attention_errors(dev):
    q, kp, vp, lens, pi, eff = [a.to(dev) for a in _paged_inputs(2, 2, 4, 2, 8, 4, 4, [3, 4], [1, 1])]
    with pytest.raises(ValueError, match="multiple of num_kv_pages_per_compute_block"):
        kernels.multi_queries_paged_attention(q, kp, vp, lens, pi, eff, 3, 2)
    with pytest.raises(ValueError, match="kv_lens must be int32"):
        kernels.multi_queries_paged_attention(q, kp, vp, lens.long(), pi, eff, 2, 2)
    with pytest.raises(ValueError, match="q heads must be a multiple"):
        kernels.multi_queries_paged_attention(q[:, :, :3], kp, vp, lens, pi, eff, 2, 2)
    out = kernels.multi_queries_paged_attention(q, kp, vp, lens, pi + 100, eff, 2, 2)
    with pytest.raises(IndexError, match="page_indices out of range"):
        out.cpu()


@pytest.mark.parametrize("sizes", [[3, 0, 5], [0, 8, 0, 2]])
def test_grouped_matmul_matches_reference(dev, sizes):
    x, w = torch.randn(sum(sizes), 8), torch.randn(len(sizes), 8, 4)
    gs = torch.tensor(sizes, dtype=torch.int32)
    _grads_match(lambda a, b: kernels.grouped_matmul(a, b, gs.to(dev)),
                 lambda a, b: reference.grouped_matmul(a, b, gs), [x, w], TOL[torch.float32], dev)
    # same as torch's convention with cumulative offsets
    y = torch.nn.functional.grouped_mm(x.to(dev), w.to(dev), offs=torch.cumsum(gs, 0).int().to(dev))
    torch.testing.assert_close(y.cpu(), reference.grouped_matmul(x, w, gs), atol=1e-5, rtol=1e-5)


def test_grouped_matmul_errors(dev):
    x, w = torch.randn(6, 8, device=dev), torch.randn(2, 8, 4, device=dev)
    with pytest.raises(ValueError, match="sum to the row count 6"):
        kernels.grouped_matmul(x, w, torch.tensor([2, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match="x has K=8, w has K=5"):
        kernels.grouped_matmul(x, torch.randn(2, 5, 4, device=dev), torch.tensor([2, 4]))
    y = kernels.grouped_matmul(x, w, torch.tensor([2, 6], dtype=torch.int32, device=dev))
    with pytest.raises(ValueError, match="sum to the row count 6"):
        y.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("sizes,k,n", [([3, 0, 5], 8, 4), ([0, 20, 0, 7, 13], 16, 24), ([150, 0, 106], 136, 8)])
def test_grouped_matmul_megablox_kernel_matches_reference(dev, dtype, sizes, k, n):
    """jax's megablox gmm/tgmm (the TPU path) through Pallas' interpreter on CPU:
    plain HLO in our graph, forward and both gradients (tgmm for the weights);
    M not a multiple of the row tile, K/N not multiples of 128, empty groups."""
    pytest.importorskip("jax")
    x, w = torch.randn(sum(sizes), k).to(dtype), torch.randn(len(sizes), k, n).to(dtype)
    gs = torch.tensor(sizes, dtype=torch.int32)
    y = kernels.grouped_matmul(x.to(dev), w.to(dev), gs.to(dev), impl="megablox")
    text = txc.debug.stablehlo([y])
    assert "stablehlo.while" in text and "custom_call" not in text
    tol = TOL[dtype] if dtype == torch.float32 else dict(atol=6e-2, rtol=2e-2)
    _grads_match(lambda a, b: kernels.grouped_matmul(a, b, gs.to(dev), impl="megablox"),
                 lambda a, b: reference.grouped_matmul(a.float(), b.float(), gs).to(dtype), [x, w], tol, dev)
    assert not txc.metrics.fallbacks()


def test_grouped_matmul_impl_switch(dev, monkeypatch):
    from torch_xla_core.kernels.gmm import grouped_matmul_impl
    x, w, gs = torch.randn(6, 8, device=dev), torch.randn(2, 8, 4, device=dev), torch.tensor([2, 4], device=dev)
    assert grouped_matmul_impl("cpu") == "ragged_dot" and grouped_matmul_impl("tpu") == "megablox"
    # the interpreted megablox kernel is a while loop over its grid; ragged_dot is a dense masked dot on CPU
    assert "stablehlo.while" not in txc.debug.stablehlo([kernels.grouped_matmul(x, w, gs)])
    monkeypatch.setenv("TXC_GROUPED_MATMUL_IMPL", "megablox")
    y = kernels.grouped_matmul(x, w, gs)
    assert "stablehlo.while" in txc.debug.stablehlo([y])
    torch.testing.assert_close(y.cpu(), reference.grouped_matmul(x.cpu(), w.cpu(), gs.cpu()), atol=1e-5, rtol=1e-5)
    monkeypatch.setenv("TXC_GROUPED_MATMUL_IMPL", "cublas")
    with pytest.raises(ValueError, match="TXC_GROUPED_MATMUL_IMPL must be one of"):
        kernels.grouped_matmul(x, w, gs)
    with pytest.raises(ValueError, match="impl must be None, 'megablox' or 'ragged_dot'"):
        kernels.grouped_matmul(x, w, gs, impl="dense")
    with pytest.raises(ValueError, match="megablox kernel takes float32 or bfloat16"):
        kernels.grouped_matmul(x.half(), w.half(), gs, impl="megablox")
    with pytest.raises(ValueError, match="sum to the row count 6"):  # bad sizes: same clear error on this path
        kernels.grouped_matmul(x, w, torch.tensor([2, 6], dtype=torch.int32), impl="megablox")
    y = kernels.grouped_matmul(x, w, torch.tensor([1, 6], dtype=torch.int32, device=dev), impl="megablox")
    with pytest.raises(ValueError, match="sum to the row count 6"):
        y.cpu()


@pytest.mark.parametrize("impl", ["megablox", "ragged_dot"])
def test_grouped_matmul_inside_scan_layers(dev, impl):
    """Expert layers (rows grouped by expert) stacked with scan_layers: one
    traced body, forward and gradients as the unrolled CPU reference."""
    sizes = torch.tensor([5, 0, 3, 4], dtype=torch.int32)

    class Experts(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 8, 8) * 0.3)

        def forward(self, x):
            if x.device.type == "xla":
                return x + torch.tanh(kernels.grouped_matmul(x, self.w, sizes.to(x.device), impl=impl))
            return x + torch.tanh(reference.grouped_matmul(x, self.w, sizes))

    assert_scan_layers_match_loop(torch.nn.ModuleList([Experts() for _ in range(3)]), torch.randn(12, 8), dev)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_matmul_megablox_lowers_for_tpu_on_cpu(dtype):
    """The TPU path through Mosaic's lowering on the CPU: gmm forward; the
    backward holds gmm (input gradient) and tgmm (weight gradient)."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from torch_xla_core.kernels.gmm import _grouped_entry
    sd = jax.ShapeDtypeStruct
    shapes = (sd((200, 256), dtype), sd((8, 256, 384), dtype), sd((8,), jnp.int32))

    def fwd(x, w, gs):
        return _grouped_entry(x, w, gs, impl="megablox")

    def fwd_bwd(x, w, gs):
        y, vjp = jax.vjp(lambda a, b: fwd(a, b, gs), x, w)
        return y, vjp(y)

    lower = lambda fn: jax.jit(fn).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()  # noqa: E731
    assert lower(fwd).count("tpu_custom_call") == 1
    text = lower(fwd_bwd)
    assert text.count("tpu_custom_call") == 3 and "tgmm" in text


def test_flash_attention_pallas_kernel_lowers_for_tpu_on_cpu():
    """CI without a TPU: jax's cross-platform lowering runs the Pallas/Mosaic lowering of the TPU path
    (forward and backward, GQA, causal, segment ids) and would raise on a Mosaic error."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from torch_xla_core.kernels.attention import _flash_entry

    sd = jax.ShapeDtypeStruct
    shapes = (sd((1, 4, 256, 128), jnp.float32), sd((1, 2, 256, 128), jnp.float32),
              sd((1, 2, 256, 128), jnp.float32), sd((1, 256), jnp.int32), sd((1, 256), jnp.int32))

    def fwd(q, k, v, qs, ks):
        return _flash_entry(q, k, v, qs, ks, has_ab=False, has_seg=True, causal=True, sm_scale=0.5, impl="pallas")

    def bwd(q, k, v, qs, ks):
        return jax.grad(lambda a, b, c: fwd(a, b, c, qs, ks).sum(), argnums=(0, 1, 2))(q, k, v)

    for fn, calls in ((fwd, 1), (bwd, 3)):
        text = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
        assert text.count("tpu_custom_call") >= calls


def test_flash_attention_gpu_kernel_lowers_for_cuda_on_cpu():
    """CI without a GPU: the GPU path (jax's Pallas GPU kernel, Triton) lowers for CUDA, forward (one Triton
    call) and backward (forward residuals, dq and dk/dv kernels), GQA, causal, one segment-id array."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from torch_xla_core.kernels.attention import _flash_entry

    sd = jax.ShapeDtypeStruct
    shapes = (sd((1, 4, 256, 64), jnp.bfloat16), sd((1, 2, 256, 64), jnp.bfloat16),
              sd((1, 2, 256, 64), jnp.bfloat16), sd((1, 256), jnp.int32))

    def fwd(q, k, v, seg):
        return _flash_entry(q, k, v, seg, has_ab=False, has_seg=True, causal=True, sm_scale=0.5, impl="gpu")

    def bwd(q, k, v, seg):
        return jax.grad(lambda a, b, c: fwd(a, b, c, seg).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)

    for fn, calls in ((fwd, 1), (bwd, 3)):
        text = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("xla.gpu.triton") == calls


@pytest.mark.parametrize("h,hkv,causal,seg", [(2, 2, True, False), (4, 2, False, True), (2, 1, True, True)])
def test_flash_attention_gpu_kernel_interpreted_matches_cpu(dev, h, hkv, causal, seg):
    """The GPU kernel's own body (forward and its Triton backward), run through Pallas' interpreter on CPU,
    against the plain-torch reference: values and gradients."""
    b, s, d = 1, 64, 16
    q, k, v = torch.randn(b, h, s, d), torch.randn(b, hkv, s, d), torch.randn(b, hkv, s, d)
    ids = torch.randint(0, 3, (b, s)).sort(-1).values if seg else None

    def fx(q_, k_, v_):
        i = None if ids is None else ids.to(dev)
        return kernels.flash_attention(q_, k_, v_, causal=causal, q_segment_ids=i, kv_segment_ids=i,
                                       sm_scale=0.25, impl="interpret")

    def fc(q_, k_, v_):
        return reference.flash_attention(q_, k_, v_, causal=causal, q_segment_ids=ids, kv_segment_ids=ids,
                                         sm_scale=0.25)

    _grads_match(fx, fc, [q, k, v], dict(atol=1e-4, rtol=1e-4), dev)


def test_flash_attention_gpu_kernel_refusals_name_the_reason(dev):
    q = torch.randn(1, 2, 64, 16, device=dev)
    k = torch.randn(1, 2, 32, 16, device=dev)
    with pytest.raises(ValueError, match="q and kv of one length"):
        kernels.flash_attention(q, k, k, impl="interpret")
    with pytest.raises(ValueError, match="multiple of 128"):
        kernels.flash_attention(q[:, :, :48], q[:, :, :48], q[:, :, :48], impl="interpret")
    ids = torch.zeros(1, 64, dtype=torch.int32, device=dev)
    with pytest.raises(ValueError, match="same tensor as q_segment_ids and kv_segment_ids"):
        kernels.flash_attention(q, q, q, q_segment_ids=ids, kv_segment_ids=ids.clone(), impl="interpret")
    with pytest.raises(ValueError, match="no bias"):
        kernels.flash_attention(q, q, q, ab=torch.zeros(1, 2, 64, 64, device=dev), impl="interpret")
    with pytest.raises(ValueError, match="impl='pallas' needs a TPU or a GPU .*platform is cpu"):
        kernels.flash_attention(q, q, q, impl="pallas")


# --- F.scaled_dot_product_attention routed to flash_attention -------------------------

@pytest.fixture
def sdpa_mode():
    from torch_xla_core.kernels import attention
    yield attention.set_sdpa_kernel
    attention._sdpa_mode = None


@pytest.mark.parametrize("causal,gqa,scale", [(False, False, None), (True, True, None), (True, False, 0.3)])
def test_sdpa_routed_to_flash_matches_cpu(sdpa_mode, causal, gqa, scale):
    import torch.nn.functional as F
    from torch_xla_core import metrics
    sdpa_mode("flash")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2 if gqa else 4, 8, 16, generator=g, requires_grad=True) for _ in range(2))
    xs = [t.detach().to(txc.device()).requires_grad_() for t in (q, k, v)]
    r = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa)
    metrics.clear()
    xr = F.scaled_dot_product_attention(*xs, is_causal=causal, scale=scale, enable_gqa=gqa)
    assert metrics.counters().get("sdpa_flash") == 1
    assert "jax_call" in txc.debug.graph_text([xr]) or "func.call" in txc.debug.stablehlo([xr])
    r.square().sum().backward()
    xr.square().sum().backward()
    torch.testing.assert_close(xr.cpu(), r.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip(xs, (q, k, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


def test_sdpa_routing_rules(sdpa_mode):
    import torch.nn.functional as F
    from torch_xla_core import metrics
    from torch_xla_core.kernels.attention import sdpa_route
    x = torch.randn(1, 2, 8, 16, device=txc.device())
    long = torch.randn(1, 2, 1024, 128)
    sdpa_mode("auto")  # default: the core sdpa op off TPU; on TPU from kv length 1024
    assert not sdpa_route(x, x, x, None, 0.0, False)
    assert sdpa_route(long, long, long, None, 0.0, False, platform="tpu")
    assert not sdpa_route(long[:, :, :512], long[:, :, :512], long[:, :, :512], None, 0.0, False, platform="tpu")
    odd = torch.randn(1, 2, 1024, 192)  # head_dim the Pallas kernel cannot take (>= 128, not a multiple)
    assert not sdpa_route(odd, odd, odd, None, 0.0, False, platform="tpu")
    sdpa_mode("flash")
    assert sdpa_route(x, x, x, None, 0.0, False)
    assert not sdpa_route(x, x, x, torch.ones(8, 8, dtype=torch.bool), 0.0, False)  # a mask: the core op
    assert not sdpa_route(x, x, x, None, 0.1, False)  # dropout: the math path
    assert not sdpa_route(x, x[:, :1], x[:, :1], None, 0.0, False)  # head counts differ without enable_gqa
    metrics.clear()
    y = F.scaled_dot_product_attention(x, x, x, attn_mask=torch.ones(8, 8, dtype=torch.bool, device=txc.device()))
    assert "sdpa_flash" not in metrics.counters() and "sdpa" in txc.debug.graph_text([y])
    sdpa_mode("xla")
    assert not sdpa_route(long, long, long, None, 0.0, False, platform="tpu")
    with pytest.raises(ValueError, match="set_sdpa_kernel: mode must be one of"):
        sdpa_mode("fast")


def test_sdpa_auto_on_cuda_picks_the_fused_kernel(sdpa_mode):
    """On CUDA, "auto" routes bf16/f16 SDPA calls the Pallas GPU kernel takes (causal, GQA as transformers'
    Llama calls it: no mask, enable_gqa=True) to flash_attention, whose default there is that kernel; f32,
    masks, and shapes it cannot take keep the core op. "cudnn" routes what cuDNN's fused attention takes."""
    from torch_xla_core.kernels.attention import sdpa_route
    q = torch.randn(1, 4, 256, 64, dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 256, 64, dtype=torch.bfloat16)
    sdpa_mode("auto")
    assert sdpa_route(q, kv, kv, None, 0.0, True, platform="cuda")
    assert sdpa_route(q.half(), kv.half(), kv.half(), None, 0.0, True, platform="cuda")
    assert not sdpa_route(q, kv, kv, None, 0.0, True, platform="cpu")
    assert not sdpa_route(q.float(), kv.float(), kv.float(), None, 0.0, True, platform="cuda")  # f32: TF32 dots
    assert not sdpa_route(q, kv, kv, torch.ones(256, 256, dtype=torch.bool), 0.0, True, platform="cuda")
    assert not sdpa_route(q, kv, kv, None, 0.1, True, platform="cuda")  # dropout: the math path
    assert not sdpa_route(q[:, :, :100], kv[:, :, :100], kv[:, :, :100], None, 0.0, True, platform="cuda")
    assert not sdpa_route(q[:, :, :128], kv, kv, None, 0.0, True, platform="cuda")  # decoding: q shorter than kv
    assert not sdpa_route(q[..., :8], kv[..., :8], kv[..., :8], None, 0.0, True, platform="cuda")  # head_dim 8
    assert not sdpa_route(q, kv, kv, None, 0.0, False, platform="cuda")  # heads differ without enable_gqa
    sdpa_mode("cudnn")
    assert sdpa_route(q, kv, kv, None, 0.0, True, platform="cuda")
    assert not sdpa_route(q, kv, kv, None, 0.0, True, platform="cpu")
    wide = torch.randn(1, 2, 256, 256, dtype=torch.bfloat16)  # head_dim over 128
    assert not sdpa_route(wide, wide, wide, None, 0.0, False, platform="cuda")
    assert not sdpa_route(q.float(), kv.float(), kv.float(), None, 0.0, True, platform="cuda")
    sdpa_mode("xla")
    assert not sdpa_route(q, kv, kv, None, 0.0, True, platform="cuda")


@pytest.mark.parametrize("causal", [True, False])
def test_cudnn_attention_layout_matches_torch(causal):
    """The cuDNN entry's layout (our [B, H, S, D] to jax's [B, S, H, D] and back, GQA, scale, causal), run
    with jax's own implementation on CPU (cuDNN's needs a GPU) against torch's SDPA."""
    jax = pytest.importorskip("jax")
    import numpy as np
    import torch.nn.functional as F
    from torch_xla_core.kernels.attention import _cudnn_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 16, 8, generator=g), torch.randn(2, 2, 16, 8, generator=g), \
        torch.randn(2, 2, 16, 8, generator=g)
    got = _cudnn_attention(*(jax.numpy.asarray(t.numpy()) for t in (q, k, v)), causal=causal, sm_scale=0.3,
                           implementation="xla")
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(torch.from_numpy(np.array(got)), want, atol=1e-5, rtol=1e-5)


def test_flash_attention_cudnn_needs_cuda(dev):
    q = torch.randn(1, 2, 64, 16, device=dev, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="impl='cudnn' .*needs a CUDA GPU .*platform is cpu"):
        kernels.flash_attention(q, q, q, impl="cudnn")


def test_flash_gpu_kernel_interpreted_bf16_as_llama_calls_it(dev):
    """What "auto" runs on CUDA for a transformers Llama's attention (bf16, GQA, causal, no mask), through
    Pallas' interpreter: values and gradients within bf16 rounding of CPU eager's bf16 SDPA."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 64, 16, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 64, 16, generator=g).bfloat16() for _ in range(2))

    def fx(q_, k_, v_):
        return kernels.flash_attention(q_, k_, v_, causal=True, sm_scale=0.25, impl="interpret")

    def fc(q_, k_, v_):
        return F.scaled_dot_product_attention(q_, k_, v_, is_causal=True, scale=0.25, enable_gqa=True)

    _grads_match(fx, fc, [q, k, v], TOL[torch.bfloat16], dev)
