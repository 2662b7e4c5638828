"""Trace once, replay (torch_xla_core/replay/): replayed steps equal traced
ones (AdamW + LR scheduler, dropout RNG, in-place inputs, deferred checks),
the function body runs only when the signature changes, and what cannot be
replayed (host reads, unknown device data) is traced every call, visibly."""
import copy
import types

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core import executor
from torch_xla_core._tracing import random as _random


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2),
                               torch.nn.Linear(16, 4))


_calls = {"n": 0}


def _train_step(model, opt, x, y):
    _calls["n"] += 1
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def _train(dev, monkeypatch, replay, n=10):
    monkeypatch.setenv("TXC_REPLAY", "1" if replay else "0")
    m = _model().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))  # a new lr every step
    step = txc.compile(_train_step)
    _random.manual_seed(7)
    g = torch.Generator().manual_seed(1)
    losses = []
    _calls["n"] = 0
    for _ in range(n):
        x, y = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
        losses.append(step(m, opt, x.to(dev), y.to(dev)))
        sched.step()
        txc.sync()  # a step per graph, as a training loop runs
    return [p.detach().cpu() for p in m.parameters()], [l.item() for l in losses], _calls["n"]


def test_adamw_with_scheduler_replayed_equals_traced(dev, monkeypatch):
    executor.clear_cache()
    p_tr, l_tr, n_tr = _train(dev, monkeypatch, replay=False)
    assert n_tr == 10
    txc.metrics.clear()
    p_re, l_re, n_re = _train(dev, monkeypatch, replay=True)
    c = txc.metrics.counters()
    # call 1 makes the optimizer state (transitional), call 2 records, 3..10 replay
    assert n_re == 2 and c["replay"] == 8 and c["replay_record"] == 1, c
    assert l_re == l_tr
    for a, b in zip(p_re, p_tr):
        assert torch.equal(a, b)


def test_replay_matches_the_unlifted_optimizer(dev, monkeypatch):
    """Against plain tracing with torch's default AdamW (step and lr on the
    host): equal up to float32 rounding of the bias corrections."""
    p_re, l_re, _ = _train(dev, monkeypatch, replay=True)
    m = _model().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    _random.manual_seed(7)
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        x, y = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
        _train_step(m, opt, x.to(dev), y.to(dev))
        sched.step()
        txc.sync()
    for a, b in zip(p_re, m.parameters()):
        torch.testing.assert_close(a, b.detach().cpu(), rtol=1e-5, atol=1e-6)


def test_cpu_eager_reference(dev):
    """A replayed step without randomness equals eager PyTorch on the CPU."""
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    xm = copy.deepcopy(cpu).to(dev)
    oc = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    ox = torch.optim.SGD(xm.parameters(), lr=0.1, momentum=0.9)
    step = txc.compile(_train_step)
    for i in range(6):
        x, y = torch.randn(3, 8), torch.randn(3, 4)
        lc = _train_step(cpu, oc, x, y)
        lx = step(xm, ox, x.to(dev), y.to(dev))
        torch.testing.assert_close(lx.cpu(), lc)
    for a, b in zip(xm.parameters(), cpu.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach())
    assert txc.metrics.counters()["replay"] >= 3


def test_signature_change_traces_again_and_old_one_still_replays(dev):
    calls = []

    def f(x, scale):
        calls.append(x.shape[0])
        return (x * scale).sum(0)

    step = txc.compile(f)
    xs = {n: torch.randn(n, 3) for n in (2, 4)}
    for n, s in [(2, 1.5), (2, 1.5), (4, 1.5), (4, 1.5), (2, 1.5), (2, 2.0)]:
        torch.testing.assert_close(step(xs[n].to(dev), s).cpu(), (xs[n] * s).sum(0))
    assert calls == [2, 4, 2]  # (2, 1.5) and (4, 1.5) replayed; scale 2.0 is a new signature
    assert txc.metrics.counters()["replay"] == 3


