"""Neural-network ops (torch_xla_core/_ops/nn.py, csrc/ops/nn.cpp): softmax,
layer/RMS norm, nll/cross-entropy, scaled dot-product attention, embedding,
mse and bce-with-logits, forward and backward against CPU eager; a small
GPT-style block; errors that name the op."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_xla_core as txc
from util import assert_matches_cpu

aten = torch.ops.aten


def rg(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype).requires_grad_()


# ---- softmax -------------------------------------------------------------------

@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax(fn, dim):
    assert_matches_cpu(lambda x: fn(x, dim), rg(3, 5, 7) * 4)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax])
def test_softmax_bf16(fn):
    out = assert_matches_cpu(lambda x: fn(x, -1), rg(4, 9, dtype=torch.bfloat16), atol=2e-2, rtol=2e-2)
    assert out.dtype == torch.bfloat16


def test_softmax_dtype_arg():
    x = torch.randn(4, 9).to(torch.bfloat16)
    out = assert_matches_cpu(lambda x: F.softmax(x, -1, dtype=torch.float32), x)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("op", [aten._softmax, aten._log_softmax])
def test_half_to_float(op, dev):
    # half_to_float is a CUDA-kernel feature (CPU refuses it): compare with the upcast input on CPU.
    x = torch.randn(3, 6).half()
    out = op(x.to(dev), -1, True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), op(x.float(), -1, False), atol=1e-5, rtol=1e-5)
    g = torch.randn(3, 6)
    back = {aten._softmax: aten._softmax_backward_data, aten._log_softmax: aten._log_softmax_backward_data}[op]
    gi = back(g.to(dev), out, -1, torch.float16)
    assert gi.dtype == torch.float16
    torch.testing.assert_close(gi.cpu(), back(g, op(x.float(), -1, False), -1, torch.float32).half())


def test_safe_softmax_masked_rows():
    x = torch.tensor([[1.0, 2.0, 3.0], [float("-inf")] * 3, [0.0, float("-inf"), 1.0]])
    out = assert_matches_cpu(lambda x: aten._safe_softmax(x, -1), x)
    assert (out.cpu()[1] == 0).all()


# ---- layer norm / RMS norm -------------------------------------------------------

@pytest.mark.parametrize("shape,affine", [((7,), True), ((7,), False), ((5, 7), True)])
def test_layer_norm(shape, affine):
    args = (rg(3, 5, 7) * 3 + 1,) + ((rg(*shape), rg(*shape)) if affine else ())
    assert_matches_cpu(lambda x, *wb: F.layer_norm(x, shape, *wb, eps=1e-5), *args, atol=1e-4)


def test_native_layer_norm_outputs():
    x, w = torch.randn(2, 3, 8), torch.randn(8)
    out = assert_matches_cpu(lambda x, w: aten.native_layer_norm(x, [8], w, None, 1e-5), x, w, atol=1e-5)
    assert [tuple(t.shape) for t in out] == [(2, 3, 8), (2, 3, 1), (2, 3, 1)]


def test_layer_norm_bias_only_grad():
    x, w, b = rg(4, 6), torch.randn(6), rg(6)
    assert_matches_cpu(lambda x, w, b: F.layer_norm(x, (6,), w, b), x, w, b, atol=1e-4)


def test_layer_norm_bf16():
    assert_matches_cpu(lambda x, w, b: F.layer_norm(x, (16,), w, b), rg(4, 16, dtype=torch.bfloat16),
                       rg(16, dtype=torch.bfloat16), rg(16, dtype=torch.bfloat16), atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("shape,weight,eps", [((7,), True, 1e-5), ((7,), False, None), ((5, 7), True, None)])
def test_rms_norm(shape, weight, eps):
    args = (rg(3, 5, 7),) + ((rg(*shape),) if weight else ())
    assert_matches_cpu(lambda x, *w: F.rms_norm(x, shape, *w, eps=eps), *args, atol=1e-4)


def test_rms_norm_module_is_fused(dev):
    torch.manual_seed(1)
    m = nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        m.weight.mul_(torch.rand(16) + 0.5)
    x = rg(4, 16)
    assert_matches_cpu(lambda x: m.to(x.device)(x), x, atol=1e-4)
    # One fused op forward (not pow/mean/add/rsqrt/mul/mul), one backward.
    before = dict(txc.metrics.counters())
    y = nn.RMSNorm(16).to(dev)(x.detach().to(dev).requires_grad_())
    assert "_RMSNorm" in type(y.grad_fn).__name__
    assert {k for k in txc.metrics.counters() if k.startswith("decomposed::")} == \
           {k for k in before if k.startswith("decomposed::")}


def test_rms_norm_bf16():
    assert_matches_cpu(lambda x, w: F.rms_norm(x, (16,), w), rg(4, 16, dtype=torch.bfloat16),
                       rg(16, dtype=torch.bfloat16), atol=3e-2, rtol=2e-2)


def test_rms_norm_no_grad(dev):
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = F.rms_norm(x.to(dev), (8,), eps=1e-6)
    torch.testing.assert_close(out.cpu(), F.rms_norm(x, (8,), eps=1e-6), atol=1e-5, rtol=1e-5)


# ---- nll / cross-entropy -------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy(reduction, weighted):
    t = torch.tensor([0, 1, 4, -100, 2, 3, 4])
    w = (torch.rand(5) + 0.1,) if weighted else ()
    assert_matches_cpu(lambda x, t, *w: F.cross_entropy(x, t, *w, reduction=reduction), rg(7, 5), t, *w)


def test_cross_entropy_ignore_index_and_label_smoothing():
    t = torch.tensor([0, 1, 4, 1, 2, 3])
    assert_matches_cpu(lambda x, t: F.cross_entropy(x, t, ignore_index=1, label_smoothing=0.1), rg(6, 5), t)


def test_cross_entropy_nd():  # (N, C, d) -> nll_loss2d_forward
    assert_matches_cpu(lambda x, t: F.cross_entropy(x, t), rg(2, 5, 3, 2), torch.randint(0, 5, (2, 3, 2)))


def test_cross_entropy_probability_targets():
    assert_matches_cpu(lambda x, t: F.cross_entropy(x, t), rg(6, 5), torch.softmax(torch.randn(6, 5), -1))


def test_nll_loss_unbatched():
    assert_matches_cpu(lambda x, t: F.nll_loss(x, t), rg(4), torch.tensor(2))


def test_nll_loss_total_weight_and_all_ignored(dev):
    x, t, w = torch.randn(4, 3), torch.tensor([0, 2, -100, 1]), torch.rand(3)
    for red in (0, 1, 2):
        assert_matches_cpu(lambda x, t, w: aten.nll_loss_forward(x, t, w, red, -100), x, t, w)
    out, total = aten.nll_loss_forward(x.to(dev), torch.full((4,), -100).to(dev), None, 1, -100)
    assert torch.isnan(out.cpu()) and total.cpu() == 0


# ---- scaled dot-product attention --------------------------------------------------------

def sdpa(*a, **k):
    return F.scaled_dot_product_attention(*a, **k)


def test_sdpa_causal_is_fused(dev):
    q, k, v = rg(2, 3, 6, 8), rg(2, 3, 6, 8), rg(2, 3, 6, 8)
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v, is_causal=True), q, k, v, atol=1e-4)
    out = sdpa(*(t.detach().to(dev).requires_grad_() for t in (q, k, v)), is_causal=True)
    assert type(out.grad_fn).__name__ == "ScaledDotProductFusedAttentionOverrideableBackward0"


def test_sdpa_bool_mask_cross_attention():
    m = torch.rand(5, 7) > 0.3
    m[:, 0] = True
    assert_matches_cpu(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), rg(2, 3, 5, 4), rg(2, 3, 7, 4), rg(2, 3, 7, 6),
                       m, atol=1e-4)
    # causal with L != S: top-left aligned, as torch's tril(ones(L, S))
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v, is_causal=True), rg(1, 2, 4, 8), rg(1, 2, 6, 8), rg(1, 2, 6, 8),
                       atol=1e-4)


def test_sdpa_fully_masked_row():
    m = torch.rand(5, 6) > 0.3
    m[2] = False
    assert_matches_cpu(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m), rg(1, 2, 5, 4), rg(1, 2, 6, 4), rg(1, 2, 6, 4),
                       m, atol=1e-4)


def test_sdpa_float_mask_with_grad_and_scale():
    assert_matches_cpu(lambda q, k, v, m: sdpa(q, k, v, attn_mask=m, scale=0.3), rg(2, 3, 5, 4), rg(2, 3, 6, 4),
                       rg(2, 3, 6, 4), rg(3, 1, 6), atol=1e-4)


def test_sdpa_gqa():
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True), rg(2, 6, 5, 4),
                       rg(2, 2, 5, 4), rg(2, 2, 5, 4), atol=1e-4)


def test_sdpa_broadcasts_batch_dims_like_cpu():
    """torch broadcasts q/k/v batch dims without enable_gqa: multi-query k/v with one head (as Falcon
    passes them), and a query without the batch dim; gradients sum back over the broadcast dims."""
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v, is_causal=True), rg(2, 4, 5, 8), rg(2, 1, 5, 8),
                       rg(2, 1, 5, 8), atol=1e-4)
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v), rg(4, 5, 8), rg(2, 4, 6, 8), rg(1, 4, 6, 8), atol=1e-4)


def test_sdpa_3d_and_bf16():
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v), rg(3, 5, 4), rg(3, 6, 4), rg(3, 6, 4), atol=1e-4)
    bf = torch.bfloat16
    assert_matches_cpu(lambda q, k, v: sdpa(q, k, v, is_causal=True), rg(2, 2, 5, 8, dtype=bf), rg(2, 2, 5, 8, dtype=bf),
                       rg(2, 2, 5, 8, dtype=bf), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_flash_attention_op_matches_eager(dt, dev):
    """aten._scaled_dot_product_flash_attention_for_cpu called directly (OpInfo does; torch 2.14's
    decomposition returns the attention weights as its logsumexp): output [B, H, L, E], logsumexp
    [B, H, L] in float32, GQA, causal with L != S, a float mask, and its backward op, against
    CPU eager; no fallback; eager's refusals."""
    op, back = aten._scaled_dot_product_flash_attention_for_cpu, aten._scaled_dot_product_flash_attention_for_cpu_backward
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, L, 8, generator=g).to(dt) for h, L in ((4, 5), (2, 7), (2, 7)))
    mask = torch.randn(5, 7, generator=g)
    tol = dict(atol=1e-4, rtol=1e-4) if dt == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    before = dict(txc.metrics.fallbacks())
    for kw in (dict(is_causal=True), dict(attn_mask=mask, scale=0.4)):
        o, lse = op(q, k, v, **kw)
        xo, xlse = op(q.to(dev), k.to(dev), v.to(dev), **{a: b.to(dev) if a == "attn_mask" else b for a, b in kw.items()})
        assert (xo.dtype, xlse.dtype, xlse.shape) == (dt, torch.float32, (2, 4, 5))
        torch.testing.assert_close(xo.cpu(), o, **tol)
        torch.testing.assert_close(xlse.cpu(), lse, **tol)
        go = torch.randn(o.shape, generator=g).to(dt)
        want = back(go, q, k, v, o, lse, 0.0, kw.get("is_causal", False), attn_mask=kw.get("attn_mask"),
                    scale=kw.get("scale"))
        got = back(go.to(dev), q.to(dev), k.to(dev), v.to(dev), xo, xlse, 0.0, kw.get("is_causal", False),
                   attn_mask=None if "attn_mask" not in kw else mask.to(dev), scale=kw.get("scale"))
        for w, x in zip(want, got):
            torch.testing.assert_close(x.cpu(), w, **tol)
    assert dict(txc.metrics.fallbacks()) == before
    for bad, msg in (((q, k, v, 0.5), "dropout"), ((q[0], k[0], v[0]), "4 dims"),
                     ((q, k, v[..., :4]), "same head size")):
        with pytest.raises(RuntimeError, match=msg):
            op(*(t.to(dev) if isinstance(t, torch.Tensor) else t for t in bad))


