"""Whole training loops on xla match the same loops on CPU; steady-state
steps hit the compile cache."""
import copy

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from models import GPT, MLP


def _train(model, opt_cls, batches, loss_fn, device, steps=5, sync=None, **opt_kw):
    model = model.to(device)
    opt = opt_cls(model.parameters(), **opt_kw)
    losses = []
    for x, y in batches[:steps]:
        loss = loss_fn(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync:
            sync()
        losses.append(loss.item())
    return losses, model


def _mlp_data(n=5):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def _gpt_data(n=5, vocab=97):
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(n):
        seq = torch.randint(0, vocab, (2, 17), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def _lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@pytest.mark.parametrize("opt_cls,kw", [
    (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
    (torch.optim.Adam, dict(lr=1e-2, foreach=False)),
    (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
])
def test_mlp_training_matches_cpu(opt_cls, kw):
    torch.manual_seed(0)
    model = MLP()
    data = _mlp_data()
    cpu_losses, cpu_model = _train(copy.deepcopy(model), opt_cls, data, F.cross_entropy, "cpu", **kw)
    xla_losses, xla_model = _train(copy.deepcopy(model), opt_cls, data, F.cross_entropy, txc.device(),
                                   sync=txc.sync, **kw)
    torch.testing.assert_close(torch.tensor(xla_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
    for (k, a), (_, b) in zip(cpu_model.state_dict().items(), xla_model.state_dict().items()):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-4, atol=1e-5, msg=k)


def test_gpt_training_matches_cpu():
    torch.manual_seed(0)
    model = GPT()
    data = _gpt_data(1) * 5  # one batch, five times: the loss must go down
    kw = dict(lr=3e-3)
    cpu_losses, _ = _train(copy.deepcopy(model), torch.optim.AdamW, data, _lm_loss, "cpu", **kw)
    xla_losses, _ = _train(copy.deepcopy(model), torch.optim.AdamW, data, _lm_loss, txc.device(), sync=txc.sync, **kw)
    torch.testing.assert_close(torch.tensor(xla_losses), torch.tensor(cpu_losses), rtol=1e-3, atol=1e-4)
    assert xla_losses[-1] < xla_losses[0]


def test_steady_state_steps_compile_nothing():
    torch.manual_seed(0)
    dev = txc.device()
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = _gpt_data(6)
    compiles = []
    for x, y in data:
        loss = _lm_loss(model(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        txc.sync()
        compiles.append(txc.metrics.counters().get("compile", 0))
    # Step 1 differs from step 2 (optimizer state is created); from step 3 on
    # every step is the same graph and hits the cache.
    assert compiles[2] == compiles[-1], compiles
    assert txc.metrics.fallbacks() == {}


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.mix = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 20, bias=False)
        self.out.weight = self.emb.weight  # tied input/output embeddings

    def forward(self, tokens):
        return self.out(torch.tanh(self.mix(self.emb(tokens))))


def test_tied_weights_stay_tied_after_to_xla_and_train_like_cpu(dev):
    torch.manual_seed(0)
    cpu = _TiedLM()
    xla = copy.deepcopy(cpu).to(dev)
    assert xla.out.weight is xla.emb.weight
    assert len(list(xla.parameters())) == len(list(cpu.parameters())) == 3
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randint(0, 20, (4, 6), generator=g), torch.randint(0, 20, (24,), generator=g))
               for _ in range(4)]
    loss_fn = lambda logits, y: F.cross_entropy(logits.reshape(-1, 20), y)  # noqa: E731
    lc, cpu = _train(cpu, torch.optim.AdamW, batches, loss_fn, "cpu", steps=4, lr=1e-2)
    lx, xla = _train(xla, torch.optim.AdamW, batches, loss_fn, dev, steps=4, sync=txc.sync, lr=1e-2)
    assert lx == pytest.approx(lc, rel=1e-4, abs=1e-5)
    torch.testing.assert_close(xla.emb.weight.cpu(), cpu.emb.weight, atol=1e-5, rtol=1e-4)
    assert xla.out.weight is xla.emb.weight


def test_to_xla_with_swap_module_params_on_conversion(dev):
    """torch.__future__.set_swap_module_params_on_conversion(True) (torch's
    swap_tensors path) still moves a model to xla: parameters (tied ones
    tied), buffers, numerics as CPU; the flag is left as the user set it, and
    a CPU -> CPU conversion still swaps."""
    torch.manual_seed(0)
    cpu = _TiedLM()
    was = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m = copy.deepcopy(cpu).to(dev)
        assert torch.__future__.get_swap_module_params_on_conversion()
        assert all(isinstance(p, torch.nn.Parameter) and p.device.type == "xla" for p in m.parameters())
        assert m.out.weight is m.emb.weight and len(list(m.parameters())) == 3
        tokens = torch.randint(0, 20, (4, 6))
        torch.testing.assert_close(m(tokens.to(dev)).cpu(), cpu(tokens), atol=1e-5, rtol=1e-5)
        half = copy.deepcopy(cpu)
        w = half.mix.weight
        half.half()
        assert w.dtype == torch.float16  # (swapped in place: the old object is the converted one)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(was)
