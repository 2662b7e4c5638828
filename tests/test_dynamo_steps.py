"""Training steps on the torch.compile route (torch_xla_core/_features/dynamo.py, issue
43): the replay counters of the zoo's Llama per step (launches, device->host
transfers before the user's sync), torch.compile(opt.step) with an LR
scheduler stepping between calls, zero_grad(set_to_none=True) and
clip_grad_norm_, and a whole step compiled with compiled autograd: each
replays, with parameters equal to CPU eager's."""
import copy

import pytest
import torch

import torch_xla_core as txc

from models import MLP
from test_hf_models import _deterministic, _inputs, _model, _to


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


_NAMES = ("execute", "transfer_to_host", "replay", "replay_trace", "replay_refused", "compile")


def _counts():
    c = txc.metrics.counters()
    return {n: c.get(n, 0) for n in _NAMES}


def _minus(a, b):
    return {n: a[n] - b[n] for n in _NAMES}


def _assert_params_close(cpu, xla):
    for (name, p_c), p_x in zip(cpu.named_parameters(), xla.parameters()):
        torch.testing.assert_close(p_x.detach().cpu(), p_c.detach(), atol=2e-5, rtol=2e-5, msg=lambda m: f"{name}: {m}")


def _zoo_llama_steps(dev, compile_opt, between=None, steps=5):
    """Five steps of the zoo's Llama, model torch.compile'd (and opt.step with
    compile_opt), beside CPU eager: per step the counters from the forward's
    call to before the user's sync and to after it, the losses (XLA's, CPU's)
    and between(out)'s value, called on the forward's output before its
    backward; then the parameters, both sides."""
    torch.manual_seed(0)
    model, kind = _model("llama")
    cpu = _deterministic(model)
    xla = copy.deepcopy(cpu).to(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, xla)]
    compiled = torch.compile(xla, backend="torch_xla_core")
    opt_step = torch.compile(opts[1].step, backend="torch_xla_core") if compile_opt else opts[1].step
    g = torch.Generator().manual_seed(1)
    counts, losses, seen = [], [], []
    for _ in range(steps):
        x = _inputs(kind, g)
        ref = cpu(**x)
        ref.loss.backward()
        opts[0].step()
        opts[0].zero_grad(set_to_none=True)
        c0 = _counts()
        out = compiled(**_to(dev, x))
        if between is not None:
            seen.append((between(out), between(ref)))
        out.loss.backward()
        opt_step()
        opts[1].zero_grad(set_to_none=True)
        c1 = _counts()
        txc.sync()
        counts.append((_minus(c1, c0), _minus(_counts(), c0)))
        losses.append((out.loss.detach().cpu(), ref.loss.detach()))
    return counts, losses, seen, cpu, xla


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_zoo_llama_model_compiled_launches_once_per_step_and_reads_nothing_before_the_sync(fuse, dev, monkeypatch):
    """Model compiled, AdamW traced per op: from the third step on, nothing is
    launched inside the step (the forward's and the backward's replays are
    left pending, TXC_FUSE_GRAPHS=0: launched one each), and the user's sync
    launches them as one fused executable, then the per-op AdamW's graph;
    nothing is transferred to the host before that sync (no sync inside the
    step, no deferred check read there); losses and parameters equal CPU
    eager's."""
    monkeypatch.setenv("TXC_FUSE_GRAPHS", fuse)
    counts, losses, _, cpu, xla = _zoo_llama_steps(dev, compile_opt=False)
    for loss, ref in losses:
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for in_step, with_sync in counts[2:]:
        assert in_step["transfer_to_host"] == 0, counts
        if fuse == "1":  # nothing in the step; at the sync the forward and backward fused, AdamW's graph
            assert in_step["execute"] == 0 and with_sync["execute"] == 2, counts
        else:  # the forward, the backward; AdamW's graph at the sync
            assert in_step["execute"] == 2 and with_sync["execute"] == 3, counts
        assert with_sync["replay"] == 2 and with_sync["replay_trace"] == 0 and with_sync["compile"] == 0, counts
    # Module.to left each parameter a view of its storage; the forward graph's first call gave each one of its
    # own (dynamo._own_parameters), so no step reads or writes them through view chains
    assert not [n for n, p in xla.named_parameters() if p._lt.is_view]
    _assert_params_close(cpu, xla)