def test_sdpa_dropout_uses_math_path(dev):
    q = torch.randn(2, 2, 5, 4).to(dev).requires_grad_()
    before = dict(txc.metrics.fallbacks())
    out = sdpa(q, q, q, dropout_p=0.5)
    out.sum().backward()
    assert out.shape == q.shape and torch.isfinite(q.grad.cpu()).all()
    assert txc.metrics.fallbacks() == before
    # p -> 0 limit: dropout_p=1e-9 equals the no-dropout result
    torch.testing.assert_close(sdpa(q, q, q, dropout_p=1e-9).cpu(), sdpa(q, q, q).cpu(), atol=1e-5, rtol=1e-5)


# ---- embedding, losses -------------------------------------------------------------------

@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding(padding_idx):
    i = torch.randint(0, 10, (3, 5))
    i[0, 0] = 2
    assert_matches_cpu(lambda w, i: F.embedding(i, w, padding_idx=padding_idx), rg(10, 4), i)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    assert_matches_cpu(lambda x, y: F.mse_loss(x, y, reduction=reduction), rg(4, 5), rg(4, 5))


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_bce_with_logits(reduction):
    x = (torch.randn(4, 5) * 10).requires_grad_()
    assert_matches_cpu(lambda x, y, w, p: F.binary_cross_entropy_with_logits(x, y, w, reduction=reduction, pos_weight=p),
                       x, torch.rand(4, 5), torch.rand(5), torch.rand(5) + 0.5)
    assert_matches_cpu(lambda x, y: F.binary_cross_entropy_with_logits(x, y), x, torch.rand(4, 5))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multilabel_margin_loss(reduction):
    # labels up to the first -1 (rows: some labels, all labels, a repeated
    # label, -1 first), values after it ignored
    t = torch.tensor([[3, 0, -1, 1, 2], [0, 1, 2, 3, 4], [4, 2, 2, -1, 0], [-1, 3, 0, 1, 1]])
    x = rg(4, 5)
    loss = lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction)  # noqa: E731
    assert_matches_cpu(loss, x, t)
    for row in range(4):  # 1-D input: one sample
        assert_matches_cpu(loss, x[row].detach().requires_grad_(), t[row])
    assert_matches_cpu(loss, rg(3, 1), torch.tensor([[0], [-1], [0]]))


