"""torch's multi-tensor ops (_foreach_*) and fused optimizer steps
(Adam/AdamW/SGD with fused=True) on the device against CPU eager, without
CPU fallbacks; GradScaler("xla") with a fused optimizer never reads a value
on the host; the CPU fallback writes back mutated tensor lists; torch.optim
and clip_grad_norm_ take their foreach path for xla parameters by default."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import metrics

aten = torch.ops.aten
DEV = txc.device()


def _xla(ts):
    return [t.to(DEV) for t in ts]


def _close(xla, cpu, **kw):
    if isinstance(cpu, (list, tuple)):
        assert len(xla) == len(cpu)
        for a, b in zip(xla, cpu):
            _close(a, b, **kw)
    else:
        torch.testing.assert_close(xla.cpu(), cpu, **kw)


def _lists(n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(4,), (2, 3), (5, 1)]
    return [torch.rand(shapes[i % 3], generator=g) + 0.5 for i in range(n)]


FUNCTIONAL = [
    ("add.Scalar", lambda a, b: torch._foreach_add(a, 2.5)),
    ("add.List", lambda a, b: torch._foreach_add(a, b, alpha=-0.5)),
    ("add.ScalarList", lambda a, b: torch._foreach_add(a, [1.0, 2.0, 3.0])),
    ("mul.Tensor", lambda a, b: torch._foreach_mul(a, b[0].sum())),
    ("div.List", lambda a, b: torch._foreach_div(a, b)),
    ("addcmul.Scalar", lambda a, b: torch._foreach_addcmul(a, b, a, value=0.3)),
    ("addcdiv.ScalarList", lambda a, b: torch._foreach_addcdiv(a, b, a, [0.1, 0.2, 0.3])),
    ("lerp.Scalar", lambda a, b: torch._foreach_lerp(a, b, 0.25)),
    ("pow.ScalarAndTensor", lambda a, b: torch._foreach_pow(2.0, a)),
    ("maximum.List", lambda a, b: torch._foreach_maximum(a, b)),
    ("clamp_min.Scalar", lambda a, b: torch._foreach_clamp_min(a, 0.9)),
    ("norm.Scalar", lambda a, b: torch._foreach_norm(a, 3)),
    ("max", lambda a, b: torch._foreach_max(a)),
    ("sqrt", lambda a, b: torch._foreach_sqrt(a)),
    ("sign", lambda a, b: torch._foreach_sign(torch._foreach_sub(a, 1.0))),
]


@pytest.mark.parametrize("name,fn", FUNCTIONAL, ids=[n for n, _ in FUNCTIONAL])
def test_foreach_functional_matches_cpu(name, fn):
    a, b = _lists(seed=1), _lists(seed=2)
    metrics.clear()
    out = fn(_xla(a), _xla(b))
    _close(out, fn(a, b))
    assert metrics.fallbacks() == {}


INPLACE = [
    ("add_.List", lambda a, b: torch._foreach_add_(a, b, alpha=2)),
    ("mul_.Scalar", lambda a, b: torch._foreach_mul_(a, 0.5)),
    ("addcmul_.Tensor", lambda a, b: torch._foreach_addcmul_(a, b, b, torch.tensor([0.1, 0.2, 0.3],
                                                                                    device=a[0].device))),
    ("zero_", lambda a, b: torch._foreach_zero_(a)),
    ("copy_", lambda a, b: torch._foreach_copy_(a, b)),
    ("exp_", lambda a, b: torch._foreach_exp_(a)),
]


@pytest.mark.parametrize("name,fn", INPLACE, ids=[n for n, _ in INPLACE])
def test_foreach_inplace_matches_cpu(name, fn):
    a, b = _lists(seed=3), _lists(seed=4)
    xa, xb = _xla(a), _xla(b)
    metrics.clear()
    fn(xa, xb)
    fn(a, b)
    _close(xa, a)
    assert metrics.fallbacks() == {}


def _like_lists(seed):
    """Elements that share shapes and dtypes (a foreach call builds its first element's nodes once per
    dtype, shape and numbers and rebuilds them over the others: csrc/py/foreach.cpp), among others."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (4, 3), (5,), (4, 3), (5,), (4, 3)]
    ts = [torch.rand(s, generator=g) + 0.5 for s in shapes]
    ts[3] = ts[3].to(torch.bfloat16)  # bf16: its handler computes in float32 and rounds once
    ts[5] = ts[5].to(torch.bfloat16)
    return ts