def test_rng_advances_as_a_traced_step_does(dev, monkeypatch):
    def f(x):
        return x + torch.rand_like(x)

    out = {}
    for replay in ("0", "1"):
        monkeypatch.setenv("TXC_REPLAY", replay)
        step = txc.compile(f)
        _random.manual_seed(3)
        x = torch.zeros(4).to(dev)
        out[replay] = [step(x).cpu() for _ in range(4)] + [torch.rand(2, device=dev).cpu()]
    assert all(torch.equal(a, b) for a, b in zip(out["0"], out["1"]))
    assert not torch.equal(out["1"][2], out["1"][3])  # each replay draws anew
    assert txc.metrics.counters()["replay"] == 3


def test_in_place_update_of_an_input(dev):
    def f(acc, x):
        acc.add_(x)
        return acc * 2

    step = txc.compile(f)
    acc = torch.zeros(3).to(dev)
    ref = torch.zeros(3)
    for i in range(4):
        x = torch.full((3,), float(i))
        ref.add_(x)
        torch.testing.assert_close(step(acc, x.to(dev)).cpu(), ref * 2)
        torch.testing.assert_close(acc.cpu(), ref)
    assert txc.metrics.counters()["replay"] == 3


def test_host_read_in_step_is_a_guard_each_value_its_own_recording(dev):
    calls = {"n": 0}

    def f(x):
        calls["n"] += 1
        if x.sum().item() > 0:   # control flow on a value: the step is cut there, the value guarded
            return x * 2
        return x * -1

    step = txc.compile(f)
    for v in (1.0, -1.0, 1.0, -1.0, 2.0, -3.0):
        x = torch.full((2,), v)
        torch.testing.assert_close(step(x.to(dev)).cpu(), x * 2 if v > 0 else x * -1)
    c = txc.metrics.counters()
    # 1.0 records; -1.0 misses the guard and records its path; 1.0 and -1.0 replay theirs; 2.0 (sum 4.0) and
    # -3.0 read other values: new variants, up to MAX_VARIANTS per signature
    assert calls["n"] == 4 and c["replay"] == 2 and c["replay_record"] == 4 and c["replay_guard_miss"] == 3, c
    assert c.get("replay_refused", 0) == 0
    x = torch.full((2,), 5.0)  # past MAX_VARIANTS: traced, still right
    torch.testing.assert_close(step(x.to(dev)).cpu(), x * 2)
    assert calls["n"] == 5


def test_device_data_from_outside_is_refused(dev):
    holder = types.SimpleNamespace(t=torch.ones(2).to(dev))

    def f(x):
        return x + holder.t   # reached through an object we cannot guard

    step = txc.compile(f)
    with pytest.warns(RuntimeWarning, match="not among its inputs"):
        assert step(torch.zeros(2).to(dev)).cpu().tolist() == [1.0, 1.0]
    holder.t = torch.full((2,), 5.0).to(dev)
    assert step(torch.zeros(2).to(dev)).cpu().tolist() == [5.0, 5.0]
    assert txc.metrics.counters().get("replay", 0) == 0


_glob = {}


def test_global_tensor_and_module_are_inputs(dev):
    _glob["w"] = torch.ones(3).to(dev)
    lin = torch.nn.Linear(3, 3).to(dev)

    def f(x):
        with torch.no_grad():
            return lin(x) * _glob_w

    globals()["_glob_w"] = _glob["w"]
    f.__globals__["lin"] = lin
    step = txc.compile(f)
    x = torch.randn(2, 3)
    for i in range(3):
        globals()["_glob_w"] = torch.full((3,), float(i)).to(dev)   # rebinding the global: read anew
        ref = (x @ lin.weight.detach().cpu().T + lin.bias.detach().cpu()) * float(i)
        torch.testing.assert_close(step(x.to(dev)).cpu(), ref)
    assert txc.metrics.counters()["replay"] == 2


def _sgd_linear_after_3_steps(dev, n_out=4):
    """A Linear(4, n_out) with SGD, its compiled step recorded and replayed once."""
    m = torch.nn.Linear(4, n_out).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    step = txc.compile(_train_step)
    x, y = torch.randn(2, 4).to(dev), torch.randn(2, n_out).to(dev)
    for _ in range(3):
        step(m, opt, x, y)
    return m, opt, step, x, y