def test_multilabel_margin_loss_target_out_of_range(dev):
    x = torch.randn(2, 4, device=dev)
    with pytest.raises(RuntimeError, match="multilabel_margin_loss.*'target' is out of range"):
        F.multilabel_margin_loss(x, torch.tensor([[5, -1, 0, 0], [0, 1, 2, 3]], device=dev)).item()
    with pytest.raises(RuntimeError, match="inconsistent target size"):
        F.multilabel_margin_loss(x, torch.zeros(2, 3, dtype=torch.long, device=dev))
    with pytest.raises(RuntimeError, match="'target' is out of range"):  # also after the first -1, as torch
        F.multilabel_margin_loss(x, torch.tensor([[1, -1, 7, 0], [0, 1, 2, 3]], device=dev)).item()
    ok = F.multilabel_margin_loss(x, torch.tensor([[1, -1, 3, 3], [0, 1, 2, 3]], device=dev))
    want = F.multilabel_margin_loss(x.cpu(), torch.tensor([[1, -1, 3, 3], [0, 1, 2, 3]]))
    torch.testing.assert_close(ok.cpu(), want)


# ---- a GPT-style block --------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d=32, heads=4, vocab=17, rms=False):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.n1 = nn.RMSNorm(d) if rms else nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.n2 = nn.RMSNorm(d) if rms else nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx, mask=None):
        x = self.emb(idx)
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        x = x + self.down(F.silu(self.up(self.n2(x))))
        return self.head(x)