def test_zoo_llama_compiled_opt_step_launches_once_per_step_bit_equal_to_unfused(dev, monkeypatch):
    """Model and opt.step compiled: from the third step on, a step launches
    once, the optimizer's replay with the forward's and the backward's that
    were left pending (one fused executable), nothing at the user's sync,
    and transfers nothing before it; losses and parameters are bit-equal to those of the same steps
    launched one graph at a time (TXC_FUSE_GRAPHS=0: 3 launches), and equal
    CPU eager's."""
    runs = {}
    for fuse in ("1", "0"):
        monkeypatch.setenv("TXC_FUSE_GRAPHS", fuse)
        torch._dynamo.reset()
        runs[fuse] = _zoo_llama_steps(dev, compile_opt=True)
    counts, losses, _, cpu, xla = runs["1"]
    for in_step, with_sync in counts[2:]:
        assert in_step["execute"] == 1 and with_sync["execute"] == 1, counts  # forward + backward + optimizer
        assert in_step["transfer_to_host"] == 0 and with_sync["replay"] == 3, counts  # (checks: read at the sync)
        assert with_sync["replay_trace"] == 0 and with_sync["compile"] == 0, counts
    for in_step, with_sync in runs["0"][0][2:]:
        assert in_step["execute"] == 3, runs["0"][0]
    for (loss, ref), (loss0, _) in zip(losses, runs["0"][1]):
        assert torch.equal(loss, loss0)
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for p, p0 in zip(xla.parameters(), runs["0"][4].parameters()):
        assert torch.equal(p.detach().cpu(), p0.detach().cpu())
    _assert_params_close(cpu, xla)


@pytest.mark.parametrize("read", ["item", "traced"])
def test_zoo_llama_forward_output_read_between_the_graphs(read, dev):
    """A forward's output read before the backward ("item": loss.item(), the
    forward's pending launch runs alone first, then the backward's and the
    optimizer's fused; "traced": an op on the logits, pending until the
    user's sync, after the step's one fused launch): the values equal CPU
    eager's, as do the losses and parameters."""
    if read == "item":
        between = lambda out: out.loss.item()  # noqa: E731
    else:
        between = lambda out: (out.logits * 2).sum()  # noqa: E731
    counts, losses, seen, cpu, xla = _zoo_llama_steps(dev, compile_opt=True, between=between)
    for got, ref in seen:
        torch.testing.assert_close(torch.as_tensor(got).cpu(), torch.as_tensor(ref).detach(), rtol=1e-4, atol=1e-4)
    for loss, ref in losses:
        torch.testing.assert_close(loss, ref, rtol=1e-4, atol=1e-4)
    for in_step, _ in counts[2:]:
        # item: the forward alone (at the read), then the backward and the optimizer fused; traced: all fused
        assert in_step["execute"] == (2 if read == "item" else 1), counts
        assert in_step["replay_trace"] == 0 and in_step["compile"] == 0, counts
    _assert_params_close(cpu, xla)


@pytest.mark.parametrize("clip", ["eager", "compiled"])
def test_compiled_opt_step_with_scheduler_set_to_none_and_clipping_replays_like_cpu(clip, dev):
    """torch.compile(opt.step) (clip_grad_norm_ before it, traced per op or
    inside the compiled function), LambdaLR stepping between calls,
    zero_grad(set_to_none=True): from the third step on the optimizer's graph
    replays, a new lr compiles nothing (no graph with the number in it), and
    the parameters equal CPU eager's after every step."""
    m = MLP()
    mx = copy.deepcopy(m).to(dev)
    opt_c = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(mx.parameters(), lr=1e-2)
    sched_c, sched_x = (torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)) for o in (opt_c, opt_x))

    def clip_and_step():
        torch.nn.utils.clip_grad_norm_(mx.parameters(), 0.05)
        opt_x.step()

    if clip == "compiled":
        step = torch.compile(clip_and_step, backend="torch_xla_core")
    else:
        compiled_step = torch.compile(opt_x.step, backend="torch_xla_core")

        def step():
            torch.nn.utils.clip_grad_norm_(mx.parameters(), 0.05)
            compiled_step()
    g = torch.Generator().manual_seed(2)
    deltas = []
    for _ in range(5):
        x = torch.randn(6, 16, generator=g)
        m(x).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
        opt_c.step()
        opt_c.zero_grad(set_to_none=True)
        sched_c.step()
        mx(x.to(dev)).square().mean().backward()
        c0 = _counts()
        step()
        opt_x.zero_grad(set_to_none=True)
        sched_x.step()
        txc.sync()
        deltas.append(_minus(_counts(), c0))
        assert all(p.grad is None for p in mx.parameters())
        _assert_params_close(m, mx)
    assert opt_x.param_groups[0]["lr"].device.type == "xla"  # lifted: the lr is a graph input, not a constant
    torch.testing.assert_close(opt_x.param_groups[0]["lr"].cpu(), torch.tensor(opt_c.param_groups[0]["lr"]))
    for d in deltas[2:]:
        assert d["replay"] >= 1 and d["replay_trace"] == 0 and d["compile"] == 0, deltas
        assert d["transfer_to_host"] == 0, deltas


