"""torch.compile(model, backend="torch_xla_core") (torch_xla_core/_features/dynamo.py):
numerics against CPU eager (an MLP, tiny `transformers` models forward and
training), each dynamo graph traced once and then replayed (no new trace, no
op dispatch, no compile), graph breaks, in-place input mutation, outputs
aliasing inputs, dropout drawing fresh numbers per call, a new shape
compiling once, the backend's registration and entry point."""
import copy
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core import _C
from torch_xla_core._tracing import random as _random

from models import MLP


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _counts(*names):
    c = txc.metrics.counters()
    return {n: c.get(n, 0) for n in names}


_WATCHED = ("replay", "replay_trace", "replay_record", "compile", "cache_hit", "cache_miss", "dynamo_graph")


def _delta(before):
    after = _counts(*_WATCHED)
    return {n: after[n] - before[n] for n in _WATCHED}


class _OpDispatch:
    """Counts aten ops reaching our dispatcher while active: direct recipes
    (C++; _C.dispatch_stats) and Python handlers (torch_xla_core/_ops and
    torch's decompositions, seen by a profile hook)."""

    def __enter__(self):
        self.handlers = 0
        self._recipes = sum(_C.dispatch_stats())

        def prof(frame, event, arg):
            if event == "call":
                f = frame.f_code.co_filename
                if "torch_xla_core/_ops/" in f or "torch/_decomp/" in f or "torch/_refs/" in f:
                    self.handlers += 1
        sys.setprofile(prof)
        return self

    def __exit__(self, *exc):
        sys.setprofile(None)
        self.recipes = sum(_C.dispatch_stats()) - self._recipes


def test_backend_registered_and_openxla_left_to_torch():
    import torch._dynamo
    from torch._dynamo.backends.registry import lookup_backend
    from torch_xla_core import dynamo
    assert "torch_xla_core" in torch._dynamo.list_backends()
    assert lookup_backend("torch_xla_core") is dynamo.backend
    # torch 2.13 registers its own "openxla" (it needs torch_xla): ours takes the name only where torch has none
    import importlib.util
    if importlib.util.find_spec("torch._dynamo.backends.torchxla") is not None:
        assert lookup_backend("openxla") is not dynamo.backend
    else:
        assert lookup_backend("openxla") is dynamo.backend


def test_entry_point_finds_the_backend_without_importing_torch_xla_core():
    from importlib.metadata import entry_points
    eps = entry_points(group="torch_dynamo_backends")
    if "torch_xla_core" not in eps.names:
        pytest.skip("not installed with its entry points (pip install -e . adds them)")
    code = ("import sys, torch\n"
            "from torch._dynamo.backends.registry import lookup_backend\n"
            "assert 'torch_xla_core' not in sys.modules\n"
            "fn = lookup_backend('torch_xla_core')\n"
            "import torch_xla_core._features.dynamo as d\n"
            "assert fn is d.backend\n"
            "x = torch.randn(3, device='xla')\n"
            "y = torch.compile(lambda t: (t * 2).sin(), backend='torch_xla_core')(x)\n"
            "assert torch.allclose(y.cpu(), (x.cpu() * 2).sin())\n"
            "print('ok')\n")
    env = dict(os.environ, PJRT_DEVICE="CPU", TXC_COMPILE_CACHE="off")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_mlp_inference_matches_cpu_and_replays_without_tracing(dev):
    m = MLP().eval()
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core", dynamic=False)
    xs = [torch.randn(5, 16) for _ in range(3)]
    with torch.no_grad():
        first = _counts(*_WATCHED)
        y0 = cm(xs[0].to(dev))
        d0 = _delta(first)
        # (the first call also syncs what was pending: the parameters Module.to made)
        assert d0["dynamo_graph"] == 1 and d0["replay_trace"] == 1 and d0["replay_record"] == 1 and d0["compile"] >= 1
        torch.testing.assert_close(y0.cpu(), m(xs[0]), atol=1e-5, rtol=1e-5)
        for x in xs[1:]:
            xd = x.to(dev)
            before = _counts(*_WATCHED)
            with _OpDispatch() as ops:
                y = cm(xd)
            d = _delta(before)
            # replayed: no trace, no graph cut or cache lookup, no compile, no op dispatched
            assert d == dict(d, replay=1, replay_trace=0, compile=0, cache_hit=0, cache_miss=0, dynamo_graph=0), d
            assert ops.handlers == 0 and ops.recipes == 0, (ops.handlers, ops.recipes)
            torch.testing.assert_close(y.cpu(), m(x), atol=1e-5, rtol=1e-5)
    assert not txc.metrics.fallbacks()