SCALARS = [0.1, 0.1, 0.2, 0.3, 0.2, 0.1]
PER_ELEMENT = [  # (foreach call, the same as one per-tensor op per element)
    ("add_.List", lambda a, b: torch._foreach_add_(a, b, alpha=0.7),
     lambda x, y, s: x.add_(y, alpha=0.7)),
    ("mul_.Scalar", lambda a, b: torch._foreach_mul_(a, 0.999), lambda x, y, s: x.mul_(0.999)),
    ("lerp_.Scalar", lambda a, b: torch._foreach_lerp_(a, b, 0.1), lambda x, y, s: x.lerp_(y, 0.1)),
    ("lerp_.Scalar high", lambda a, b: torch._foreach_lerp_(a, b, 0.8), lambda x, y, s: x.lerp_(y, 0.8)),
    ("addcmul_.Scalar", lambda a, b: torch._foreach_addcmul_(a, b, b, 0.001),
     lambda x, y, s: x.addcmul_(y, y, value=0.001)),
    ("addcdiv_.ScalarList", lambda a, b: torch._foreach_addcdiv_(a, b, a, SCALARS),
     lambda x, y, s: x.addcdiv_(y, x, value=s)),
    ("div_.ScalarList", lambda a, b: torch._foreach_div_(a, SCALARS), lambda x, y, s: x.div_(s)),
    ("sqrt", lambda a, b: torch._foreach_sqrt(a), lambda x, y, s: x.sqrt()),
    ("maximum", lambda a, b: torch._foreach_maximum(a, b), lambda x, y, s: torch.maximum(x, y)),
    ("sub.Scalar", lambda a, b: torch._foreach_sub(a, 1), lambda x, y, s: x.sub(1)),
]


@pytest.mark.parametrize("name,fn,one", PER_ELEMENT, ids=[n for n, _, _ in PER_ELEMENT])
def test_foreach_elements_of_one_shape_are_bitwise_the_per_tensor_op(name, fn, one):
    """Elements whose nodes are rebuilt from the first one of their dtype and shape give bitwise what
    the per-tensor op gives each of them on the device (and match CPU's foreach)."""
    a, b = _like_lists(5), _like_lists(6)
    b = [y.to(x.dtype) for x, y in zip(a, b)]
    xa, xb = _xla(a), _xla(b)
    ea, eb = _xla(a), _xla(b)
    out = fn(xa, xb)
    each = [one(x, y, s) for x, y, s in zip(ea, eb, SCALARS)]
    got, want = (out, each) if out is not None else (xa, ea)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.cpu(), w.cpu()), name
    cpu = fn(a, b)
    for g, c in zip(got, cpu if cpu is not None else a):
        tol = dict(rtol=1.6e-2, atol=1e-2) if c.dtype == torch.bfloat16 else dict(rtol=1.3e-6, atol=1e-5)
        torch.testing.assert_close(g.cpu(), c, **tol)


def test_foreach_inplace_reads_each_element_after_the_writes_before_it():
    """An in-place foreach over elements that read each other's storage: element j sees the writes of
    elements before it, as CPU's per-element loop (a view of another element, and the lists swapped)."""
    def run(dev):
        base = torch.arange(12.0).reshape(4, 3).to(dev)
        a = [base[0], base[1], base[2], base[3]]  # views of one storage
        b = [a[1], a[2], a[3], a[0]]
        torch._foreach_add_(a, b)
        c = [torch.full((3,), float(i)).to(dev) for i in range(3)]
        torch._foreach_mul_(c, [c[1], c[2], c[0]])
        return [base] + c
    for x, c in zip(run(DEV), run("cpu")):
        assert torch.equal(x.cpu(), c)


def test_foreach_length_mismatch_raises_as_cpu():
    a = _lists(3)
    with pytest.raises(RuntimeError) as cpu:
        torch._foreach_add(a, a[:2])
    xa = _xla(a)
    with pytest.raises(RuntimeError) as xla:
        torch._foreach_add(xa, xa[:2])
    assert str(xla.value) == str(cpu.value)


def test_functional_copy_leaves_its_input():
    dst, src = torch.zeros(2, 3), torch.arange(3.0)
    xdst = dst.to(DEV)
    out = aten.copy(xdst, src.to(DEV).to(torch.int64))
    _close(out, aten.copy(dst, src.to(torch.int64)))
    assert out.dtype == torch.float32
    _close(xdst, dst)


