"""torch.autocast("xla"): CUDA autocast's cast policies on the xla device,
checked op by op against CPU eager on inputs cast as the policy says (and
against CPU autocast where CPU's policy is the same), gradients' dtypes,
nesting, GradScaler and custom_fwd."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc

LOW = [torch.bfloat16, torch.float16]


def _xla(*ts):
    return [t.to(txc.device()) for t in ts]


def _check(out, ref, dtype, atol, rtol=1e-2):
    assert out.device.type == "xla"
    assert out.dtype == dtype, f"dtype {out.dtype}, policy says {dtype}"
    torch.testing.assert_close(out.cpu().float(), ref.float(), atol=atol, rtol=rtol)


# op(*inputs) under autocast -> output dtype lower precision; reference: the op on inputs cast to it
LOWER_CASES = {
    "mm": (torch.mm, [(8, 16), (16, 4)]),
    "bmm": (torch.bmm, [(2, 8, 16), (2, 16, 4)]),
    "matmul": (torch.matmul, [(3, 8, 16), (16, 4)]),
    "addmm": (torch.addmm, [(4,), (8, 16), (16, 4)]),
    "baddbmm": (torch.baddbmm, [(2, 8, 4), (2, 8, 16), (2, 16, 4)]),
    "linear": (F.linear, [(8, 16), (4, 16), (4,)]),
    "einsum": (lambda a, b: torch.einsum("bij,bjk->bik", a, b), [(2, 8, 16), (2, 16, 4)]),
    "conv2d": (lambda x, w: F.conv2d(x, w, padding=1), [(2, 3, 8, 8), (4, 3, 3, 3)]),
    "conv1d": (F.conv1d, [(2, 3, 10), (4, 3, 3)]),
    "sdpa": (F.scaled_dot_product_attention, [(2, 2, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)]),
}


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", sorted(LOWER_CASES))
def test_lower_precision_ops(name, dtype):
    fn, shapes = LOWER_CASES[name]
    ins = [torch.randn(s) for s in shapes]
    with torch.autocast("xla", dtype=dtype):
        out = fn(*_xla(*ins))
    ref = fn(*[t.to(dtype) for t in ins]) if dtype == torch.bfloat16 else fn(*ins).to(dtype)
    _check(out, ref.float(), dtype, atol=5e-2)
    if dtype == torch.bfloat16 and name not in ("einsum",):  # CPU autocast has the same policy here
        with torch.autocast("cpu", dtype=dtype):
            cpu = fn(*ins)
        assert cpu.dtype == out.dtype
        torch.testing.assert_close(out.cpu().float(), cpu.float(), atol=5e-2, rtol=1e-2)


FP32_CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), [(4, 8)]),
    "log_softmax": (lambda x: F.log_softmax(x, -1), [(4, 8)]),
    "layer_norm": (lambda x: F.layer_norm(x, (8,)), [(4, 8)]),
    "group_norm": (lambda x: F.group_norm(x, 2), [(2, 4, 3)]),
    "exp": (torch.exp, [(4, 8)]),
    "log": (torch.log, [(4, 8)]),
    "pow": (lambda x: torch.pow(x, 2), [(4, 8)]),
    "rsqrt": (torch.rsqrt, [(4, 8)]),
    "sum": (torch.sum, [(4, 8)]),
    "sum_dim": (lambda x: x.sum(1), [(4, 8)]),
    "prod": (lambda x: x.prod(1), [(4, 8)]),
    "cumsum": (lambda x: x.cumsum(1), [(4, 8)]),
    "mse_loss": (F.mse_loss, [(4, 8), (4, 8)]),
    "l1_loss": (F.l1_loss, [(4, 8), (4, 8)]),
    "nll_loss": (lambda x, t: F.nll_loss(x, t.argmax(1)), [(4, 8), (4, 8)]),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), [(4, 8)]),
    "norm": (lambda x: x.norm(), [(4, 8)]),
}


@pytest.mark.parametrize("dtype", LOW, ids=str)
@pytest.mark.parametrize("name", sorted(FP32_CASES))
def test_fp32_ops_on_low_precision_inputs(name, dtype):
    """Inputs in the autocast dtype (as a lower-precision op's output would
    be) give float32 outputs, computed from the float32 upcast."""
    fn, shapes = FP32_CASES[name]
    ins = [(torch.rand(s) + 0.5).to(dtype) for s in shapes]  # positive: log, rsqrt
    with torch.autocast("xla", dtype=dtype):
        out = fn(*_xla(*ins))
    ref = fn(*[t.float() for t in ins])
    _check(out, ref, torch.float32, atol=1e-4, rtol=1e-4)


def test_sum_keeps_explicit_dtype_and_integers():
    x = torch.randn(4, 8).to(torch.bfloat16)
    i = torch.arange(6)
    with torch.autocast("xla", dtype=torch.bfloat16):
        a = x.to(txc.device()).sum(dtype=torch.float64)
        b = i.to(txc.device()).sum()
        c = torch.softmax(x.to(txc.device()), -1, dtype=torch.bfloat16)
    assert (a.dtype, b.dtype, c.dtype) == (torch.float64, torch.int64, torch.bfloat16)
    assert b.item() == 15


def test_promote_ops():
    a, b = torch.randn(4, 3), torch.randn(4, 3).to(torch.bfloat16)
    with torch.autocast("xla", dtype=torch.bfloat16):
        c = torch.cat(_xla(a, b))
        s = torch.stack(_xla(a, b))
        m = torch.addcmul(*_xla(a, b, b))
        y = torch.zeros(5, 3, device=txc.device()).index_put((torch.tensor([0, 2]).to(txc.device()),),
                                                             b[:2].to(txc.device()))
    assert c.dtype == s.dtype == m.dtype == y.dtype == torch.float32
    torch.testing.assert_close(c.cpu(), torch.cat([a, b.float()]))
    torch.testing.assert_close(m.cpu(), torch.addcmul(a, b.float(), b.float()))


def test_banned_binary_cross_entropy_names_the_fix():
    p = torch.rand(4, device=txc.device())
    with torch.autocast("xla", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy_with_logits"):
            F.binary_cross_entropy(p, p)


class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(self.ln(h))


def test_model_forward_backward_matches_cpu_autocast():
    """bf16 autocast: activation dtypes op by op, the loss, and the gradients
    (dtype float32, values) match CPU autocast, whose policy for linear,
    relu and mse_loss is the same (layer_norm: both give float32 here)."""
    torch.manual_seed(0)
    m = _MLP()
    x, t = torch.randn(4, 16), torch.randn(4, 8)
    mx = _MLP()
    mx.load_state_dict(m.state_dict())
    mx = mx.to(txc.device())
    outs = {}
    for dev, model in (("cpu", m), ("xla", mx)):
        xs, ts = x.to(dev if dev == "cpu" else txc.device()), t.to(dev if dev == "cpu" else txc.device())
        with torch.autocast(dev, dtype=torch.bfloat16):
            h = model.fc1(xs)
            r = torch.relu(h)
            n = model.ln(r.float())
            y = model.fc2(n)
            loss = F.mse_loss(y, ts)
        loss.backward()
        outs[dev] = (h, r, n, y, loss, [p.grad for p in model.parameters()])
    for c, x_ in zip(outs["cpu"][:5], outs["xla"][:5]):
        assert c.dtype == x_.dtype
        torch.testing.assert_close(x_.cpu(), c.detach(), atol=3e-2, rtol=2e-2)
    for c, g in zip(outs["cpu"][5], outs["xla"][5]):
        assert g.dtype == c.dtype == torch.float32
        torch.testing.assert_close(g.cpu(), c, atol=3e-2, rtol=5e-2)


def test_nested_and_disabled_regions():
    a, b = _xla(torch.randn(4, 4), torch.randn(4, 4))
    with torch.autocast("xla", dtype=torch.bfloat16):
        assert (a @ b).dtype == torch.bfloat16
        with torch.autocast("xla", enabled=False):
            assert (a @ b).dtype == torch.float32
        with torch.autocast("xla", dtype=torch.float16):
            assert (a @ b).dtype == torch.float16
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):  # another device's autocast leaves xla alone
        assert (a @ b).dtype == torch.float32


def test_unsupported_dtype_is_torchs_warning():
    with pytest.warns(UserWarning, match="xla"):
        with torch.autocast("xla", dtype=torch.float64):
            pass


def test_custom_fwd_casts_inputs():
    class Mul(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="xla", cast_inputs=torch.float32)
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b  # autocast is off inside: float32

        @staticmethod
        @torch.amp.custom_bwd(device_type="xla")
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g @ b.t(), a.t() @ g

    a = torch.randn(4, 4, device=txc.device(), requires_grad=True)
    b = torch.randn(4, 4, device=txc.device())
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = Mul.apply(a.to(torch.bfloat16), b)
    assert y.dtype == torch.float32
    y.sum().backward()
    assert a.grad.dtype == torch.float32


def test_grad_scaler_fp16_step():
    """torch.amp.GradScaler("xla"): scaled fp16 training steps update the
    parameters as unscaled CPU steps do, and an inf gradient skips the step
    and halves the scale."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 4)
    ref = torch.nn.Linear(8, 4)
    ref.load_state_dict(lin.state_dict())
    lin = lin.to(txc.device())
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("xla", init_scale=1024.0)
    x = torch.randn(16, 8)
    for _ in range(2):
        with torch.autocast("xla", dtype=torch.float16):
            loss = lin(x.to(txc.device())).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        txc.sync()
        rl = ref(x.half().float()).pow(2).mean()
        rl.backward()
        ropt.step()
        ropt.zero_grad()
    torch.testing.assert_close(lin.weight.cpu(), ref.weight, atol=2e-3, rtol=1e-2)
    assert scaler.get_scale() == 1024.0
    before = lin.weight.cpu()
    (lin(x.to(txc.device())).sum() * float("inf")).backward()
    scaler.step(opt)
    scaler.update()
    txc.sync()
    torch.testing.assert_close(lin.weight.cpu(), before)
    assert scaler.get_scale() == 512.0


