"""scan / scan_layers: numerics and gradients vs the equivalent for loop (on
xla and on CPU eager), pytrees, reverse, closures, RNG, the errors raised
before compiling, trace reuse and compile counts."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core import _C
from torch_xla_core.scan import clear_cache, scan, scan_layers
from models import Block

ATOL = 2e-5


def loop(fn, init, xs, reverse=False):
    """The for loop scan replaces (works on any device)."""
    n = torch.utils._pytree.tree_leaves(xs)[0].shape[0]
    order = range(n - 1, -1, -1) if reverse else range(n)
    c, ys = init, [None] * n
    for i in order:
        c, ys[i] = fn(c, torch.utils._pytree.tree_map(lambda t: t[i], xs))
    if ys[0] is None:
        return c, None
    return c, torch.utils._pytree.tree_map(lambda *t: torch.stack(t), *ys)


def close(a, b, atol=ATOL):
    for x, y in zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)):
        torch.testing.assert_close(x.detach().cpu(), y.detach().cpu(), atol=atol, rtol=1e-4)


def counters():
    return dict(txc.metrics.counters())


def delta(before, name):
    return counters().get(name, 0) - before.get(name, 0)


def hlo_of(*ts):
    return txc.debug.stablehlo(ts)


def cell(W, b):
    """fn with a pytree carry ({'h', 'n'}) and pytree ys ((sum, h)), closing over W and b."""
    def fn(c, x):
        h = torch.tanh(c["h"] @ W + x["a"] * x["s"][:, None] + b)
        return {"h": h, "n": c["n"] + 1}, (h.sum(-1), h)
    return fn


def make_inputs(n=5, dev="cpu", grad=True):
    g = torch.Generator().manual_seed(1)
    W = torch.randn(4, 4, generator=g) * 0.5
    b = torch.randn(4, generator=g)
    init = {"h": torch.randn(2, 4, generator=g), "n": torch.zeros((), dtype=torch.int64)}
    xs = {"a": torch.randn(n, 2, 4, generator=g), "s": torch.randn(n, 2, generator=g)}
    out = [W, b, init, xs]
    out = torch.utils._pytree.tree_map(lambda t: t.to(dev), out)
    if grad:
        for t in (out[0], out[1], out[2]["h"], out[3]["a"], out[3]["s"]):
            t.requires_grad_()
    return out


def loss_of(c, ys):
    w = torch.arange(ys[0].shape[0], dtype=torch.float32, device=ys[0].device)
    return c["h"].pow(2).sum() + (ys[0] * w[:, None]).sum() + ys[1].sin().sum()


@pytest.mark.parametrize("reverse", [False, True])
def test_scan_matches_loop_and_cpu(dev, reverse):
    W, b, init, xs = make_inputs()
    c_ref, y_ref = loop(cell(W, b), init, xs, reverse)
    loss_of(c_ref, y_ref).backward()
    ref_grads = [t.grad for t in (W, b, init["h"], xs["a"], xs["s"])]

    Wx, bx, ix, xx = make_inputs(dev=dev)
    c, ys = scan(cell(Wx, bx), ix, xx, reverse=reverse)
    assert c["n"].dtype == torch.int64 and int(c["n"].cpu()) == 5
    close(c, c_ref)
    close(ys, y_ref)
    loss_of(c, ys).backward()
    txc.sync()
    for t, g in zip((Wx, bx, ix["h"], xx["a"], xx["s"]), ref_grads):
        close(t.grad, g)

    # the same for loop on xla agrees too
    Wl, bl, il, xl = make_inputs(dev=dev)
    c_l, y_l = loop(cell(Wl, bl), il, xl, reverse)
    loss_of(c_l, y_l).backward()
    txc.sync()
    close(c, c_l)
    for t, u in zip((Wx, bx, ix["h"], xx["a"], xx["s"]), (Wl, bl, il["h"], xl["a"], xl["s"])):
        close(t.grad, u.grad)


def test_reverse_order(dev):
    xs = torch.arange(6.).reshape(3, 2).to(dev)
    c, ys = scan(lambda c, x: (c * 10 + x, c), torch.zeros(2, device=dev), xs, reverse=True)
    c_ref, ys_ref = loop(lambda c, x: (c * 10 + x, c), torch.zeros(2), xs.cpu(), reverse=True)
    close(c, c_ref)
    close(ys, ys_ref)  # ys[i] belongs to xs[i]


def test_one_loop_compiled_once_flat_in_n(dev):
    W = (torch.randn(8, 8) * 0.3).to(dev)

    def fn(c, x):
        return torch.relu(c @ W + x), c.mean()

    def run(n):
        xs = torch.randn(n, 3, 8).to(dev)
        c, ys = scan(fn, torch.zeros(3, 8, device=dev), xs)
        return hlo_of(c, ys)

    t4, t32 = run(4), run(32)
    assert t4.count('"stablehlo.while"') == 1
    assert t4.count('"stablehlo.dot_general"') == 1
    assert abs(len(t32) - len(t4)) < 40  # only the numbers in the shapes differ
    xs = torch.randn(32, 3, 8).to(dev)
    loop_text = hlo_of(*loop(fn, torch.zeros(3, 8, device=dev), xs))
    assert len(loop_text) > 10 * len(t32)

    # a second call with the same shapes traces nothing and compiles nothing
    for _ in range(2):
        c, ys = scan(fn, torch.zeros(3, 8).to(dev), torch.randn(32, 3, 8).to(dev))
        txc.sync()
    before = counters()
    c, ys = scan(fn, torch.ones(3, 8).to(dev), torch.randn(32, 3, 8).to(dev))
    txc.sync()
    assert delta(before, "compile") == 0 and delta(before, "scan_trace") == 0
    assert delta(before, "scan_trace_hit") == 1


def test_closures_read_current_values_without_retrace(dev):
    W = torch.eye(3).to(dev)
    mask = torch.tensor([1., 0., 1.]).to(dev)

    def fn(c, x):
        return c @ W * mask + x, None

    xs = torch.ones(4, 3).to(dev)
    c, ys = scan(fn, torch.zeros(3, device=dev), xs)
    assert ys is None
    close(c, loop(lambda c, x: (c @ torch.eye(3) * mask.cpu() + x, None), torch.zeros(3), xs.cpu())[0])
    c, ys = scan(fn, torch.zeros(3, device=dev), xs)
    close(c, loop(lambda c, x: (c @ torch.eye(3) * mask.cpu() + x, None), torch.zeros(3), xs.cpu())[0])
    with torch.no_grad():
        W.mul_(2)  # an optimizer-style in-place update
    txc.sync()
    before = counters()
    c2, _ = scan(fn, torch.zeros(3, device=dev), xs)
    c_ref, _ = loop(lambda c, x: (c @ (2 * torch.eye(3)) * mask.cpu() + x, None), torch.zeros(3), xs.cpu())
    close(c2, c_ref)
    assert delta(before, "scan_trace") == 0 and delta(before, "compile") == 0
    # re-binding the closure cell to a new tensor re-traces (and stays correct)
    W = torch.eye(3).to(dev) * 3
    c3, _ = scan(fn, torch.zeros(3, device=dev), xs)
    close(c3, loop(lambda c, x: (c @ (3 * torch.eye(3)) * mask.cpu() + x, None), torch.zeros(3), xs.cpu())[0])
    assert delta(before, "scan_trace") == 1


def test_rng_differs_per_iteration_reproducible_and_matches_backward(dev):
    def fn(c, x):
        return c + 1, torch.rand(4, device=x.device) + 0 * x

    xs = torch.zeros(5, 4).to(dev)
    torch.manual_seed(3)
    _, a = scan(fn, torch.zeros((), device=dev), xs)
    _, b = scan(fn, torch.zeros((), device=dev), xs)
    torch.manual_seed(3)
    _, a2 = scan(fn, torch.zeros((), device=dev), xs)
    a, b, a2 = a.cpu(), b.cpu(), a2.cpu()
    assert len({tuple(r.tolist()) for r in a}) == 5  # each iteration draws anew
    assert not torch.equal(a, b)  # the device state moved on
    torch.testing.assert_close(a, a2)  # reproducible per seed

    # dropout: the backward replays each iteration's mask
    w = torch.tensor(1.5, device=dev, requires_grad=True)

    def drop(c, x):
        y = F.dropout(x * w, p=0.5, training=True)
        return c + y.sum(), y

    xs = torch.rand(6, 16).to(dev) + 0.5
    c, ys = scan(drop, torch.zeros((), device=dev), xs)
    (c + ys.sum()).backward()
    # d/dw of 2 * sum(mask * scale * x * w) = 2 * sum(ys) / w
    torch.testing.assert_close(w.grad.cpu(), (2 * ys.sum() / w).detach().cpu(), rtol=1e-5, atol=1e-5)
    assert (ys.cpu() == 0).any() and (ys.cpu() != 0).any()


def test_draws_around_and_inside_a_scan_lower_in_one_graph(dev):
    # The draws of a graph share their constants and element counters (random.cpp's
    # LowerCtx::memo); a scan body is a region of its own, where the outer values must
    # not be reused: one graph with draws of the same shape before, inside and after a
    # scan lowers (one iota outside the loop, one inside) and draws anew everywhere.

    def fn(c, x):
        return c + 1, torch.rand(4, device=x.device) + 0 * x

    def run():
        txc.sync()
        u = torch.rand(4, device=dev)
        _, ys = scan(fn, torch.zeros((), device=dev), torch.zeros(3, 4).to(dev))
        v = torch.rand(4, device=dev)
        text = _C.GraphCut([u._lt, ys._lt, v._lt]).lower()
        return torch.cat([u[None], ys, v[None]]).cpu(), text

    torch.manual_seed(5)
    a, text = run()
    body = text[text.index('"stablehlo.while"'):]
    assert text.count('"stablehlo.iota"') == 2 and body.count('"stablehlo.iota"') == 1
    assert len({tuple(r.tolist()) for r in a}) == 5  # five different draws
    assert ((a >= 0) & (a < 1)).all()
    torch.manual_seed(5)
    torch.testing.assert_close(run()[0], a)  # reproducible per seed


class MLPLayer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


def _layers_match(make, x_cpu, n, atol=ATOL, extra=()):
    torch.manual_seed(0)
    ref = nn.ModuleList([make() for _ in range(n)])
    xs = nn.ModuleList([make() for _ in range(n)]).to(txc.device())
    xs.load_state_dict(ref.state_dict())
    fl = nn.ModuleList([make() for _ in range(n)]).to(txc.device())
    fl.load_state_dict(ref.state_dict())
    x_ref = x_cpu.clone().requires_grad_()
    h = x_ref
    for layer in ref:
        h = layer(h, *extra)
    h.pow(2).mean().backward()
    dev = txc.device()
    x_x = x_cpu.to(dev).requires_grad_()
    out = scan_layers(xs, x_x, *[e.to(dev) for e in extra])
    out.pow(2).mean().backward()
    x_l = x_cpu.to(dev).requires_grad_()
    h = x_l
    for layer in fl:
        h = layer(h, *[e.to(dev) for e in extra])
    h.pow(2).mean().backward()
    txc.sync()  # one graph for everything compared below
    close(out, h)
    for (name, p), q, r in zip(xs.named_parameters(), fl.parameters(), ref.parameters()):
        close(p.grad, r.grad, atol)
        close(p.grad, q.grad, atol)
    close(x_x.grad, x_ref.grad, atol)
    close(x_x.grad, x_l.grad, atol)
    return out


def test_scan_layers_mlp(dev):
    _layers_match(MLPLayer, torch.randn(4, 16), 6)


def test_scan_layers_decoder_blocks(dev):
    _layers_match(lambda: Block(32, 4), torch.randn(2, 8, 32), 3, atol=1e-4)


class MaskedLayer(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x, mask, scale=1.0):
        return x + torch.tanh(self.lin(x)) * mask * scale


def test_scan_layers_extra_inputs_and_trace_reuse(dev):
    mask = (torch.arange(8) % 2).float()
    _layers_match(MaskedLayer, torch.randn(3, 8), 4, extra=(mask,))
    torch.manual_seed(0)
    layers = nn.ModuleList([MaskedLayer() for _ in range(4)]).to(dev)
    x = torch.randn(3, 8).to(dev)
    for _ in range(2):
        out = scan_layers(layers, x, mask.to(dev), scale=0.5)
        txc.sync()
    before = counters()
    out = scan_layers(layers, x, (1 - mask).to(dev), scale=0.5)  # a new mask tensor: no re-trace
    txc.sync()
    assert delta(before, "scan_trace") == 0 and delta(before, "compile") == 0
    h = x.cpu()
    for layer in layers:
        h = h + torch.tanh(F.linear(h, layer.lin.weight.cpu(), layer.lin.bias.cpu())) * (1 - mask) * 0.5
    close(out, h)
    scan_layers(layers, x, mask.to(dev), scale=2.0)  # a different static argument traces again
    assert delta(before, "scan_trace") == 1


def test_scan_layers_training_steps_match_loop(dev):
    torch.manual_seed(0)
    ref = nn.ModuleList([MLPLayer(8) for _ in range(3)])
    model = nn.ModuleList([MLPLayer(8) for _ in range(3)]).to(dev)
    model.load_state_dict(ref.state_dict())
    opt_r = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8)
    for step in range(3):
        h = x
        for layer in ref:
            h = layer(h)
        lr = h.pow(2).mean()
        lr.backward()
        opt_r.step()
        opt_r.zero_grad()
        lx = scan_layers(model, x.to(dev)).pow(2).mean()
        lx.backward()
        opt_x.step()
        opt_x.zero_grad()
        txc.sync()
        torch.testing.assert_close(lx.cpu(), lr.detach(), atol=1e-5, rtol=1e-5)
        if step == 1:
            before = counters()
    assert delta(before, "compile") == 0 and delta(before, "scan_trace") == 0


def test_nested_scan(dev):
    def inner(c, x):
        return c * 0.5 + x, None

    def outer(c, xs):
        c2, _ = scan(inner, c, xs)
        return c2, c2.sum()

    xs = torch.randn(3, 4, 2)
    c, ys = scan(outer, torch.zeros(2, device=dev), xs.to(dev))
    c_ref, ys_ref = loop(lambda c, x: (lambda r: (r, r.sum()))(loop(inner, c, x)[0]), torch.zeros(2), xs)
    close(c, c_ref)
    close(ys, ys_ref)


# --- errors, all raised before compiling ------------------------------------------

def _no_compile(f, exc, match):
    before = counters()
    with pytest.raises(exc, match=match):
        f()
    assert delta(before, "compile") == 0


def test_error_xs_lengths_and_empty(dev):
    z = torch.zeros(2, device=dev)
    fn = lambda c, x: (c, None)  # noqa: E731
    _no_compile(lambda: scan(fn, z, {"a": torch.zeros(3, 2, device=dev), "b": torch.zeros(4, device=dev)}),
                ValueError, r"different lengths.*\['a'\] has 3.*\['b'\] has 4")
    _no_compile(lambda: scan(fn, z, []), ValueError, "xs is empty")
    _no_compile(lambda: scan(fn, z, torch.zeros(0, 2, device=dev)), ValueError, "length 0")
    _no_compile(lambda: scan(fn, z, torch.zeros(3, 2)), TypeError, "xs is a tensor on cpu.*to\\('xla'\\)")


def test_error_carry_changes(dev):
    xs = torch.zeros(3, 2, device=dev)
    _no_compile(lambda: scan(lambda c, x: (torch.cat([c, x]), None), torch.zeros(2, device=dev), xs),
                TypeError, r"changed carry from float32\[2\] \(init\) to float32\[4\]")
    _no_compile(lambda: scan(lambda c, x: ({"h": c["h"].double()}, None), {"h": torch.zeros(2, device=dev)}, xs),
                TypeError, r"changed carry\['h'\] from float32\[2\] \(init\) to float64\[2\]")
    _no_compile(lambda: scan(lambda c, x: ((c, c), None), torch.zeros(2, device=dev), xs),
                TypeError, "changed the structure of the carry")


def test_error_mutating_outer_tensor(dev):
    W = torch.zeros(2, device=dev)
    xs = torch.ones(3, 2, device=dev)

    def fn(c, x):
        W.add_(x)
        return c + W, None

    _no_compile(lambda: scan(fn, torch.zeros(2, device=dev), xs), RuntimeError,
                r"writes in place \(aten::add_\) to a tensor from outside fn \(float32\[2\]\)")

    def fn_view(c, x):
        W[0] = 1.0
        return c, None

    _no_compile(lambda: scan(fn_view, torch.zeros(2, device=dev), xs), RuntimeError, "from outside fn")

    def fn_ok(c, x):  # writes to fn's own inputs and temporaries are fine
        c = c.clone()
        c.add_(x)
        x.mul_(2)
        return c + x, None

    c, _ = scan(fn_ok, torch.zeros(2, device=dev), xs)
    close(c, torch.full((2,), 9.0))
    assert W.cpu().eq(0).all()


def test_error_host_reads_inside_fn(dev):
    xs = torch.ones(3, 2, device=dev)
    z = torch.zeros(2, device=dev)
    _no_compile(lambda: scan(lambda c, x: (c + x.sum().item(), None), z, xs), RuntimeError, r"\.item\(\)")
    _no_compile(lambda: scan(lambda c, x: (c + x if x.sum() > 0 else c, None), z, xs), RuntimeError,
                "data-dependent Python control flow")
    _no_compile(lambda: scan(lambda c, x: (print(x) or c, None), z, xs), RuntimeError, "on the host")
    # the failed traces left the RNG and sync machinery intact
    assert float(torch.ones(1, device=dev).sum().cpu()) == 1.0


def test_error_scan_layers_structure(dev):
    layers = [nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 5)]
    with pytest.raises(TypeError, match=r"layer 2's parameter 'weight' is float32\[5, 4\].*layer 0's is "
                                        r"float32\[4, 4\]"):
        scan_layers(layers, torch.zeros(4, device=dev))
    with pytest.raises(TypeError, match="layer 1 is a ReLU, layer 0 is a Linear"):
        scan_layers([nn.Linear(4, 4), nn.ReLU()], torch.zeros(4, device=dev))
    with pytest.raises(TypeError, match="layer 1 has different parameters than layer 0"):
        scan_layers([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)], torch.zeros(4, device=dev))


def test_clear_cache_retraces(dev):
    fn = lambda c, x: (c + x, None)  # noqa: E731
    xs = torch.ones(2, 3, device=dev)
    scan(fn, torch.zeros(3, device=dev), xs)
    before = counters()
    scan(fn, torch.zeros(3, device=dev), xs)
    assert delta(before, "scan_trace") == 0
    clear_cache()
    scan(fn, torch.zeros(3, device=dev), xs)
    assert delta(before, "scan_trace") == 1
