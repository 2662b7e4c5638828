"""The Pallas multi-query paged attention kernel (kernels/paged_attention.py)
on xla tensors: on CPU the SAME kernel body runs through Pallas' interpreter
as plain HLO inside our graph; its numerics are checked against
kernels/reference.py over ragged kv lengths, GQA ratios, partial last pages,
zero-length sequences, prefix offsets (effective_q_lens), soft cap, f32 and
bf16, forward and backward, inside scan_layers. The TPU path is checked by
lowering the kernel for the TPU platform on the CPU (Mosaic custom call)."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import kernels
from torch_xla_core.kernels import reference
from util import assert_scan_layers_match_loop

jax = pytest.importorskip("jax")

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def _inputs(b, nq, hq, hkv, d, page, pps, kv_lens, eff, dtype=torch.float32, nan_pages=0):
    """Random q/pages and a random page table; nan_pages extra pages full of
    NaN that the table does not reference."""
    total = b * pps + 2
    q = torch.randn(b, nq, hq, d).to(dtype)
    kp = torch.randn(hkv, total + nan_pages, page, d).to(dtype)
    vp = torch.randn(hkv, total + nan_pages, page, d).to(dtype)
    kp[:, total:], vp[:, total:] = float("nan"), float("nan")
    pi = torch.randperm(total)[: b * pps].reshape(b, pps).to(torch.int32)
    return q, kp, vp, torch.tensor(kv_lens, dtype=torch.int32), pi, torch.tensor(eff, dtype=torch.int32)


def _run(args, ppcb, bq, impl="pallas", soft_cap=None, dev=None):
    dev = dev or txc.device()
    return kernels.multi_queries_paged_attention(*[a.to(dev) for a in args], ppcb, bq,
                                                 attn_logits_soft_cap=soft_cap, impl=impl)


CASES = [  # b, nq, hq, hkv, d, page, pps, kv_lens, eff, ppcb, bq
    (3, 4, 4, 4, 8, 4, 4, [7, 16, 1], [3, 4, 1], 2, 4),        # MHA, partial last pages, prefix cache
    (3, 5, 8, 2, 8, 4, 4, [0, 9, 12], [0, 4, 5], 2, 2),        # zero-length sequence, GQA 4, bq not dividing Q
    (3, 4, 2, 1, 16, 4, 4, [16, 5, 3], [4, 1, 2], 1, 3),       # MQA, decode row (eff 1), chunked prefill
    (2, 8, 8, 1, 8, 8, 4, [32, 19], [8, 8], 4, 8),             # GQA 8, one kv block per sequence
    (2, 6, 6, 2, 8, 2, 6, [11, 6], [6, 2], 3, 4),              # GQA 3, page size 2, padding queries past eff
    (2, 8, 4, 2, 128, 16, 16, [200, 37], [8, 8], 8, 8),        # TPU-like tiles: 128-wide kv blocks, D 128
    (2, 4, 2, 1, 8, 48, 4, [150, 40], [4, 4], 4, 4),           # kv block 192 (> 128, not a multiple)
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_pallas_kernel_matches_reference(dev, dtype, case):
    *shape, kv_lens, eff, ppcb, bq = case
    args = _inputs(*shape, kv_lens, eff, dtype)
    out = _run(args, ppcb, bq)
    text = txc.debug.stablehlo([out])
    assert "stablehlo.while" in text and "custom_call" not in text  # the interpreted kernel: plain HLO, in-graph
    ref = reference.multi_queries_paged_attention(*args)
    torch.testing.assert_close(out.cpu(), ref, **TOL[dtype])
    for i, n in enumerate(kv_lens):
        if n == 0:
            assert torch.equal(out.cpu()[i], torch.zeros_like(ref[i]))
    assert not txc.metrics.fallbacks()


def test_pallas_kernel_soft_cap(dev):
    args = _inputs(2, 4, 4, 2, 8, 4, 4, [13, 6], [4, 2])
    args[0].mul_(8.0)  # logits well past the cap
    out = _run(args, 2, 4, soft_cap=5.0)
    ref = reference.multi_queries_paged_attention(*args, attn_logits_soft_cap=5.0)
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])
    assert not torch.allclose(ref, reference.multi_queries_paged_attention(*args), atol=1e-2)


def test_pallas_kernel_reads_no_page_past_the_kv_length(dev):
    """Page-table entries of kv blocks past a sequence's length point at NaN
    pages: the kernel's index maps never fetch them (the gather
    implementation would, and return NaN)."""
    q, kp, vp, lens, pi, eff = _inputs(2, 4, 4, 2, 8, 4, 6, [5, 9], [2, 4], nan_pages=1)
    nan_page = kp.shape[1] - 1
    poisoned = pi.clone()
    poisoned[0, 2:] = nan_page  # kv blocks of 2 pages: sequence 0 uses block 0 only
    poisoned[1, 4:] = nan_page  # sequence 1 uses blocks 0 and 1
    out = _run((q, kp, vp, lens, poisoned, eff), 2, 4)
    torch.testing.assert_close(out.cpu(), reference.multi_queries_paged_attention(q, kp, vp, lens, pi, eff),
                               **TOL[torch.float32])
    assert torch.isnan(_run((q, kp, vp, lens, poisoned, eff), 2, 4, impl="xla").cpu()).any()


def test_pallas_kernel_gradient(dev):
    args = _inputs(2, 3, 4, 2, 8, 4, 2, [6, 8], [3, 3])
    xs = [a.detach().to(dev).requires_grad_() for a in args[:3]]
    cs = [a.detach().clone().requires_grad_() for a in args[:3]]
    out = kernels.multi_queries_paged_attention(*xs, *[a.to(dev) for a in args[3:]], 1, 3, impl="pallas")
    ref = reference.multi_queries_paged_attention(*cs, *args[3:])
    g = torch.randn(ref.shape)
    out.backward(g.to(dev))
    ref.backward(g)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), **TOL[torch.float32])
    for a, b in zip(xs, cs):
        torch.testing.assert_close(a.grad.cpu(), b.grad, atol=1e-4, rtol=1e-4)


def test_pallas_kernel_inside_scan_layers(dev):
    """A decoder-ish layer stack over one paged kv cache: the kernel runs in
    the scan body (one compiled body for all layers), matching the
    unrolled CPU reference, gradients included."""
    q0, kp, vp, lens, pi, eff = _inputs(2, 4, 4, 2, 8, 4, 4, [10, 7], [4, 3])

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):  # x [B, Q, Hq, D]
            y = self.proj(x)
            if x.device.type == "xla":
                pages = [t.to(x.device) for t in (kp, vp, lens, pi, eff)]
                return x + kernels.multi_queries_paged_attention(y, *pages[:2], *pages[2:], 2, 4, impl="pallas")
            return x + reference.multi_queries_paged_attention(y, kp, vp, lens, pi, eff)

    assert_scan_layers_match_loop(torch.nn.ModuleList([Layer() for _ in range(3)]), q0, dev, atol=1e-4)


def test_impl_switch(dev, monkeypatch):
    from torch_xla_core.kernels.attention import paged_attention_impl
    args = _inputs(2, 4, 4, 2, 8, 4, 4, [10, 7], [4, 3])
    assert paged_attention_impl("cpu") == "xla" and paged_attention_impl("tpu") == "pallas"
    default = _run(args, 2, 4, impl=None)
    assert "stablehlo.while" not in txc.debug.stablehlo([default])  # the gather implementation
    monkeypatch.setenv("TXC_PAGED_ATTENTION_IMPL", "pallas")
    assert paged_attention_impl("cpu") == "pallas"
    forced = _run(args, 2, 4, impl=None)
    assert "stablehlo.while" in txc.debug.stablehlo([forced])
    torch.testing.assert_close(forced.cpu(), default.cpu(), **TOL[torch.float32])
    monkeypatch.setenv("TXC_PAGED_ATTENTION_IMPL", "mosaic")
    with pytest.raises(ValueError, match="TXC_PAGED_ATTENTION_IMPL must be one of"):
        _run(args, 2, 4, impl=None)
    with pytest.raises(ValueError, match="impl must be None, 'pallas' or 'xla'"):
        _run(args, 2, 4, impl="triton")


def test_tpu_block_size_errors_before_compiling(dev, monkeypatch):
    from torch_xla_core import runtime
    args = _inputs(2, 12, 4, 2, 8, 4, 4, [10, 7], [4, 3])
    monkeypatch.setattr(runtime, "platform", lambda: "tpu")
    txc.metrics.clear()
    with pytest.raises(ValueError, match=r"num_queries_per_compute_block \(4\) must be a multiple of 8"):
        _run(args, 2, 4)
    args6 = _inputs(2, 8, 4, 2, 8, 6, 4, [10, 7], [4, 3])
    with pytest.raises(ValueError, match="page_size that is a multiple of 8"):
        _run(args6, 2, 8)
    args8 = _inputs(2, 8, 4, 2, 8, 8, 4, [10, 7], [4, 3])
    with pytest.raises(ValueError, match=r"num_kv_pages_per_compute_block \* page_size to be a multiple of 128"):
        _run(args8, 2, 8)
    assert not txc.metrics.counters().get("compile")


@pytest.mark.parametrize("dtype,hq,hkv,d,soft_cap", [("float32", 8, 2, 128, None), ("bfloat16", 4, 4, 64, 30.0),
                                                     ("bfloat16", 16, 2, 256, None)])
def test_pallas_kernel_lowers_for_tpu_on_cpu(dtype, hq, hkv, d, soft_cap):
    """CI without a TPU: the kernel goes through Pallas' Mosaic lowering for
    the TPU platform (a Mosaic lowering error raises here), forward and
    backward; the result holds the Mosaic custom call."""
    import jax.numpy as jnp
    from torch_xla_core.kernels.attention import _mqpa_entry
    sd = jax.ShapeDtypeStruct
    b, nq, page, pps, total = 2, 16, 16, 16, 40
    shapes = (sd((b, nq, hq, d), dtype), sd((hkv, total, page, d), dtype), sd((hkv, total, page, d), dtype),
              sd((b,), jnp.int32), sd((b, pps), jnp.int32), sd((b,), jnp.int32))

    def fwd(*a):
        return _mqpa_entry(*a, impl="pallas", ppcb=8, bq=8, soft_cap=soft_cap)

    def fwd_bwd(*a):  # output and gradients (the backward is the gather implementation's vjp)
        out, vjp = jax.vjp(lambda q, k, v: fwd(q, k, v, *a[3:]), *a[:3])
        return out, vjp(out)

    text = jax.jit(fwd).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 1 and "multi_queries_paged_attention" in text
    assert jax.jit(fwd_bwd).trace(*shapes).lower(lowering_platforms=("tpu",)).as_text().count("tpu_custom_call") == 1
