"""complex64/complex128 on the xla device against CPU eager: constants,
transfers, elementwise ops with complex semantics, views (view_as_real,
view_as_complex, .real/.imag, conj, writes reaching the base), the FFT
family, linalg.eig, autograd through complex paths to a real loss, a
Llama-style rotary embedding, and complex32 refused with a clear error."""
import copy
import io

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import executor
from util import assert_matches_cpu

DEV = txc.device()


def _c(*shape, dtype=torch.complex64, seed=0):
    g = torch.Generator().manual_seed(seed)
    real = torch.float64 if dtype == torch.complex128 else torch.float32
    return torch.complex(torch.randn(shape, generator=g, dtype=real), torch.randn(shape, generator=g, dtype=real))


def _no_fallback_since(before):
    after = txc.metrics.fallbacks()
    new = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert not new, f"unexpected CPU fallbacks: {new}"


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_transfer_print_item_roundtrip(dtype):
    c = _c(2, 3, dtype=dtype)
    x = c.to(DEV)
    assert x.dtype == dtype
    torch.testing.assert_close(x.cpu(), c, rtol=0, atol=0)
    assert x[1, 2].item() == c[1, 2].item()
    assert isinstance(x[0, 0].item(), complex)
    assert repr(x).startswith("tensor([[") and "j" in repr(x) and "device='xla:0'" in repr(x)


# Every way a complex value enters the device (each was refused before).
ENTRY_PATHS = {
    "ones": lambda x, d: torch.ones(2, dtype=torch.complex64, device=d) * 2,
    "full_complex_value": lambda x, d: torch.full((2,), 1 + 2j, device=d),
    "tensor": lambda x, d: torch.tensor([1 + 2j, -3j], device=d),
    "to_dtype": lambda x, d: x.to(torch.complex64) + 1,
    "to_complex128": lambda x, d: x.to(torch.complex128) * (1 - 1j),
    "zeros_like": lambda x, d: torch.zeros_like(x, dtype=torch.complex64),
    "new_ones": lambda x, d: x.new_ones(2, dtype=torch.complex64),
    "python_complex": lambda x, d: x * 1j + (2 - 1j),
    "complex_0d_cpu": lambda x, d: x + torch.tensor(1j),
    "complex_0d_cpu_double": lambda x, d: x + torch.tensor(1j, dtype=torch.complex128),
    "inplace_complex_scalar": lambda x, d: x.to(torch.complex64).mul_(2j).add_(1 + 1j),
}


@pytest.mark.parametrize("path", list(ENTRY_PATHS))
def test_complex_entry_paths_match_cpu(path):
    before = dict(txc.metrics.fallbacks())
    x = torch.arange(4.0)
    out_x = ENTRY_PATHS[path](x.to(DEV), DEV)
    out_c = ENTRY_PATHS[path](x, "cpu")
    assert out_x.device.type == "xla" and out_x.dtype == out_c.dtype and out_x.dtype.is_complex
    torch.testing.assert_close(out_x.cpu(), out_c)
    _no_fallback_since(before)


def test_constants_and_scalars_compile_and_do_not_recompile():
    executor.clear_cache()
    before = txc.metrics.counters().get("compile", 0)
    x = _c(4).to(DEV)
    outs = []
    for s in (1j, 2 - 3j, -0.5 + 0.25j):
        outs.append((x * s + torch.full((4,), 1 + 2j, device=DEV)).cpu())
    c = _c(4)
    for s, o in zip((1j, 2 - 3j, -0.5 + 0.25j), outs):
        torch.testing.assert_close(o, c * s + torch.full((4,), 1 + 2j))
    # the complex number is a graph parameter: three values, one compile
    assert txc.metrics.counters().get("compile", 0) - before == 1


def test_complex_constant_literal_in_stablehlo():
    x = _c(3).to(DEV)
    y = x + torch.full((3,), 2 - 1j, device=DEV)
    from torch_xla_core import debug
    text = debug.stablehlo([y])
    assert "complex<f32>" in text and "(2.0" in text
    torch.testing.assert_close(y.cpu(), _c(3) + (2 - 1j))


