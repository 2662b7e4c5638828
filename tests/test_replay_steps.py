"""txc.compile on training steps as people write them (torch_xla_core/replay/:
_session.py watches the recording call): returning the loss after backward, returning
loss.item(), an LR scheduler stepped inside the step or passed in, a host
read in the middle of the forward (transformers' mask checks): each replays,
and the replayed run equals the same steps traced every call (TXC_REPLAY=0)
bit for bit. Hugging Face models built small from their configs replay
their whole training step. A read the replay could not redo soundly is
refused, naming why."""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core._tracing import random as _random

from test_hf_models import ZOO, _deterministic, _inputs, _model, _to


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))


def _run(dev, monkeypatch, shape, replay, n=6):
    """n steps of the MLP with AdamW, written as `shape` says; (losses, params, calls of the Python step)."""
    monkeypatch.setenv("TXC_REPLAY", "1" if replay else "0")
    m = _mlp().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    calls = [0]

    if shape == "return_loss":
        def step(x, y):
            calls[0] += 1
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
    elif shape == "return_item":
        def step(x, y):
            calls[0] += 1
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()
    elif shape == "scheduler_inside":
        def step(x, y):
            calls[0] += 1
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            return loss
    elif shape == "scheduler_argument":
        def step(x, y, sched):
            calls[0] += 1
            opt.zero_grad()
            loss = F.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            sched.step()
            return loss.detach()
    step = txc.compile(step)
    _random.manual_seed(7)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(n):
        x, y = torch.randn(5, 8, generator=g).to(dev), torch.randn(5, 4, generator=g).to(dev)
        out = step(x, y, sched) if shape == "scheduler_argument" else step(x, y)
        losses.append(out if isinstance(out, float) else out.cpu())
        txc.sync()
    return losses, [p.detach().cpu() for p in m.parameters()], calls[0]


@pytest.mark.parametrize("shape", ["return_loss", "return_item", "scheduler_inside", "scheduler_argument"])
def test_step_as_users_write_it_replays_and_equals_traced(dev, monkeypatch, shape):
    l_tr, p_tr, n_tr = _run(dev, monkeypatch, shape, replay=False)
    txc.metrics.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "traced, not replayed" warning
        l_re, p_re, n_re = _run(dev, monkeypatch, shape, replay=True)
    c = txc.metrics.counters()
    # call 1 makes the optimizer state (transitional), call 2 records, 3..6 replay
    assert n_re == 2 and c["replay"] == 4 and c.get("replay_refused", 0) == 0, c
    if shape == "return_item":
        assert all(type(v) is float for v in l_re)
    else:
        assert all(not v.requires_grad for v in l_re[1:])  # (the first, transitional call is a traced one)
    for a, b in zip(l_re, l_tr):
        assert torch.equal(torch.as_tensor(a), torch.as_tensor(b)), (l_re, l_tr)
    for a, b in zip(p_re, p_tr):
        assert torch.equal(a, b)


def test_read_after_the_update_that_steers_more_work_is_refused(dev):
    m = _mlp().to(dev)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    @txc.compile
    def step(x):
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if loss.item() > 1e6:   # read after the update, then more device work depends on it
            m[0].weight.data.zero_()
        return (loss * 2).detach()

    with pytest.warns(RuntimeWarning, match="after a sync that updated its inputs"):
        for _ in range(3):
            step(torch.randn(4, 8).to(dev))
    assert txc.metrics.counters().get("replay", 0) == 0


def test_llama_default_config_without_attention_mask_replays(dev, monkeypatch):
    """The issue's call: model(input_ids=ids, labels=ids), use_cache at its
    default: transformers reads the packed-sequence mask on the host in every
    forward and makes empty cache tensors; the step replays, equal to traced."""
    T = pytest.importorskip("transformers")

    def run(replay):
        monkeypatch.setenv("TXC_REPLAY", "1" if replay else "0")
        torch.manual_seed(0)
        cfg = T.LlamaConfig(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, num_key_value_heads=2)
        model = T.LlamaForCausalLM(cfg).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        @txc.compile
        def step(ids):
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        g = torch.Generator().manual_seed(1)
        return [step(torch.randint(0, 96, (2, 16), generator=g).to(dev)).cpu() for _ in range(5)]

    ref = run(False)
    txc.metrics.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = run(True)
    c = txc.metrics.counters()
    assert c["replay"] == 3 and c.get("replay_refused", 0) == 0, c
    assert [v.item() for v in got] == [v.item() for v in ref]


def _step(m, opt, x):
    """A training step as users write it: the whole of it compiled, the loss returned."""
    loss = m(**x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _replays_like_cpu(cpu, dev, inputs, what, steps=4):
    """Trains a copy of `cpu` on xla with txc.compile(_step) beside CPU eager:
    losses within 1e-4 each step, the third call on replayed, nothing refused."""
    xla = copy.deepcopy(cpu).to(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, xla)]
    compiled = txc.compile(_step)
    txc.metrics.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "traced, not replayed" warning
        for _ in range(steps):
            x = inputs()
            ref = _step(cpu, opts[0], x).detach()
            got = compiled(xla, opts[1], _to(dev, x))
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{what}: {m}")
    c = txc.metrics.counters()
    assert c["replay"] == steps - 2 and c.get("replay_refused", 0) == 0, (what, c)


