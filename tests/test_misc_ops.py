"""Ops lowered by _ops/order.py, misc.py, nn_extra.py, nn_grads.py and the
random additions (multinomial, rrelu): numerics and gradients against CPU
eager with no CPU fallback; plus the regression tests of the bugs fixed with
them (avg_pool's negative divisor, sgn's backward, take on an empty source,
kthvalue's and reductions' dim errors, empty_strided's strides,
_copy_from_and_resize, handler errors inside torch.autograd.grad)."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core import _ops
from torch_xla_core._ops import aten
from util import assert_matches_cpu


def rand(*shape, grad=True):
    return torch.randn(*shape).requires_grad_(grad)


def fallbacks():
    return dict(txc.metrics.fallbacks())


# ---- order statistics, searches, histograms -------------------------------------

@pytest.mark.parametrize("name,fn", [
    ("median", lambda x: x.median()),
    ("median_dim", lambda x: x.median(1)),
    ("median_keepdim", lambda x: x.median(0, keepdim=True)),
    ("nanmedian", lambda x: torch.where(x > 1, float("nan"), x).nanmedian()),
    ("nanmedian_dim", lambda x: torch.where(x > 1, float("nan"), x).nanmedian(1)),
    ("median_nan", lambda x: [r.nan_to_num(7.0) for r in torch.where(x > 1, float("nan"), x).median(1)]),
    ("mode", lambda x: (x * 2).round().mode(1)),
    ("mode_dim0", lambda x: (x * 2).round().mode(0, keepdim=True)),
])
def test_order_statistics(name, fn):
    torch.manual_seed(0)
    assert_matches_cpu(fn, rand(5, 7))


def test_median_empty_dim_error():
    x = torch.ones(3, 0, device=txc.device())
    for f, name in ((lambda: x.median(1), "median"), (lambda: x.mode(1), "mode"),
                    (lambda: x.kthvalue(1, 1), "kthvalue")):
        with pytest.raises(IndexError, match=rf"^{name}\(\): Expected reduction dim 1 to have non-zero size\.$"):
            f()


@pytest.mark.parametrize("kw", [{}, {"right": True}, {"side": "right"}, {"out_int32": True}])
def test_searchsorted(kw):
    torch.manual_seed(0)
    seq = torch.sort(torch.randn(3, 6))[0]
    seq[0, 2] = seq[0, 1]  # a repeated boundary
    vals = torch.cat([torch.randn(3, 4), seq[:, :2]], 1)
    assert_matches_cpu(lambda s, v: torch.searchsorted(s, v, **kw), seq, vals)
    assert_matches_cpu(lambda s, v: torch.searchsorted(s[0], v, **kw), seq, vals)
    assert_matches_cpu(lambda s: torch.searchsorted(s[0], 0.25, **kw), seq)


def test_searchsorted_sorter_and_bucketize():
    torch.manual_seed(0)
    seq = torch.randn(7)
    sorter = torch.argsort(seq)
    assert_matches_cpu(lambda s, v, o: torch.searchsorted(s, v, sorter=o), seq, torch.randn(5), sorter)
    assert_matches_cpu(lambda v, b: torch.bucketize(v, b, right=True), torch.randn(4, 3), torch.sort(seq)[0])


def test_isin():
    x = torch.randint(0, 10, (4, 6)).float()
    assert_matches_cpu(lambda a, b: torch.isin(a, b), x, torch.tensor([1.0, 3.0, 7.0]))
    assert_matches_cpu(lambda a, b: torch.isin(a, b, invert=True), x, torch.randint(0, 10, (300,)).float())


@pytest.mark.parametrize("kw", [{}, {"range": (-1.0, 1.0)}, {"density": True}, {"weight": True}])
def test_histogram(kw):
    torch.manual_seed(0)
    x = torch.randn(50)
    w = torch.rand(50) if kw.pop("weight", False) else None
    assert_matches_cpu(lambda a, w: torch.histogram(a, 7, weight=w, **kw), x, w)
    bins = torch.tensor([-2.0, -0.5, 0.0, 0.3, 2.0])
    kw.pop("range", None)
    assert_matches_cpu(lambda a, b, w: torch.histogram(a, b, weight=w, **kw), x, bins, w)


def test_histogram_single_value_and_empty():
    assert_matches_cpu(lambda a: torch.histogram(a, 3), torch.ones(4))
    assert_matches_cpu(lambda a: torch.histogram(a, 3), torch.ones(0))


def test_histogramdd():
    torch.manual_seed(0)
    x = torch.randn(40, 2)
    assert_matches_cpu(lambda a: torch.histogramdd(a, [3, 4]), x)
    assert_matches_cpu(lambda a, w: torch.histogramdd(a, [3, 2], range=[-1.0, 1.0, -2.0, 2.0], weight=w,
                                                      density=True), x, torch.rand(40))
    assert_matches_cpu(lambda a, b0, b1: torch.histogramdd(a, [b0, b1]), x, torch.tensor([-1.0, 0.0, 1.0]),
                       torch.tensor([-3.0, 0.5, 3.0]))


@pytest.mark.parametrize("size", [0, 3, 20])
def test_nonzero_static(size):
    x = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0], [0.0, 0.0, 4.0]])
    assert_matches_cpu(lambda a: torch.nonzero_static(a, size=size), x)
    assert_matches_cpu(lambda a: torch.nonzero_static(a, size=size, fill_value=7), x[0])


# ---- flat indexing, index_reduce, misc --------------------------------------------

def test_take_put():
    torch.manual_seed(0)
    idx = torch.tensor([[0, -1], [5, 3]])
    assert_matches_cpu(lambda x, i: torch.take(x, i), rand(3, 4), idx)
    assert_matches_cpu(lambda x, s, i: x.put(i, s), rand(3, 4), rand(2, 2), idx)
    assert_matches_cpu(lambda x, s, i: x.put(i, s, accumulate=True), rand(3, 4), rand(2, 2), idx.abs() % 3)


def test_take_empty_source():
    """Regression: take from an empty tensor emitted an invalid gather."""
    e = torch.ones(0, 2)
    assert_matches_cpu(lambda x: torch.take(x, torch.zeros(0, dtype=torch.int64)), e)
    with pytest.raises(IndexError, match=r"^take\(\): tried to take from an empty tensor$"):
        torch.take(e.to(txc.device()), torch.tensor([0], device=txc.device()))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    torch.manual_seed(0)
    idx = torch.tensor([0, 2, 0, 3])
    assert_matches_cpu(lambda x, s, i: x.index_reduce(1, i, s, reduce, include_self=include_self),
                       rand(3, 5), rand(3, 4), idx)


def test_allclose_and_resize_as():
    a = torch.randn(3, 4)
    before = fallbacks()
    d = a.to(txc.device())
    assert torch.allclose(d, d + 1e-9) is True
    assert torch.allclose(d, d + 1) is False
    with pytest.raises(RuntimeError, match="^Float did not match Double$"):
        torch.allclose(d, d.double())
    assert_matches_cpu(lambda x, y: x.clone().resize_as_(y), a, torch.ones(2, 6))
    assert_matches_cpu(lambda x, y: x.clone().resize_as_(y), a, torch.ones(2, 2))
    assert fallbacks() == before


def test_linspace_logspace_tensor_bounds():
    dev = txc.device()
    before = fallbacks()
    for f in (torch.linspace, torch.logspace):
        got = f(torch.tensor(-2.0), torch.tensor(3), 5, device=dev)
        torch.testing.assert_close(got.cpu(), f(torch.tensor(-2.0), torch.tensor(3), 5))
    assert fallbacks() == before


def test_repeat_interleave_output_size_on_device():
    r = torch.tensor([0, 1, 2, 3])
    assert_matches_cpu(lambda x, r: x.repeat_interleave(r, dim=0, output_size=6), rand(4, 2), r)
    assert_matches_cpu(lambda x: x.repeat_interleave(2, dim=1), rand(4, 2))


def test_repeat_interleave_data_dependent_is_a_counted_fallback():
    before = fallbacks().get("repeat_interleave.Tensor", 0)
    x = torch.arange(3.0)
    got = x.to(txc.device()).repeat_interleave(torch.tensor([1, 0, 2], device=txc.device()))
    torch.testing.assert_close(got.cpu(), x.repeat_interleave(torch.tensor([1, 0, 2])))
    assert fallbacks()["repeat_interleave.Tensor"] == before + 1


# ---- nn ------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_pdist(p):
    torch.manual_seed(0)
    x = torch.randn(5, 3)
    x[3] = x[1]  # a zero distance
    assert_matches_cpu(lambda a: F.pdist(a, p), x.requires_grad_(), grad=p > 0.0)


def test_bilinear():
    torch.manual_seed(0)
    assert_matches_cpu(F.bilinear, rand(4, 3), rand(4, 5), rand(2, 3, 5), rand(2))


@pytest.mark.parametrize("fn", [F.hardshrink, F.softshrink])
def test_shrink_backward(fn):
    x = torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.3, 0.5, 0.9]).requires_grad_()
    assert_matches_cpu(fn, x)


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_multi_margin_loss_backward(p, reduction):
    torch.manual_seed(0)
    t = torch.tensor([0, 3, 2, 1])
    assert_matches_cpu(lambda x, w, t: F.multi_margin_loss(x, t, p=p, margin=0.7, weight=w, reduction=reduction),
                       rand(4, 5), torch.rand(5), t)
    assert_matches_cpu(lambda x, t: F.multi_margin_loss(x, t, p=p, reduction=reduction), rand(5), t[1])


@pytest.mark.parametrize("shape,pad", [((2, 3, 5), (2, 1)), ((1, 2, 4, 5), (1, 2, 3, 0)),
                                       ((1, 1, 3, 4, 5), (1, 1, 2, 0, 1, 2)), ((1, 2, 4, 5), (-1, 2, 1, -2))])
def test_replicate_pad_backward(shape, pad):
    assert_matches_cpu(lambda x: F.pad(x, pad, mode="replicate"), rand(*shape))


def test_embedding_max_norm():
    torch.manual_seed(0)
    idx = torch.tensor([[0, 2], [2, 4]])

    def f(w, i):
        w = w.clone()
        return F.embedding(i, w, max_norm=1.0), w
    assert_matches_cpu(f, torch.randn(6, 3) * 2, idx, grad=False)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("case", ["offsets", "2d", "padding", "last_offset", "weights"])
def test_embedding_bag(mode, case):
    torch.manual_seed(0)
    idx, off = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 6])
    kw = {"mode": mode}
    if case == "2d":
        idx, off = idx.reshape(2, 4), None
    elif case == "padding":
        kw["padding_idx"] = 4
    elif case == "last_offset":
        off, kw["include_last_offset"] = torch.tensor([0, 3, 8]), True
    elif case == "weights":
        if mode != "sum":
            pytest.skip("per_sample_weights: sum mode only")
        psw = torch.rand(8).requires_grad_()
        assert_matches_cpu(lambda w, i, o, s: F.embedding_bag(i, w, o, per_sample_weights=s, **kw), rand(10, 3),
                           idx, off, psw)
        return
    assert_matches_cpu(lambda w, i, o, **k: F.embedding_bag(i, w, o, **k), rand(10, 3), idx, off, **kw)


def test_embedding_bag_scale_grad_by_freq_is_a_counted_fallback():
    idx, off = torch.tensor([1, 2, 1, 1, 4]), torch.tensor([0, 2])
    before = fallbacks().get("_embedding_bag_backward", 0)
    assert_matches_cpu(lambda w, i, o: F.embedding_bag(i, w, o, scale_grad_by_freq=True), rand(6, 3), idx, off,
                       no_fallback=False)
    assert fallbacks()["_embedding_bag_backward"] == before + 1


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_backward(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    assert_matches_cpu(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode,
                                                  align_corners=align_corners),
                       rand(2, 3, 5, 6), (torch.rand(2, 4, 3, 2) * 2.4 - 1.2).requires_grad_(), atol=1e-4)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    assert_matches_cpu(lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding_mode,
                                                  align_corners=align_corners),
                       rand(2, 2, 3, 4, 5), (torch.rand(2, 2, 3, 2, 3) * 2.4 - 1.2).requires_grad_(), atol=1e-4)


@pytest.mark.parametrize("targets_2d,reduction", [(True, "mean"), (False, "none")])
def test_ctc_loss(targets_2d, reduction):
    torch.manual_seed(0)
    T, N, C, S = 12, 3, 5, 4
    lp = torch.randn(T, N, C).log_softmax(2).detach().requires_grad_()
    tl, il = torch.tensor([4, 2, 3]), torch.tensor([12, 9, 10])
    tg = torch.randint(1, C, (N, S))
    if not targets_2d:
        tg = torch.cat([tg[i, :tl[i]] for i in range(N)])
    assert_matches_cpu(lambda x, g, i, t: F.ctc_loss(x, g, i, t, reduction=reduction), lp, tg, il, tl, atol=1e-4)
    assert_matches_cpu(lambda x, g: F.ctc_loss(x, g, il.tolist(), tl.tolist(), reduction=reduction), lp, tg,
                       atol=1e-4)


def test_ctc_loss_zero_infinity():
    lp = torch.randn(3, 2, 4).log_softmax(2).detach().requires_grad_()
    tg = torch.tensor([[1, 1, 1], [2, 0, 0]])  # row 0 needs 5 steps: impossible in 3
    for zi in (True, False):
        assert_matches_cpu(lambda x, g: F.ctc_loss(x, g, [3, 3], [3, 1], zero_infinity=zi, reduction="sum"), lp,
                           tg, grad=zi)


def test_linear_cross_entropy_chunked():
    # torch 2.13 added F.linear_cross_entropy's options (torch_compat's table: 2.11-2.12 have none)
    opts_module = pytest.importorskip("torch.nn.modules.linear_cross_entropy_options",
                                      reason=f"torch {torch.__version__} has no linear_cross_entropy options "
                                             f"(added in torch 2.13)")
    LinearCrossEntropyOptions = opts_module.LinearCrossEntropyOptions
    torch.manual_seed(0)
    t = torch.tensor([0, 2, 1, 3, 2, 0])
    for reduction in ("mean", "none"):
        opts = LinearCrossEntropyOptions(batch_chunk_size=2)
        assert_matches_cpu(lambda x, w, t: F.linear_cross_entropy(x, w, t, reduction=reduction, options=opts),
                           rand(6, 3), rand(4, 3), t, atol=1e-4)


# ---- random: compared by law, not values ------------------------------------------------

def test_fractional_max_pool():
    torch.manual_seed(0)
    dev = txc.device()
    before = fallbacks()
    for f, shape in ((F.fractional_max_pool2d, (2, 3, 9, 8)), (F.fractional_max_pool3d, (1, 2, 7, 8, 6))):
        x = torch.randn(*shape, device=dev, requires_grad=True)
        out, idx = f(x, 2, output_size=(4,) * (len(shape) - 2), return_indices=True)
        assert out.shape == (*shape[:2], *(4,) * (len(shape) - 2))
        flat = x.detach().flatten(2).cpu()
        # each output is the input element its index names, and the max of its 2^d window
        torch.testing.assert_close(out.detach().cpu().flatten(2), flat.gather(2, idx.cpu().flatten(2)))
        out.sum().backward()
        g = torch.zeros_like(flat).scatter_add(2, idx.cpu().flatten(2), torch.ones(idx.flatten(2).shape))
        torch.testing.assert_close(x.grad.cpu().flatten(2), g)
    assert fallbacks() == before


def test_multinomial():
    torch.manual_seed(0)
    dev = txc.device()
    before = fallbacks()
    p = torch.tensor([[0.0, 1.0, 3.0, 0.0, 6.0], [1.0, 1.0, 1.0, 1.0, 0.0]])
    s = torch.multinomial(p.to(dev), 4000, replacement=True).cpu()
    assert s.shape == (2, 4000) and s.dtype == torch.int64
    freq = torch.stack([torch.bincount(r, minlength=5) for r in s]).float() / 4000
    torch.testing.assert_close(freq, p / p.sum(1, keepdim=True), atol=0.04, rtol=0)  # zero-probability never drawn
    w = torch.multinomial(p.to(dev), 3).cpu()
    assert all(len(set(r.tolist())) == 3 for r in w)
    assert (p.gather(1, w) > 0).all()
    assert fallbacks() == before
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        torch.multinomial(p.to(dev), 6)


def test_rrelu():
    torch.manual_seed(0)
    dev = txc.device()
    before = fallbacks()
    x = torch.randn(200)
    assert_matches_cpu(lambda a: F.rrelu(a, training=False), x.clone().requires_grad_())
    xd = x.to(dev).requires_grad_()
    y = F.rrelu(xd, 0.1, 0.3, training=True)
    y.sum().backward()
    y, g = y.detach().cpu(), xd.grad.cpu()
    neg = x < 0
    slope = y[neg] / x[neg]
    assert ((slope >= 0.1) & (slope <= 0.3)).all() and slope.std() > 0.01
    torch.testing.assert_close(y[~neg], x[~neg])
    torch.testing.assert_close(g[neg], slope)
    assert fallbacks() == before


# ---- bugs -------------------------------------------------------------------------------

def test_avg_pool_negative_divisor():
    """Regression: divisor_override=-2 raised "divisor must be not zero"."""
    assert_matches_cpu(lambda x: F.avg_pool2d(x, 2, divisor_override=-2), rand(1, 1, 4, 4))
    assert_matches_cpu(lambda x: F.avg_pool3d(x, 2, divisor_override=-3), rand(1, 1, 4, 4, 4))
    with pytest.raises(RuntimeError, match="divisor must be not zero"):
        F.avg_pool2d(torch.ones(1, 1, 4, 4, device=txc.device()), 2, divisor_override=0)


def test_sgn_backward_efficientzerotensor():
    """Regression: sgn's backward made aten::_efficientzerotensor, which had no xla kernel."""
    assert_matches_cpu(torch.sgn, torch.tensor([-2.0, 0.0, 3.0]).requires_grad_())
    z = torch.ops.aten._efficientzerotensor([2, 3], device=txc.device())
    assert z.device.type == "xla" and torch.equal(z.cpu(), torch.zeros(2, 3))