@pytest.mark.parametrize("op", [
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, lambda a, b: a / b,
    lambda a, b: a ** 2, lambda a, b: a ** b, lambda a, b: torch.exp(a), lambda a, b: torch.log(a),
    lambda a, b: torch.sqrt(a), lambda a, b: torch.reciprocal(a), lambda a, b: torch.abs(a),
    lambda a, b: torch.angle(a), lambda a, b: torch.sgn(a), lambda a, b: a.conj() * b,
    lambda a, b: torch.conj_physical(a), lambda a, b: a.real + a.imag, lambda a, b: a == b, lambda a, b: a != a,
    lambda a, b: a.sum(), lambda a, b: a.mean(0), lambda a, b: a @ b.T, lambda a, b: torch.einsum("ij,kj->ik", a, b),
    lambda a, b: torch.bmm(a[None], b.T[None]), lambda a, b: a * 2.5 + 1, lambda a, b: a.to(torch.complex128) * 1j,
    lambda a, b: torch.tanh(a), lambda a, b: torch.sin(a) + torch.cos(b), lambda a, b: a.abs().to(torch.complex64),
    lambda a, b: torch.where(a.real > 0, a, b), lambda a, b: a.var(), lambda a, b: a.prod(1),
], ids=lambda f: None)
def test_elementwise_and_matmul_match_cpu(op):
    assert_matches_cpu(op, _c(3, 3, seed=1), _c(3, 3, seed=2), atol=1e-4, rtol=1e-4)


def test_real_ops_on_real_inputs():
    x = torch.tensor([-2.0, 0.0, 3.0, -0.5])
    assert_matches_cpu(torch.angle, x)
    nan = torch.tensor([float("nan"), -1.0])
    torch.testing.assert_close(torch.angle(nan.to(DEV)).cpu(), torch.angle(nan), equal_nan=True)
    assert_matches_cpu(torch.angle, torch.tensor([-1, 0, 2]))
    assert_matches_cpu(torch.sgn, x)


def test_complex_and_polar_and_promotion():
    a, b = torch.randn(5), torch.randn(5)
    assert_matches_cpu(torch.complex, a, b)
    assert_matches_cpu(torch.polar, a.abs(), b)
    assert_matches_cpu(torch.complex, a.double(), b.double())
    # float64 with complex64 promotes to complex128, as in torch
    assert_matches_cpu(lambda x, y: x.double() * torch.complex(x, y), a, b)
    with pytest.raises(RuntimeError, match="scalar type"):
        torch.complex(a.to(DEV), b.double().to(DEV))


def test_unsupported_complex_ops_are_refused_at_trace_time():
    x = _c(3).to(DEV)
    for f in (lambda: x < x, lambda: torch.maximum(x, x), lambda: x.amax(), lambda: torch.floor(x),
              lambda: x.argmax()):
        with pytest.raises(RuntimeError, match="complex"):
            f()


def test_complex32_is_refused_with_a_clear_error():
    with pytest.raises((RuntimeError, TypeError), match="complex32"):
        torch.zeros(2, dtype=torch.complex32, device=DEV)
    with pytest.raises((RuntimeError, TypeError), match="complex32"):
        torch.zeros(2, dtype=torch.complex32).to(DEV)


def test_view_as_real_and_complex_write_back_to_base():
    c = _c(3, 4)
    for fn in (lambda z: z.real.zero_(), lambda z: z.imag.mul_(2), lambda z: torch.view_as_real(z)[1].fill_(7),
               lambda z: torch.view_as_real(z).add_(1)):
        cpu, x = c.clone(), c.to(DEV)
        fn(cpu)
        fn(x)
        torch.testing.assert_close(x.cpu(), cpu)
    r = torch.randn(3, 4, 2)
    cpu, x = r.clone(), r.to(DEV)
    for t in (cpu, x):
        v = torch.view_as_complex(t)
        v.mul_(1j)
        v[0] = 5 - 5j
    torch.testing.assert_close(x.cpu(), cpu)


def test_view_strides_are_torch_s():
    c = _c(3, 4)
    x = c.to(DEV)
    for f in (lambda z: torch.view_as_real(z), lambda z: torch.view_as_real(z[:, 1:]), lambda z: z.real,
              lambda z: z.imag[1:], lambda z: torch.view_as_complex(torch.view_as_real(z.t()).contiguous())):
        assert f(x).stride() == f(c).stride() and f(x).storage_offset() == f(c).storage_offset()
    with pytest.raises(RuntimeError, match="stride 1"):
        torch.view_as_complex(torch.randn(2, 4).to(DEV).t())


def test_conj_and_neg_views():
    c = _c(2, 3)
    cpu, x = c.clone(), c.to(DEV)
    for t in (cpu, x):
        v = t.conj()
        v.add_(1j)      # writes through the conjugate view: the base gets conj(1j)
        n = torch._neg_view(t)
        n.mul_(2)
    torch.testing.assert_close(x.cpu(), cpu)
    torch.testing.assert_close(x.conj().resolve_conj().cpu(), cpu.conj().resolve_conj())