def test_copy_of_the_model_between_steps_keeps_its_values(dev):
    """A replay that would donate a buffer someone else holds traces instead."""
    m, opt, step, x, y = _sgd_linear_after_3_steps(dev)
    snap = copy.deepcopy(m)
    want = snap.weight.detach().cpu().clone()
    for _ in range(2):
        step(m, opt, x, y)
    torch.testing.assert_close(snap.weight.detach().cpu(), want)
    assert not torch.equal(m.weight.detach().cpu(), want)


def test_eval_mode_is_a_new_signature(dev):
    m = _model().to(dev)
    step = txc.compile(lambda mod, x: mod(x))
    x = torch.randn(3, 8)
    with torch.no_grad():
        m.eval()
        a = step(m, x.to(dev)).cpu()
        m.train()
        b = step(m, x.to(dev)).cpu()
        m.eval()
        c = step(m, x.to(dev)).cpu()
    assert torch.equal(a, c) and not torch.equal(a, b)   # dropout on in train mode
    assert txc.metrics.counters()["replay"] == 1


def test_deferred_check_raises_after_replay(dev):
    emb = torch.nn.Embedding(5, 2).to(dev)
    step = txc.compile(lambda e, i: e(i).sum())
    with torch.no_grad():
        for _ in range(2):
            step(emb, torch.tensor([0, 4]).to(dev)).item()
        with pytest.raises(IndexError, match="index out of range"):
            step(emb, torch.tensor([0, 9]).to(dev)).item()
    assert txc.metrics.counters()["replay"] == 2


def test_a_replay_reads_earlier_checks_once_launched(dev):
    """A replay reads the deferred checks of earlier runs once its own step
    is launched (while the device runs, not before): the violated check of
    one replayed call raises in the next call, whose step has run and
    written its outputs."""
    emb = torch.nn.Embedding(5, 2).to(dev)
    step = txc.compile(lambda e, i: e(i).sum(), wait=True)
    with torch.no_grad():
        for _ in range(2):
            step(emb, torch.tensor([0, 4]).to(dev))
        step(emb, torch.tensor([0, 9]).to(dev))  # replayed and waited for; its check is not read yet
        c = txc.metrics.counters()
        n_exec, n_replay = c["execute"], c["replay"]
        with pytest.raises(IndexError, match="index out of range"):
            step(emb, torch.tensor([0, 1]).to(dev))
    c = txc.metrics.counters()
    assert (c["execute"], c["replay"]) == (n_exec + 1, n_replay + 1)


def test_method_decorator(dev):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 2)

        @txc.compile
        def forward(self, x):
            return self.lin(x).relu()

    torch.manual_seed(0)
    m = M()
    ref_w, ref_b = m.lin.weight.detach().clone(), m.lin.bias.detach().clone()
    m = m.to(dev)
    x = torch.randn(4, 3)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(m(x.to(dev)).cpu(), (x @ ref_w.T + ref_b).relu())
    assert txc.metrics.counters()["replay"] == 2


def test_output_requiring_grad_is_traced_every_call(dev):
    lin = torch.nn.Linear(3, 2).to(dev)
    step = txc.compile(lambda m, x: m(x).sum())
    with pytest.warns(RuntimeWarning, match="requires grad"):
        for _ in range(3):
            loss = step(lin, torch.randn(4, 3).to(dev))
            loss.backward()   # works: the call was traced
    assert lin.weight.grad is not None
    assert txc.metrics.counters().get("replay", 0) == 0


def test_a_new_forward_hook_traces_again(dev):
    lin = torch.nn.Linear(3, 3).to(dev)
    step = txc.compile(lambda m, x: m(x))
    x = torch.randn(2, 3).to(dev)
    with torch.no_grad():
        a = [step(lin, x).cpu() for _ in range(2)]
        h = lin.register_forward_hook(lambda mod, inp, out: out * 10)
        b = step(lin, x).cpu()
        h.remove()
    torch.testing.assert_close(b, a[0] * 10)
    assert txc.metrics.counters()["replay"] == 1


_bag = []