@pytest.mark.parametrize("rms,masked", [(False, False), (True, True)])
def test_gpt_block(dev, rms, masked):
    torch.manual_seed(0)
    cpu = Block(rms=rms)
    xla = Block(rms=rms)
    xla.load_state_dict(cpu.state_dict())
    xla.to(dev)
    idx, tgt = torch.randint(0, 17, (2, 8)), torch.randint(0, 17, (2, 8))
    mask = torch.ones(8, 8, dtype=torch.bool).tril() if masked else None
    before = dict(txc.metrics.fallbacks())
    lc = F.cross_entropy(cpu(idx, mask).flatten(0, 1), tgt.flatten())
    lx = F.cross_entropy(xla(idx.to(dev), None if mask is None else mask.to(dev)).flatten(0, 1), tgt.to(dev).flatten())
    lc.backward()
    lx.backward()
    txc.sync()  # one graph for the loss and every gradient
    torch.testing.assert_close(lx.cpu(), lc.detach(), atol=1e-5, rtol=1e-5)
    for (name, pc), px in zip(cpu.named_parameters(), xla.parameters()):
        torch.testing.assert_close(px.grad.cpu(), pc.grad, atol=1e-4, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    assert txc.metrics.fallbacks() == before


def test_gpt_block_second_step_compiles_nothing(dev):
    m = Block().to(dev)

    def step():
        m.zero_grad()
        idx = torch.randint(0, 17, (2, 8)).to(dev)
        loss = F.cross_entropy(m(idx).flatten(0, 1), idx.flatten())
        loss.backward()
        txc.sync()
        return loss

    step()
    step()
    compiles = txc.metrics.counters().get("compile", 0)
    step()
    assert txc.metrics.counters().get("compile", 0) == compiles


# ---- errors name the op -------------------------------------------------------------------

def test_errors(dev):
    x = torch.randn(2, 5, 7).to(dev)
    with pytest.raises(RuntimeError, match=r"normalized_shape=\[8\].*size\[2, 5, 7\]"):
        F.layer_norm(x, (8,))
    with pytest.raises(RuntimeError, match=r"layer_norm: expected weight and bias of shape \[7\]"):
        F.layer_norm(x, (7,), torch.ones(6).to(dev))
    with pytest.raises(RuntimeError, match=r"nll_loss: Expected input batch_size \(4\) to match target batch_size \(3\)"):
        aten.nll_loss_forward(torch.randn(4, 5).to(dev), torch.zeros(3, dtype=torch.long).to(dev), None, 1, -100)
    with pytest.raises(RuntimeError, match=r"sdpa: query and key embedding sizes differ"):
        sdpa(torch.randn(1, 2, 4, 8).to(dev), torch.randn(1, 2, 4, 6).to(dev), torch.randn(1, 2, 4, 6).to(dev))
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: .*enable_gqa"):
        q = torch.randn(1, 4, 3, 8).to(dev)
        kv = torch.randn(1, 2, 3, 8).to(dev)
        sdpa(q, kv, kv)
    with pytest.raises(RuntimeError, match=r"sdpa: attn_mask of shape \[3, 5\] does not broadcast"):
        sdpa(x, x, x, attn_mask=torch.ones(3, 5, dtype=torch.bool).to(dev))
    with pytest.raises(RuntimeError, match=r"embedding: .*'indices'.*float32"):
        F.embedding(torch.randn(3).to(dev), torch.randn(4, 2).to(dev))


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, 3.0, float("inf")])
def test_cdist_forward_backward(p):
    x1, x2 = torch.randn(2, 5, 3), torch.randn(2, 4, 3)
    x2[:, 0] = x1[:, 0]                               # a zero distance: the gradient's special case
    assert_matches_cpu(lambda a, b: torch.cdist(a, b, p=p), x1.requires_grad_(), x2.requires_grad_(),
                       atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dim", [0, 2, -1])
def test_weight_norm_forward_and_backward_without_fallback(dim):
    """torch._weight_norm (nn.utils.parametrizations.weight_norm; wav2vec2's positional conv uses dim=2):
    the fused interface's backward lowers (it used to fall back to the CPU kernel)."""
    gshape = {0: (6, 1, 1), 2: (1, 1, 5), -1: ()}[dim]
    g = torch.Generator().manual_seed(0)
    v = torch.randn(6, 3, 5, generator=g, requires_grad=True)
    gain = (torch.rand(gshape, generator=g) + 0.5).requires_grad_()
    w = torch.randn(6, 3, 5, generator=g)  # a non-uniform cotangent
    assert_matches_cpu(lambda v, s, w: torch._weight_norm(v, s, dim) * w, v, gain, w, atol=1e-4)


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("norm_first,act", [(False, "relu"), (True, "gelu")])
def test_transformer_encoder_eval_fast_path(aligned, norm_first, act):
    """nn.TransformerEncoder in eval mode without grad takes torch's fused fast path
    (_transformer_encoder_layer_fwd, _native_multi_head_attention, the left-aligned mask test):
    lowered, no fallback, outputs like CPU."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, activation=act, batch_first=True, norm_first=norm_first)
    enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, 7, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[0, 5:] = True
    pad[2, (3 if aligned else 1)] = True
    before = dict(txc.metrics.fallbacks())
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        got = copy.deepcopy(enc).to(txc.device())(x.to(txc.device()), src_key_padding_mask=pad.to(txc.device()))
    live = ~pad.unsqueeze(-1)  # padded rows are unspecified (CPU's nested fast path returns zeros there)
    torch.testing.assert_close(got.cpu() * live, want * live, atol=1e-5, rtol=1e-5)
    assert dict(txc.metrics.fallbacks()) == before


@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_multihead_attention_eval_fast_path(need_weights, average):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    before = dict(txc.metrics.fallbacks())
    with torch.no_grad():
        want = mha(x, x, x, key_padding_mask=pad, need_weights=need_weights, average_attn_weights=average)
        mx, d = copy.deepcopy(mha).to(txc.device()), txc.device()
        got = mx(x.to(d), x.to(d), x.to(d), key_padding_mask=pad.to(d), need_weights=need_weights,
                 average_attn_weights=average)
    torch.testing.assert_close(got[0].cpu(), want[0], atol=1e-5, rtol=1e-5)
    assert (got[1] is None) == (want[1] is None)
    if want[1] is not None:
        torch.testing.assert_close(got[1].cpu(), want[1], atol=1e-5, rtol=1e-5)
    assert dict(txc.metrics.fallbacks()) == before