@pytest.mark.parametrize("fn", [
    lambda x: torch.fft.fft(x), lambda x: torch.fft.ifft(x, norm="ortho"), lambda x: torch.fft.fft(x, n=5),
    lambda x: torch.fft.fft(x, n=11, dim=0), lambda x: torch.fft.fft2(x), lambda x: torch.fft.ifftn(x, norm="forward"),
    lambda x: torch.fft.rfft(x.real), lambda x: torch.fft.rfft(x.real, n=6, norm="ortho"),
    lambda x: torch.fft.irfft(x), lambda x: torch.fft.irfft(x, n=9), lambda x: torch.fft.rfft2(x.real),
    lambda x: torch.fft.irfftn(x, norm="forward"), lambda x: torch.fft.hfft(x), lambda x: torch.fft.ihfft(x.real),
    lambda x: torch.fft.fftn(x[None].expand(2, 8, 8)[None].expand(2, 2, 8, 8)),
    lambda x: torch.fft.rfftn(x.real[None, None].expand(2, 2, 8, 8).contiguous()),
    lambda x: torch.fft.irfftn(x[None, None].expand(2, 2, 8, 8).contiguous(), s=(2, 2, 8, 14)),
    lambda x: torch.fft.fftshift(torch.fft.fft(x)),
], ids=lambda f: None)
def test_fft_matches_cpu(fn):
    before = dict(txc.metrics.fallbacks())
    assert_matches_cpu(fn, _c(8, 8), atol=1e-4, rtol=1e-4)
    _no_fallback_since(before)


def test_fft_float64_gives_complex128():
    x = torch.randn(3, 10, dtype=torch.float64)
    for fn in (torch.fft.rfft, torch.fft.fft, lambda t: torch.fft.irfft(torch.fft.rfft2(t), n=10)):
        out = assert_matches_cpu(fn, x, atol=1e-10, rtol=1e-10)
        assert out.dtype == fn(x).dtype


def test_fft_lowers_to_stablehlo_fft():
    from torch_xla_core import debug
    x = torch.randn(4, 16).to(DEV)
    text = debug.stablehlo([torch.fft.rfft(x), torch.fft.irfft(torch.fft.fft(x.to(torch.complex64)))])
    assert "stablehlo.fft" in text and "RFFT" in text and "IRFFT" in text and "fft_type = #stablehlo<fft_type FFT>" in text