def test_write_to_a_tensor_it_was_not_given_is_refused(dev):
    _bag[:] = [torch.zeros(2).to(dev)]

    def f(x):
        _bag[0].add_(x)          # a list is not walked: this tensor is not an input
        return x * 2

    step = txc.compile(f)
    with pytest.warns(RuntimeWarning, match="not among its inputs"):
        for _ in range(3):
            step(torch.ones(2).to(dev))
    assert _bag[0].cpu().tolist() == [3.0, 3.0]   # every call traced: no update lost
    assert txc.metrics.counters().get("replay", 0) == 0


def test_tensor_signature_tells_apart_what_changes_the_graph(dev):
    # the tensors' part of the guard (csrc/py/replay.cpp): dtype, shape,
    # requires_grad, aliasing among inputs, and a view's layout each make a
    # new signature; equal inputs replay
    calls = []

    def f(a, b):
        calls.append(1)
        return a * 2 + b

    step = txc.compile(f)
    base = torch.arange(12.0).reshape(3, 4)
    a, b = base.to(dev), (base + 1).to(dev)
    cases = [
        ((a, b), "first"),
        ((a, b), "replay"),
        (((base * 3).to(dev), (base - 1).to(dev)), "replay"),       # new buffers, same signature
        ((a, a), "trace"),                                            # the same buffer twice: aliasing
        ((a.double(), b.double()), "trace"),                          # dtype
        ((a[:2], b[:2]), "trace"),                                    # shape (a view of its own storage)
        ((a.t().contiguous(), b.t().contiguous()), "trace"),          # shape
        ((a.clone().requires_grad_(), b), "trace"),                   # requires_grad
    ]
    seen = 0
    for (x, y), want in cases:
        before = len(calls)
        out = step(x, y)
        torch.testing.assert_close(out.cpu(), x.detach().cpu() * 2 + y.cpu())
        traced = len(calls) > before
        assert traced == (want != "replay"), (want, x.shape, x.dtype)
        seen += 1
    assert txc.metrics.counters()["replay"] == 2


def test_cpu_tensor_input_is_refused_naming_it(dev):
    step = txc.compile(lambda x: x + 1)
    with pytest.warns(RuntimeWarning, match=r"a cpu tensor \[2\] is an input; move it to xla"):
        step(torch.ones(2))


class _Scaled(torch.nn.Module):
    """A module whose forward reads a number attribute, with a None child slot
    and a buffer, sharing a submodule with another argument."""

    def __init__(self, shared):
        super().__init__()
        self.shared = shared
        self.empty = None  # a None entry in _modules
        self.register_module("nothing", None)
        self.register_buffer("offset", torch.zeros(3))
        self.scale = 2.0

    def forward(self, x):
        return self.shared(x) * self.scale + self.offset


def test_walk_sees_attributes_buffers_and_shared_submodules(dev):
    """The module walk (csrc/py/replay.cpp) guards a number attribute the
    forward reads, a replaced buffer and a submodule shared by two arguments."""
    torch.manual_seed(0)
    shared = torch.nn.Linear(3, 3).to(dev)
    m = _Scaled(shared).to(dev)
    calls = {"n": 0}

    def f(a, b, x):
        calls["n"] += 1
        return a(x) + b(x)

    step = txc.compile(f)
    x = torch.randn(2, 3).to(dev)
    ref = lambda: (m(x) + shared(x)).cpu()
    with torch.no_grad():
        out = [step(m, shared, x).cpu() for _ in range(3)]
        assert calls["n"] == 1 and txc.metrics.counters()["replay"] == 2
        torch.testing.assert_close(out[2], ref())
        m.scale = 3.0  # a number the forward reads: a new signature
        torch.testing.assert_close(step(m, shared, x).cpu(), ref())
        assert calls["n"] == 2
        m.offset = torch.ones(3).to(dev)  # a new buffer tensor of the same shape: replayed, reading it
        torch.testing.assert_close(step(m, shared, x).cpu(), ref())
        assert calls["n"] == 2
        shared.weight.data.mul_(2)  # the shared weight, written between calls
        torch.testing.assert_close(step(m, shared, x).cpu(), ref())
        assert calls["n"] == 2