def test_reduction_dim_out_of_range_is_index_error():
    """Regression: norm(p=0, dim=3) raised the core's RuntimeError (sum over dim 3)."""
    x = torch.ones(3, 2, device=txc.device())
    msg = r"^Dimension out of range \(expected to be in range of \[-2, 1\], but got 3\)$"
    for f in (lambda: torch.norm(x, p=0, dim=3), lambda: x.sum(3), lambda: x.mean((0, 3))):
        with pytest.raises(IndexError, match=msg):
            f()


def test_empty_strided_reports_strides():
    dev = txc.device()
    t = torch.empty_strided((2, 3), (1, 2), device=dev)
    assert t.stride() == (1, 2) and not t.is_contiguous()
    t.copy_(torch.arange(6.0).reshape(2, 3))
    torch.testing.assert_close((t + 1).cpu(), torch.arange(6.0).reshape(2, 3) + 1)
    assert torch.zeros(4, device=dev).new_empty_strided((2, 2), (1, 2)).stride() == (1, 2)
    assert torch.empty_strided((2, 3), (3, 1), device=dev).is_contiguous()


def test_copy_from_and_resize_reshapes_the_value():
    src = torch.arange(6.0).reshape(2, 3)
    for excluded in (False, True):
        dst = torch.zeros(2, device=txc.device())
        if excluded:  # the PrivateUse1 kernel (Python key excluded), as CPU's copy_ reaches it
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
                torch.ops.aten._copy_from_and_resize(src, dst)
        else:
            torch.ops.aten._copy_from_and_resize(src, dst)
        assert dst.shape == (2, 3)
        torch.testing.assert_close((dst + 1).cpu(), src + 1)