def test_mlp_training_matches_cpu_forward_and_backward_replayed(dev):
    m = MLP()
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core", dynamic=False)
    opt_c = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(mx.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    deltas = []
    for _ in range(4):
        x, y = torch.randn(6, 16, generator=g), torch.randn(6, 4, generator=g)
        before = _counts(*_WATCHED)
        opt_x.zero_grad()
        loss_x = F.mse_loss(cm(x.to(dev)), y.to(dev))
        loss_x.backward()
        opt_x.step()
        txc.sync()
        deltas.append(_delta(before))
        opt_c.zero_grad()
        loss_c = F.mse_loss(m(x), y)
        loss_c.backward()
        opt_c.step()
        torch.testing.assert_close(loss_x.cpu(), loss_c.detach(), atol=1e-5, rtol=1e-5)
    for p_c, p_x in zip(m.parameters(), mx.parameters()):
        torch.testing.assert_close(p_x.detach().cpu(), p_c.detach(), atol=1e-5, rtol=1e-5)
    # a forward and a backward graph, each traced and compiled once; from the second step on both replay
    assert deltas[0]["dynamo_graph"] == 2 and deltas[0]["replay_record"] == 2, deltas[0]
    for d in deltas[1:]:
        assert d["replay"] == 2 and d["replay_trace"] == 0 and d["dynamo_graph"] == 0, deltas
    assert deltas[2]["compile"] == 0 and deltas[3]["compile"] == 0, deltas  # (step 2: AdamW's state appears)


def _llama(transformers):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(cfg)


def test_transformers_llama_forward_matches_cpu_and_replays(dev):
    transformers = pytest.importorskip("transformers")
    m = _llama(transformers).eval()
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core", dynamic=False)
    with torch.no_grad():
        for i in range(3):
            ids = torch.randint(0, 64, (2, 8))
            before = _counts(*_WATCHED)
            out = cm(ids.to(dev), use_cache=False).logits
            d = _delta(before)
            torch.testing.assert_close(out.cpu(), m(ids, use_cache=False).logits, atol=1e-5, rtol=1e-5)
            if i:
                assert d["replay"] >= 1 and d["replay_trace"] == 0 and d["compile"] == 0, d
    assert not txc.metrics.fallbacks()


def test_transformers_gpt2_training_steps_match_cpu_and_replay(dev):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 8))

    def train(m, d, compiled):
        m = copy.deepcopy(m).to(d)
        f = torch.compile(m, backend="torch_xla_core", dynamic=False) if compiled else m
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses, deltas = [], []
        for _ in range(3):
            before = _counts(*_WATCHED)
            opt.zero_grad()
            loss = f(input_ids=ids.to(d), labels=ids.to(d)).loss
            loss.backward()
            opt.step()
            if compiled:
                txc.sync()
            deltas.append(_delta(before))
            losses.append(loss.detach().cpu())
        return torch.stack(losses), [p.detach().cpu() for p in m.parameters()], deltas

    l_c, p_c, _ = train(model, "cpu", False)
    l_x, p_x, deltas = train(model, dev, True)
    torch.testing.assert_close(l_x, l_c, atol=1e-5, rtol=1e-5)
    for a, b in zip(p_x, p_c):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    graphs = deltas[0]["dynamo_graph"]
    assert graphs >= 2 and deltas[0]["replay_record"] == graphs, deltas[0]
    for d in deltas[1:]:  # every graph (forward and backward of each dynamo region) replays
        assert d["replay"] == graphs and d["replay_trace"] == 0, deltas
    # the second step compiles the graphs that run fused (_execution/pending.py) once, the third nothing
    assert deltas[1]["compile"] <= graphs // 2 and deltas[2]["compile"] == 0, deltas