def test_a_grad_nobody_holds_takes_the_new_value_a_held_one_keeps_its_own(dev):
    """A replayed step's new grads (zero_grad set them to None): the last
    step's grads go to the launch donated and the step writes the new grads
    into their buffers (one set of grads at the peak, no buffer freed or
    made for them); the grad tensor takes the new value when nothing could
    tell it from a new tensor (the same object: no tensor made and freed);
    one that is held (a variable, a weak reference) or carries an attribute
    keeps its values, and the parameter gets a new tensor, as in a traced
    step."""
    import weakref
    m = torch.nn.Linear(4, 3).to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    step = txc.compile(_train_step)
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    for _ in range(3):
        step(m, opt, x.to(dev), y.to(dev))
    executor.wait_compiles()  # (the executable that takes the old grads donated compiles in the background)

    def replay_and_check():
        w0, b0 = (p.detach().cpu().clone().requires_grad_() for p in (m.weight, m.bias))
        F.mse_loss(x @ w0.T + b0, y).backward()
        n = txc.metrics.counters().get("replay", 0)
        step(m, opt, x.to(dev), y.to(dev))
        assert txc.metrics.counters()["replay"] == n + 1
        torch.testing.assert_close(m.weight.grad.cpu(), w0.grad)
        torch.testing.assert_close(m.bias.grad.cpu(), b0.grad)

    gid = id(m.weight.grad)
    old_buffers = [weakref.ref(p.grad._lt.data) for p in m.parameters()]
    old_memory = [p.grad._lt.data.unsafe_buffer_pointer() for p in m.parameters()]
    alive_at_launch = []
    real_run = executor.run_recorded

    def run_recorded(*a, **k):  # (what a replay launches through)
        alive_at_launch.extend(r() is not None for r in old_buffers)
        return real_run(*a, **k)
    executor.run_recorded = run_recorded
    try:
        replay_and_check()
    finally:
        executor.run_recorded = real_run
    assert id(m.weight.grad) == gid  # nobody held it: it took the new value
    assert alive_at_launch == [True, True]  # the last step's grads went to the launch (donated) ...
    assert [r() for r in old_buffers] == [None, None]  # ... and were let go of once it started
    assert [p.grad._lt.data.unsafe_buffer_pointer() for p in m.parameters()] == old_memory  # written in place

    held = m.weight.grad
    before = held.cpu().clone()
    replay_and_check()
    assert m.weight.grad is not held and torch.equal(held.cpu(), before)
    del held

    ref = weakref.ref(m.weight.grad)
    before = m.weight.grad.cpu().clone()
    replay_and_check()
    assert ref() is not m.weight.grad and (ref() is None or torch.equal(ref().cpu(), before))

    m.weight.grad.tag = "mine"
    replay_and_check()
    assert not hasattr(m.weight.grad, "tag")


def test_a_grad_buffer_another_tensor_shares_is_not_donated(dev):
    """A step that returns a grad: the tensor it returned shares that grad's
    buffer, so the next replay does not donate the old grads (their buffers
    would be overwritten): it frees and makes them, and the returned tensor
    keeps its value. Grads equal a traced step's."""
    def f(model, opt, x, y):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach(), model.weight.grad

    m = torch.nn.Linear(4, 3)
    ref = copy.deepcopy(m).to(dev)
    m = m.to(dev)
    opt, ref_opt = (torch.optim.SGD(p.parameters(), lr=0.5) for p in (m, ref))
    step = txc.compile(f)
    x, y = torch.randn(2, 4).to(dev), torch.randn(2, 3).to(dev)
    for i in range(5):
        n = txc.metrics.counters().get("replay", 0)
        _, g = step(m, opt, x, y)
        _, g_ref = f(ref, ref_opt, x, y)
        assert txc.metrics.counters().get("replay", 0) == n + (i >= 2)
        if i >= 1:  # the grad the last call returned (the grad tensor itself when it was recorded): its value kept
            torch.testing.assert_close(last.cpu(), last_value)
        torch.testing.assert_close(g.cpu(), g_ref.cpu())
        torch.testing.assert_close(m.weight.detach().cpu(), ref.weight.detach().cpu())
        last, last_value = g, g.cpu().clone()