def _train(opt_cls, device, fused, foreach, steps=3, scaler=None, inf_at=None, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    opt = opt_cls(model.parameters(), fused=fused, foreach=foreach, **kw)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        x = torch.randn(6, 8, generator=g).to(device)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if inf_at == i:
            loss = loss * float("inf")
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        if device != "cpu":
            txc.sync()
    return model, opt


OPTIMIZERS = [
    (torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
    (torch.optim.Adam, dict(lr=0.05, weight_decay=0.1, amsgrad=True, maximize=True)),
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (torch.optim.SGD, dict(lr=0.05, momentum=0.9, dampening=0.1)),
    (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, maximize=True)),
]


@pytest.mark.parametrize("mode", ["fused", "foreach"])
@pytest.mark.parametrize("opt_cls,kw", OPTIMIZERS, ids=["adamw", "adam-amsgrad-max", "sgd-nesterov", "sgd-damp", "adagrad"])
def test_optimizer_step_matches_cpu(opt_cls, kw, mode):
    fused, foreach = (True, None) if mode == "fused" else (None, True)
    cpu, _ = _train(opt_cls, "cpu", fused, foreach, **kw)
    metrics.clear()
    xla, _ = _train(opt_cls, DEV, fused, foreach, **kw)
    assert metrics.fallbacks() == {}
    for p, q in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)


def test_grad_scaler_with_fused_adamw_is_sync_free_and_matches_cpu():
    kw = dict(lr=0.05, weight_decay=0.1)
    cpu, cpu_opt = _train(torch.optim.AdamW, "cpu", True, None, steps=4, inf_at=2,
                          scaler=torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2), **kw)
    scaler = torch.amp.GradScaler("xla", init_scale=1024.0, growth_interval=2)
    metrics.clear()
    xla, _ = _train(torch.optim.AdamW, DEV, True, None, steps=4, inf_at=2, scaler=scaler, **kw)
    # nothing came back to the host during the steps: no .item() on found_inf
    assert metrics.counters().get("transfer_to_host", 0) == 0
    assert metrics.fallbacks() == {}
    for p, q in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)
    # the inf step was skipped and backed the scale off, then it grew once: as on the CPU
    assert scaler.get_scale() == 1024.0


def test_cpu_fallback_writes_back_mutated_tensor_lists():
    from torch_xla_core._ops import fallback
    a = _lists(2)
    xa = _xla(a)
    fallback(aten._foreach_add_.Scalar)(xa, 1.5)
    _close(xa, [t + 1.5 for t in a])


def _counting_foreach(monkeypatch):
    """Counts calls of torch._foreach_* as torch.optim and clip_grad_norm_ make them."""
    calls = []
    for name in [n for n in dir(torch) if n.startswith("_foreach_")]:
        f = getattr(torch, name)

        def wrapped(*a, _f=f, _n=name, **k):
            calls.append(_n)
            return _f(*a, **k)
        monkeypatch.setattr(torch, name, wrapped)
    return calls


@pytest.mark.parametrize("capturable", [False, True], ids=["default", "capturable"])
def test_optimizer_default_is_foreach_on_xla(monkeypatch, capturable):
    """AdamW() and clip_grad_norm_ without foreach= take the foreach path for xla parameters (torch's
    type lists held only Tensor/Parameter, so they took the per-tensor loop), also with capturable=True
    and a device lr as replay lifts Adam; results as CPU's per-tensor loop."""
    def run(device, calls=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
        cap = capturable and device != "cpu"  # CPU: torch's capturable needs an accelerator
        lr = torch.tensor(0.05).to(device) if cap else 0.05
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, capturable=cap)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            model(torch.randn(6, 8, generator=g).to(device)).pow(2).mean().backward()
            if calls is not None:
                calls.clear()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            if device != "cpu":
                txc.sync()
        return model, opt
    cpu, _ = run("cpu")
    assert not any(g.get("foreach") for g in _.param_groups)
    calls = _counting_foreach(monkeypatch)
    metrics.clear()
    xla, opt = run(DEV, calls)
    assert "_foreach_norm" in calls and "_foreach_mul_" in calls  # clip_grad_norm_
    assert "_foreach_lerp_" in calls and "_foreach_addcdiv_" in calls or "_foreach_div_" in calls  # AdamW
    assert metrics.fallbacks() == {}
    for p, q in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5)