def test_whole_step_with_compiled_autograd_replays_like_cpu(dev):
    """torch.compile of forward, loss.backward() and opt.step() with
    torch._dynamo.config.compiled_autograd: dynamo breaks the frame at
    .backward(), so the forward, compiled autograd's backward and the
    optimizer come as graphs of their own; from the third step on each
    replays (no trace, no compile) and the parameters equal CPU eager's."""
    m = MLP()
    mx = copy.deepcopy(m).to(dev)
    opt_c = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(mx.parameters(), lr=1e-2)

    def train_step(model, opt, x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch._dynamo.config.compiled_autograd = True
    step = torch.compile(train_step, backend="torch_xla_core")
    g = torch.Generator().manual_seed(3)
    deltas = []
    for _ in range(5):
        x = torch.randn(6, 16, generator=g)
        ref = train_step(m, opt_c, x)
        c0 = _counts()
        loss = step(mx, opt_x, x.to(dev))
        txc.sync()
        deltas.append(_minus(_counts(), c0))
        torch.testing.assert_close(loss.cpu(), ref, atol=1e-5, rtol=1e-5)
    _assert_params_close(m, mx)
    for d in deltas[2:]:
        assert d["replay"] >= 3 and d["replay_trace"] == 0 and d["compile"] == 0, deltas
        assert d["transfer_to_host"] == 0, deltas


def test_graph_fed_its_own_output_fuses_two_calls_at_most(dev):
    """A compiled function fed its own output call after call with nothing
    read between (an RNN's state): a call's replay is left pending, the next
    one runs fused with it, the one after starts anew (a chain holds a graph
    once: _execution/pending.py may_join), so one compile of the pair and
    none after; the values equal CPU's."""
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(4)) * 0.3

    def f(h, w):
        return torch.tanh(h @ w)

    cf = torch.compile(f, backend="torch_xla_core")
    h_c = torch.randn(2, 8, generator=torch.Generator().manual_seed(5))
    h_x, w_x = h_c.to(dev), w.to(dev)
    deltas = []
    for _ in range(8):
        c0 = _counts()
        h_c, h_x = f(h_c, w), cf(h_x, w_x)
        deltas.append(_minus(_counts(), c0))
    torch.testing.assert_close(h_x.cpu(), h_c)
    assert all(d["replay"] == 1 for d in deltas[1:]), deltas
    assert [d["execute"] for d in deltas[2:6]] in ([1, 0, 1, 0], [0, 1, 0, 1]), deltas
    assert sum(d["compile"] for d in deltas[3:]) == 0, deltas


def test_a_fused_launch_compiles_through_the_executor_and_its_persistent_cache(dev, tmp_path, monkeypatch):
    """The executable of graphs fused into one launch takes the executor's
    compile path (_execution/fusion.py): TXC_DUMP_DIR holds its module (each
    graph a private function, a main calling them in turn) named -fused2,
    and the persistent compile cache keeps it, so after the in-memory caches
    and dynamo are reset the same calls compile nothing; the values equal
    CPU's both times."""
    from torch_xla_core._execution import executor

    monkeypatch.setenv("TXC_COMPILE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TXC_DUMP_DIR", str(tmp_path / "dump"))
    w = torch.randn(8, 8, generator=torch.Generator().manual_seed(4)) * 0.3

    def f(h, w):
        return torch.tanh(h @ w)

    compiles = []
    for _ in range(2):
        torch._dynamo.reset()
        executor.clear_cache()
        cf = torch.compile(f, backend="torch_xla_core")
        h_c = torch.randn(2, 8, generator=torch.Generator().manual_seed(5))
        h_x, w_x = h_c.to(dev), w.to(dev)
        c0 = _counts()
        for _ in range(6):
            h_c, h_x = f(h_c, w), cf(h_x, w_x)
        torch.testing.assert_close(h_x.cpu(), h_c)
        compiles.append(_minus(_counts(), c0)["compile"])
    fused = [p for p in (tmp_path / "dump").iterdir() if p.name.endswith("-fused2.mlir")]
    assert len(fused) == 1, sorted(p.name for p in (tmp_path / "dump").iterdir())
    text = fused[0].read_text()
    assert "func.func private @s0_main" in text and "func.func private @s1_main" in text and "call @s1_main" in text
    assert compiles[0] >= 2 and compiles[1] == 0, compiles  # the graph and the pair; then both from the cache