def test_graph_break_compiles_each_graph_once(dev):
    def f(x):
        y = (x * 2).relu()
        torch._dynamo.graph_break()
        return (y + 1).exp()

    cf = torch.compile(f, backend="torch_xla_core", dynamic=False)
    for i in range(3):
        x = torch.randn(4, 5)
        before = _counts(*_WATCHED)
        out = cf(x.to(dev))
        d = _delta(before)
        torch.testing.assert_close(out.cpu(), f(x), atol=1e-6, rtol=1e-6)
        if i == 0:
            assert d["dynamo_graph"] == 2 and d["replay_record"] == 2, d
        else:
            assert d["replay"] == 2 and d["replay_trace"] == 0 and d["compile"] == 0, d


def test_in_place_input_mutation_is_written_back(dev):
    def f(x, acc):
        acc.add_(x * 2)
        return acc.sum()

    cf = torch.compile(f, backend="torch_xla_core", dynamic=False)
    acc_c = torch.zeros(3, 4)
    acc_x = acc_c.to(dev)
    for i in range(4):
        x = torch.randn(3, 4)
        before = _counts(*_WATCHED)
        with torch.no_grad():
            s_x = cf(x.to(dev), acc_x)
        d = _delta(before)
        s_c = f(x, acc_c)
        torch.testing.assert_close(acc_x.cpu(), acc_c, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(s_x.cpu(), s_c, atol=1e-5, rtol=1e-5)
        if i:
            assert d["replay"] == 1 and d["replay_trace"] == 0, d


def test_outputs_aliasing_inputs_and_non_tensor_outputs(dev):
    def f(x, w):
        return w.t(), x @ w, x.shape[0], None

    cf = torch.compile(f, backend="torch_xla_core", dynamic=False)
    w_c = torch.randn(4, 3)
    w_x = w_c.to(dev)
    for i in range(3):
        x = torch.randn(2, 4)
        before = _counts(*_WATCHED)
        with torch.no_grad():
            wt, y, n, none = cf(x.to(dev), w_x)
        d = _delta(before)
        torch.testing.assert_close(wt.cpu(), w_c.t())
        torch.testing.assert_close(y.cpu(), x @ w_c, atol=1e-5, rtol=1e-5)
        assert n == 2 and none is None
        assert wt.shape == (3, 4) and wt.stride() == (1, 3)  # a view of w, as in eager
        if i:
            assert d["replay"] == 1 and d["replay_trace"] == 0, d
    with torch.no_grad():
        wt, _, _, _ = cf(torch.randn(2, 4).to(dev), w_x)
        w_x.mul_(2)  # the returned alias sees writes to its input, as in eager
    torch.testing.assert_close(wt.cpu(), (w_c * 2).t())


def test_dropout_draws_fresh_numbers_each_replayed_call(dev):
    def f(x):
        return F.dropout(x, 0.5, training=True) * 3

    cf = torch.compile(f, backend="torch_xla_core", dynamic=False)
    x = torch.ones(64, 64).to(dev)
    _random.manual_seed(11)
    eager = [f(x).cpu() for _ in range(4)]
    _random.manual_seed(11)
    compiled = [cf(x).cpu() for _ in range(4)]
    assert _counts("replay")["replay"] >= 2  # calls 2.. replay the recorded graph
    for a, b in zip(compiled, eager):  # the same draws as tracing each call
        torch.testing.assert_close(a, b)
    assert not torch.equal(compiled[2], compiled[3])  # fresh numbers per replayed call


def test_cpu_graph_runs_untouched(dev):
    def f(x):
        return (x * 3).cos()

    cf = torch.compile(f, backend="torch_xla_core")
    x = torch.randn(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "traced, not replayed" warning
        for _ in range(2):
            torch.testing.assert_close(cf(x), f(x))
    c = _counts(*_WATCHED)
    assert c["dynamo_graph"] == 1 and c["replay"] == 0 and c["replay_trace"] == 0, c


def test_new_shape_recompiles_once(dev):
    m = MLP().eval()
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core", dynamic=False)
    seen = []
    with torch.no_grad():
        for batch in (4, 4, 7, 7, 4):
            x = torch.randn(batch, 16)
            before = _counts(*_WATCHED)
            torch.testing.assert_close(cm(x.to(dev)).cpu(), m(x), atol=1e-5, rtol=1e-5)
            seen.append(_delta(before))
    assert [d["dynamo_graph"] for d in seen] == [1, 0, 1, 0, 0], seen
    # one compile for the new shape (the first call also compiles the sync of what Module.to left pending)
    assert seen[0]["compile"] >= 1 and [d["compile"] for d in seen[1:]] == [0, 1, 0, 0], seen
    assert [d["replay"] for d in seen] == [0, 1, 0, 1, 1], seen


def test_batchnorm_training_updates_running_stats_like_cpu(dev):
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core", dynamic=False)
    for _ in range(3):
        x = torch.randn(10, 6)
        out_x = cm(x.to(dev))
        out_x.sum().backward()
        out_c = m(x)
        out_c.sum().backward()
        torch.testing.assert_close(out_x.detach().cpu(), out_c.detach(), atol=1e-5, rtol=1e-5)
    bn_c, bn_x = m[1], mx[1]
    torch.testing.assert_close(bn_x.running_mean.cpu(), bn_c.running_mean, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn_x.running_var.cpu(), bn_c.running_var, atol=1e-5, rtol=1e-5)
    assert int(bn_x.num_batches_tracked.cpu()) == 3
    torch.testing.assert_close(mx[0].weight.grad.cpu(), m[0].weight.grad, atol=1e-4, rtol=1e-4)


def test_automatic_dynamic_shapes_compile_once_per_concrete_shape(dev):
    m = MLP().eval()
    mx = copy.deepcopy(m).to(dev)
    cm = torch.compile(mx, backend="torch_xla_core")  # dynamic=None: dynamo goes symbolic after a change
    seen = []
    with torch.no_grad():
        for batch in (3, 5, 5, 7, 7, 5):
            x = torch.randn(batch, 16)
            before = _counts(*_WATCHED)
            torch.testing.assert_close(cm(x.to(dev)).cpu(), m(x), atol=1e-5, rtol=1e-5)
            seen.append(_delta(before))
    # our side specializes each concrete shape (the sizes are in the replay signature): traced once, then replayed
    assert [d["replay_trace"] for d in seen] == [1, 1, 0, 1, 0, 0], seen
    assert [d["replay"] for d in seen] == [0, 0, 1, 0, 1, 1], seen


def test_compiled_optimizer_step_updates_parameters_in_place_like_cpu(dev):
    m = MLP()
    mx = copy.deepcopy(m).to(dev)
    opt_c = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(mx.parameters(), lr=1e-2, capturable=True)  # step counts on the device
    step = torch.compile(opt_x.step, backend="torch_xla_core", dynamic=False)
    g = torch.Generator().manual_seed(2)
    deltas = []
    for _ in range(4):
        x = torch.randn(6, 16, generator=g)
        for model, opt, d in ((m, opt_c, "cpu"), (mx, opt_x, dev)):
            opt.zero_grad()
            model(x.to(d)).square().mean().backward()
        opt_c.step()
        before = _counts(*_WATCHED)
        step()
        txc.sync()
        deltas.append(_delta(before))
    for p_c, p_x in zip(m.parameters(), mx.parameters()):
        torch.testing.assert_close(p_x.detach().cpu(), p_c.detach(), atol=1e-5, rtol=1e-5)
    assert all(d["replay"] >= 1 and d["replay_trace"] == 0 for d in deltas[2:]), deltas


def test_graph_call_finds_pending_inputs_and_written_views_in_one_pass(dev):
    """The C++ passes a dynamo graph's call takes over its inputs (_constants,
    the written lone views): the positions of the pending xla tensors (views of
    device data count as ready), and of the views among the given slots; other
    objects are skipped."""
    from torch_xla_core._tracing.tensor import XlaTensor
    data = torch.ones(4, 3, device=dev)
    txc.sync()
    view = data.t()
    pending = data + 1
    items = [data, 3, view, pending, None, torch.ones(2), view[0]]
    assert _C.replay_unready(items, XlaTensor, True) == [3]
    assert _C.replay_unready(items, XlaTensor, False) == [2, 3, 6]  # views of a part: read through their chains
    assert _C.replay_views(items, XlaTensor, [0, 1, 2, 6]) == [2, 6]
    with pytest.raises(IndexError):
        _C.replay_views(items, XlaTensor, [7])