def test_emitted_stablehlo_has_bf16_dots_and_f32_reductions():
    lin = torch.nn.Linear(8, 4).to(txc.device())
    x = torch.randn(2, 8).to(txc.device())
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = torch.softmax(lin(x), -1)
    assert y.dtype == torch.float32
    text = txc.debug.stablehlo(y)
    dots = [ln for ln in text.splitlines() if "stablehlo.dot_general" in ln]
    # bf16 operands; the product in bf16, or (linear's bias added to it) in float32, rounded once after the add
    assert dots and all(": (tensor<2x8xbf16>, tensor<8x4xbf16>) -> tensor<2x4x" in d for d in dots), dots
    reduces = [ln for ln in text.splitlines() if "stablehlo.reduce\"" in ln]
    assert len(reduces) == 2  # softmax's max and sum
    first = text.index("stablehlo.reduce\"")
    region = text[first:text.index("})", first)]  # the reduction's body: its accumulator type
    assert "tensor<f32>" in region and "bf16" not in region, region


def test_decoder_trains_five_steps_under_bf16_autocast_like_cpu():
    """The GPT decoder of tests/models.py, 5 AdamW steps under
    autocast(dtype=bfloat16): every step's loss tracks CPU autocast's within
    2% (relative; bf16 keeps 8 mantissa bits and the two backends round
    intermediates differently, see README), the loss falls as on the CPU, the
    parameters stay float32 and close, and it compiles as an fp32 run does:
    twice (autocast adds no recompiles)."""
    from torch_xla_core import executor, metrics
    from tests.models import GPT
    torch.manual_seed(0)
    cpu = GPT(vocab=61, d=32, layers=2, heads=4)
    xla = GPT(vocab=61, d=32, layers=2, heads=4)
    xla.load_state_dict(cpu.state_dict())
    xla = xla.to(txc.device())
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 61, (4, 17), generator=g)] * 5  # one batch: the loss must fall
    losses = {}
    executor.clear_cache()
    metrics.clear()
    for dev, model in (("cpu", cpu), ("xla", xla)):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses[dev] = []
        for batch in data:
            batch = batch.to(txc.device() if dev == "xla" else "cpu")
            with torch.autocast(dev, dtype=torch.bfloat16):
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, 61).float(), batch[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if dev == "xla":
                txc.sync()
            losses[dev].append(loss.item())
    compiles = metrics.counters()["compile"]
    c, x = torch.tensor(losses["cpu"]), torch.tensor(losses["xla"])
    torch.testing.assert_close(x, c, rtol=2e-2, atol=0)
    assert x[-1] < x[0] and c[-1] < c[0]
    for p, (name, q) in zip(xla.parameters(), cpu.named_parameters()):
        assert p.dtype == torch.float32
        # qkv's key bias has a zero gradient in exact arithmetic (softmax ignores it): both sides' AdamW
        # steps follow rounding noise, up to lr a step either way
        atol = 2 * 5 * 3e-3 if name.endswith("qkv.bias") else 2e-2
        torch.testing.assert_close(p.cpu(), q, rtol=0, atol=atol, msg=lambda m: f"{name}: {m}")
    assert metrics.fallbacks() == {}
    assert compiles == 2  # step 1, then step 2 (optimizer state appears) for every later step