def _function_results(path) -> dict:
    """Each function of a dumped StableHLO module: name -> its result count."""
    from jax._src.interpreters import mlir as jmlir
    from jaxlib.mlir import ir

    with jmlir.make_ir_context():
        m = ir.Module.parse(path.read_text())
        return {ir.StringAttr(op.attributes["sym_name"]).value:
                len(ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value).results)
                for op in m.body.operations if "function_type" in op.attributes}


def _mlp_forward_backward_steps(dev, steps=5) -> list:
    """A small MLP's loss torch.compile'd, then loss.backward() and the
    user's sync, `steps` times beside CPU eager: losses and grads equal
    CPU's every step; the counters of each step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    net_x = copy.deepcopy(net).to(dev)

    def loss_of(m, x):
        return m(x).pow(2).mean()

    cf = torch.compile(loss_of, backend="torch_xla_core")
    g = torch.Generator().manual_seed(1)
    deltas = []
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        ref = loss_of(net, x)
        ref.backward()
        c0 = _counts()
        loss = cf(net_x, x.to(dev))
        loss.backward()
        txc.sync()
        deltas.append(_minus(_counts(), c0))
        torch.testing.assert_close(loss.cpu(), ref.detach())
        for p_c, p_x in zip(net.parameters(), net_x.parameters()):
            torch.testing.assert_close(p_x.grad.cpu(), p_c.grad)
            p_c.grad = p_x.grad = None
    return deltas


def test_a_fused_launch_returns_only_values_someone_holds(dev, tmp_path, monkeypatch):
    """A compiled forward and its backward run as one launch at the user's
    sync. By then autograd has freed the activations the forward saved for
    the backward, so the fused executable does not return them (their
    placeholders died before the launch: _execution/pending.py): its main
    returns the loss and the grads only, and XLA frees the rest inside the
    program. Losses and grads equal CPU's every step."""
    monkeypatch.setenv("TXC_DUMP_DIR", str(tmp_path))
    deltas = _mlp_forward_backward_steps(dev)
    assert all(d["replay"] == 2 and d["execute"] == 1 for d in deltas[2:]), deltas
    fused = [p for p in tmp_path.iterdir() if p.name.endswith("-fused2.mlir")]
    assert len(fused) == 1, sorted(p.name for p in tmp_path.iterdir())
    n = _function_results(fused[0])
    assert n["s1_main"] == 4 and n["s0_main"] > 1 + 1, n  # the grads; the loss and the saved activations
    assert n["main"] == 1 + n["s1_main"], n  # the loss and the grads: no activation


def test_a_fused_executable_that_fails_to_build_falls_back_to_one_launch_per_graph(dev, monkeypatch):
    """Where the fused module fails to build or compile (a jaxlib MLIR or XLA
    error), the step runs anyway: a RuntimeWarning says so once, the
    "fuse_failed" counter counts it, that chain's graphs launch one by one
    and no later replay defers (as TXC_FUSE_GRAPHS=0); losses and grads
    equal CPU's throughout."""
    from torch_xla_core._execution import fusion, pending

    monkeypatch.setattr(pending, "_failed", None)  # (restored after: other tests fuse again)

    def broken(*_):
        raise RuntimeError("no fused module today")
    monkeypatch.setattr(fusion, "module", broken)
    c_start = txc.metrics.counters().get("fuse_failed", 0)
    with pytest.warns(RuntimeWarning, match="as one launch failed .*no fused module today") as caught:
        deltas = _mlp_forward_backward_steps(dev)
    assert sum("as one launch failed" in str(w.message) for w in caught) == 1
    assert txc.metrics.counters().get("fuse_failed", 0) == c_start + 1
    assert all(d["replay"] == 2 and d["execute"] == 2 for d in deltas[2:]), deltas  # forward, backward: apart