@pytest.mark.parametrize("how", ["grad", "backward", "Tensor.backward"])
def test_handler_error_in_autograd_surfaces(how, monkeypatch):
    """Regression: an op handler's error inside torch.autograd.grad/backward
    surfaced as "SystemError: ... returned NULL without setting an exception"."""
    from torch_xla_core import _C
    from torch_xla_core._tracing import tensor as _tensor

    def bad(*args, **kwargs):
        raise ValueError("hardshrink_backward failed on purpose")
    monkeypatch.setitem(_ops.HANDLERS, aten.hardshrink_backward.default, bad)
    _C.dispatch_clear()
    try:
        x = torch.ones(3, device=txc.device(), requires_grad=True)
        y = F.hardshrink(x * 2).sum()
        run = {"grad": lambda: torch.autograd.grad(y, [x]), "backward": lambda: torch.autograd.backward([y]),
               "Tensor.backward": y.backward}[how]
        with pytest.raises(ValueError, match="^hardshrink_backward failed on purpose$"):
            run()
        assert _C.take_handler_error() is None  # reported: not kept alive
    finally:
        monkeypatch.undo()
        _C.dispatch_clear()


def test_distributions_log_prob_and_kl_without_fallback(dev):
    """torch.distributions with argument validation (torch._is_all_true checks) matches CPU,
    gradients included, with no CPU fallback."""
    D = torch.distributions

    def run(d):
        mu = torch.zeros(3, device=d, requires_grad=True)
        sc = torch.ones(3, device=d, requires_grad=True)
        v = torch.tensor([0.5, -1.0, 2.0], device=d)
        lp = (D.Normal(mu, sc).log_prob(v).sum() + D.Categorical(logits=mu).log_prob(torch.tensor(1, device=d))
              + D.Beta(sc + 1, sc + 2).log_prob(torch.tensor([0.3, 0.5, 0.7], device=d)).sum()
              + D.Dirichlet(sc + 1).log_prob(torch.tensor([0.2, 0.3, 0.5], device=d))
              + D.MultivariateNormal(mu, torch.eye(3, device=d) * 2).log_prob(v)
              + D.kl_divergence(D.Normal(mu, sc), D.Normal(mu + 1, sc * 2)).sum())
        lp.backward()
        return lp, mu.grad, sc.grad
    want = run("cpu")
    before = dict(txc.metrics.fallbacks())
    got = run(dev)
    assert dict(txc.metrics.fallbacks()) == before
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-5)