def test_stft_istft_match_cpu():
    x = torch.randn(2, 400)
    w = torch.hann_window(64)

    def f(x, w):
        s = torch.stft(x, 64, hop_length=16, window=w, return_complex=True)
        y = torch.istft(s, 64, hop_length=16, window=w, length=400)
        return torch.view_as_real(s), y
    assert_matches_cpu(f, x, w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_linalg_eig_matches_cpu(dtype):
    before = dict(txc.metrics.fallbacks())
    a = torch.randn(2, 4, 4, dtype=dtype)
    w, v = torch.linalg.eig(a.to(DEV))
    wc, vc = torch.linalg.eig(a)
    torch.testing.assert_close(w.cpu(), wc)
    torch.testing.assert_close(v.cpu(), vc)
    torch.testing.assert_close(torch.linalg.eigvals(a.to(DEV)).cpu(), torch.linalg.eigvals(a))
    _no_fallback_since(before)  # one call_jax node (LAPACK geev on CPU, as torch's kernel)


def test_gradients_through_complex_paths_to_a_real_loss():
    def f(a, b):
        z = torch.polar(a.abs() + 0.1, b) * torch.complex(a, b)
        s = torch.fft.fft(z * z.conj() + z, norm="ortho")
        return (torch.view_as_real(s) ** 2).sum() + s.abs().sum() + torch.angle(z).sum()
    assert_matches_cpu(f, torch.randn(6, requires_grad=True), torch.randn(6, requires_grad=True),
                       atol=1e-4, rtol=1e-4)

    def g(x):
        return torch.fft.irfft(torch.fft.rfft(x) * 2j, n=10).pow(2).sum()
    assert_matches_cpu(g, torch.randn(3, 10, requires_grad=True), atol=1e-4, rtol=1e-4)


# Meta's llama model.py
def _precompute_freqs_cis(dim, end, theta=10000.0, device=None):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def _apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    shape = [d if i == 1 or i == xq_.ndim - 1 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def test_llama_rotary_embedding_forward_backward():
    executor.clear_cache()
    before = dict(txc.metrics.fallbacks())
    bsz, seqlen, heads, hd = 2, 6, 3, 8
    wq = torch.randn(heads * hd, 16, requires_grad=True)
    x = torch.randn(bsz, seqlen, 16)

    def f(x, wq, device):
        q = (x @ wq.T).view(bsz, seqlen, heads, hd)
        freqs = _precompute_freqs_cis(hd, seqlen, device=device)
        xq, xk = _apply_rotary_emb(q, q * 0.5, freqs)
        return (xq * xk).sum(-1).softmax(-1)
    out_c = f(x, wq, "cpu")
    wx = wq.detach().to(DEV).requires_grad_()
    out_x = f(x.to(DEV), wx, DEV)
    torch.testing.assert_close(out_x.cpu(), out_c, atol=1e-5, rtol=1e-4)
    w = torch.randn(out_c.shape)
    (out_c * w).sum().backward()
    (out_x * w.to(DEV)).sum().backward()
    torch.testing.assert_close(wx.grad.cpu(), wq.grad, atol=1e-4, rtol=1e-4)
    _no_fallback_since(before)


def test_save_load_and_deepcopy():
    c = _c(2, 3)
    x = c.to(DEV)
    buf = io.BytesIO()
    torch.save({"z": x}, buf)
    buf.seek(0)
    y = torch.load(buf, map_location="cpu")["z"]
    assert y.device.type == "cpu"
    torch.testing.assert_close(y, c)
    buf.seek(0)
    z = torch.load(buf)["z"]  # weights_only=True, back onto the device
    assert z.device.type == "xla" and z.dtype == torch.complex64
    torch.testing.assert_close(z.cpu(), c)
    d = copy.deepcopy(x)
    d.mul_(1j)
    torch.testing.assert_close(x.cpu(), c)
    torch.testing.assert_close(d.cpu(), c * 1j)


def test_vdot_and_vecdot_conjugate_the_first_operand():
    a, b = _c(5, seed=3), _c(5, seed=4)
    assert_matches_cpu(torch.vdot, a, b)
    assert_matches_cpu(torch.linalg.vecdot, a, b)
    assert_matches_cpu(torch.linalg.vecdot, _c(2, 5), _c(2, 5, seed=1))


@pytest.mark.filterwarnings("ignore:torch_xla_core")
def test_cpu_fallback_honours_conjugate_views_inside_the_kernel():
    # linalg.pinv's CPU kernel takes mH (a conjugate view) internally, which
    # the CPU fallback must not ignore (pinv itself now refuses complex on the
    # device with a clear error, so the fallback is called directly)
    from torch_xla_core._ops import fallback
    a = _c(5, 5, seed=5)
    r = fallback(torch.ops.aten.linalg_pinv.atol_rtol_float)(a.to(txc.device()))
    torch.testing.assert_close(r.cpu(), torch.linalg.pinv(a), atol=1e-4, rtol=1e-4)


def test_complex_fill_values():
    x = _c(2, 3)
    assert_matches_cpu(lambda t: torch.constant_pad_nd(t, (1, 2), 1 - 2j), x)
    assert_matches_cpu(lambda t, i: t.index_fill(1, i, 3 + 4j), x, torch.tensor([0, 2]))
    assert_matches_cpu(lambda t, i: t.index_fill(0, i, -1j), x, torch.tensor([1]))


@pytest.mark.parametrize("fn", [torch.tanh, torch.sigmoid, torch.nn.functional.tanhshrink, torch.exp, torch.sqrt])
def test_complex_backward_conjugates_like_torch(fn):
    # torch's complex gradients are conjugate Wirtinger: tanh' is conj(1 - y^2)
    a = _c(6, seed=7).requires_grad_()
    assert_matches_cpu(lambda t: torch.view_as_real(fn(t)), a, atol=1e-4, rtol=1e-4)


def test_as_strided_over_a_dtype_changing_view():
    # strides count elements of the view's dtype; writes reach the real storage
    r = torch.arange(8.0)
    rx = r.to(DEV)
    for t in (r, rx):
        v = torch.view_as_complex(t.view(4, 2))
        v.as_strided((2,), (2,), 1).mul_(1j)
        torch.view_as_real(v[:2]).as_strided((3,), (1,), 1).add_(10)
    torch.testing.assert_close(rx.cpu(), r)