def test_a_failed_launch_leaves_the_replaced_grads_none(dev):
    """If the replayed step fails at its launch, the grads it was to replace
    are None (as after the zero_grad the step began with), none holds a
    released buffer; the next call replays again."""
    m, opt, step, x, y = _sgd_linear_after_3_steps(dev, 3)
    real_run = executor.run_recorded

    def failing(*a, **k):
        raise RuntimeError("injected launch failure")
    executor.run_recorded = failing
    try:
        with pytest.raises(RuntimeError, match="injected"):
            step(m, opt, x, y)
    finally:
        executor.run_recorded = real_run
    assert m.weight.grad is None and m.bias.grad is None
    n = txc.metrics.counters().get("replay", 0)
    step(m, opt, x, y)
    step(m, opt, x, y)
    assert m.weight.grad is not None and txc.metrics.counters()["replay"] >= n + 1


def test_views_held_across_a_replay_see_what_a_traced_step_gives(dev):
    """A replay writes most outputs into the existing data node (its buffer
    swapped, no node made: replay.cpp swap_buffer), which is only right where
    nothing else refers to that storage. A view of the last step's grad held
    across a replayed step keeps the old grad (the step made a new one); a
    view or a detached alias of a parameter (whose buffer the step donates)
    makes that call trace, and they see the parameter's new value. Parameters
    and grads equal a traced step's throughout."""
    m, opt, step, x, y = _sgd_linear_after_3_steps(dev)
    ref = torch.nn.Linear(4, 4)  # the same values, in buffers of its own (a deepcopy would share them)
    ref.load_state_dict({k: v.cpu() for k, v in m.state_dict().items()})
    ref = ref.to(dev)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)

    def both_steps(replayed):
        n = txc.metrics.counters().get("replay", 0)
        step(m, opt, x, y)
        assert txc.metrics.counters().get("replay", 0) == n + replayed
        _train_step(ref, ref_opt, x, y)  # the same step, traced
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach().cpu())
            torch.testing.assert_close(p.grad.cpu(), q.grad.cpu())

    grad_row = m.weight.grad[1:3]
    old_grad = m.weight.grad.cpu().clone()
    both_steps(replayed=1)
    torch.testing.assert_close(grad_row.cpu(), old_grad[1:3])
    assert not torch.equal(old_grad, m.weight.grad.cpu())
    both_steps(replayed=1)  # (the view still held)
    del grad_row

    row, alias = m.weight[0], m.weight.detach()
    with pytest.warns(RuntimeWarning, match="donated buffer is held"):
        both_steps(replayed=0)
    torch.testing.assert_close(row.detach().cpu(), m.weight.detach().cpu()[0])
    torch.testing.assert_close(alias.cpu(), m.weight.detach().cpu())
    del row, alias
    both_steps(replayed=1)



def test_a_step_that_raises_while_recorded_leaves_no_recording_under_way(dev):
    """The one recording hook (executor.recording) is a context: a step that
    raises while it is recorded leaves no recording under way, so the host
    reads, uploads and backward passes after it are nobody's, and later calls
    record afresh and replay, training as the plain step does."""
    fail = {"n": 1}

    def f(m, opt, x, y):
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        if fail["n"]:
            fail["n"] -= 1
            raise ValueError("the step failed")
        loss.backward()
        opt.step()
        return loss.detach()

    m, ref = _model().to(dev).eval(), _model().to(dev).eval()
    opt, ref_opt = (torch.optim.SGD(p.parameters(), lr=0.1) for p in (m, ref))
    x, y = torch.randn(4, 8).to(dev), torch.randn(4, 4).to(dev)
    step = txc.compile(f)
    with pytest.raises(ValueError, match="the step failed"):
        step(m, opt, x, y)
    assert executor.recording_session() is None
    out = F.mse_loss(ref(x), y)  # a backward pass, a host read and an upload outside any recording
    out.backward()
    ref_opt.zero_grad()
    assert out.item() > 0 and torch.tensor([1.0, 2.0]).to(dev).cpu().tolist() == [1.0, 2.0]
    for _ in range(4):
        torch.testing.assert_close(step(m, opt, x, y).cpu(), f(ref, ref_opt, x, y).cpu())
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.cpu())
    c = txc.metrics.counters()
    # the first whole step is transitional (grads appear), the second records, the last two replay
    assert c["replay_record"] == 1 and c["replay"] == 2 and c.get("replay_refused", 0) == 0, c