# The default run (CI's budget) takes a model per family through txc.compile and fewer through dynamo; the
# rest of the zoo is marked slow (`pytest -m slow tests/test_replay_steps.py`; test_hf_models.py trains every
# model of the zoo traced). wav2vec2: its CTC loss runs eagerly after a graph break (masked_select), and dynamo
# must leave our handlers and jax alone there (dynamo.install: trace_rules).
REPLAY_DEFAULT = {"llama", "qwen2_moe", "mamba", "bert", "t5", "vit", "whisper", "wav2vec2"}
DYNAMO_DEFAULT = {"llama", "qwen2_moe", "bert", "t5", "vit", "wav2vec2"}


def _zoo(default):
    return [n if n in default else pytest.param(n, marks=pytest.mark.slow) for n in ZOO]


@pytest.mark.parametrize("name", _zoo(REPLAY_DEFAULT))
def test_hf_training_step_replays(name, dev):
    """Every model of the zoo (test_hf_models.py): the whole step (forward,
    backward, AdamW) replays from the third call on, and its losses track
    CPU eager's."""
    torch.manual_seed(0)
    model, kind = _model(name)
    g = torch.Generator().manual_seed(1)
    _replays_like_cpu(_deterministic(model), dev, lambda: _inputs(kind, g), name)


def test_mixtral_step_without_attention_mask_replays(dev):
    """The MoE model of the kernels work (tests/models.py, experts through
    grouped_mm), called as the issue's workload is: input_ids and labels."""
    T = pytest.importorskip("transformers")
    from models import tiny_mixtral
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)

    def inputs():
        ids = torch.randint(0, 64, (2, 16), generator=g)
        return dict(input_ids=ids, labels=ids)
    _replays_like_cpu(tiny_mixtral(T), dev, inputs, "mixtral")


class _PackedCheck(torch.nn.Module):
    """The host read transformers 5.17's find_packed_sequence_indices makes in
    every forward: a check on positions made by arange (constants only)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device)[None]
        packed = (pos[:, 1:] - pos[:, :-1] != 1).cumsum(-1)
        if (packed[:, -1] == 0).all():   # read on the host
            return self.lin(x)
        return self.lin(x) * 0


def test_a_read_of_constants_is_no_guard_and_the_replay_never_waits(dev):
    m = _PackedCheck().to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    @txc.compile
    def step(x):
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(3):
        step(torch.randn(2, 5, 8).to(dev))
    (rec,) = [r for recs in step._recordings.values() for r in recs]
    assert rec.reads == []  # the value depends on no input: the same on every replay
    reads = txc.metrics.counters().get("transfer_to_host", 0)
    for _ in range(3):
        step(torch.randn(2, 5, 8).to(dev))
    c = txc.metrics.counters()
    assert c["replay"] == 4 and c.get("transfer_to_host", 0) == reads, c   # nothing read, nothing waited for


def test_a_read_of_inputs_is_a_guard_compared_on_every_replay(dev):
    lin = torch.nn.Linear(4, 4).to(dev)

    @txc.compile
    def f(x):
        with torch.no_grad():
            y = lin(x)
            return y if bool((x > 0).all()) else -y

    xs = [torch.rand(2, 4) + 0.1 for _ in range(3)] + [torch.rand(2, 4) - 2]
    for x in xs:
        y = lin(x.to(dev)).detach().cpu()
        torch.testing.assert_close(f(x.to(dev)).cpu(), y if (x > 0).all() else -y)
    c = txc.metrics.counters()
    assert c["replay"] == 2 and c["replay_guard_miss"] == 1, c


@pytest.mark.parametrize("name", _zoo(DYNAMO_DEFAULT))
def test_hf_training_step_replays_through_dynamo(name, dev):
    """torch.compile(model, backend="torch_xla_core") on every model of the
    zoo: dynamo's forward and backward graphs replay from their second call on
    (a graph each; some models make more), no refusal, losses tracking CPU."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, kind = _model(name)
    cpu = _deterministic(model)
    xla = copy.deepcopy(cpu).to(dev)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (cpu, xla)]
    compiled = torch.compile(xla, backend="torch_xla_core")
    g = torch.Generator().manual_seed(1)
    txc.metrics.clear()
    for _ in range(4):
        x = _inputs(kind, g)
        for m, opt in ((cpu, opts[0]), (compiled, opts[1])):
            loss = m(**(x if m is cpu else _to(dev, x))).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            if m is cpu:
                ref = loss.detach()
        txc.sync()
        torch.testing.assert_close(loss.detach().cpu(), ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    c = txc.metrics.counters()
    assert c["replay"] >= c["replay_record"] > 0 and c.get("replay_refused", 0) == 0, (name, c)
