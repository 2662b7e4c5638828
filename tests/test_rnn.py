"""LSTM and GRU (layers and cells) on xla: torch runs them through the fused
cell ops on accelerator devices (torch_xla_core/_ops/rnn.py); outputs, states
and every gradient match CPU eager, without fallbacks."""
import copy

import pytest
import torch
import torch.nn as nn

import torch_xla_core as txc


def _fwd_bwd(module, inputs, device):
    m = copy.deepcopy(module).to(device)
    xs = [x.detach().clone().to(device).requires_grad_(x.is_floating_point()) for x in inputs]
    out = m(*xs)
    flat = [t for t in torch.utils._pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    sum((t * (k + 1)).sum() for k, t in enumerate(flat)).backward()   # every output feeds the loss
    grads = [p.grad for p in m.parameters()] + [x.grad for x in xs if x.is_floating_point()]
    return flat, grads


class _HC(nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.cell = cell

    def forward(self, x, h, c):
        return self.cell(x, (h, c))


@pytest.mark.parametrize("module,inputs", [
    (lambda: nn.LSTM(6, 8, num_layers=2, batch_first=True), lambda: [torch.randn(3, 5, 6)]),
    (lambda: nn.LSTM(6, 8, bidirectional=True, bias=False), lambda: [torch.randn(5, 3, 6)]),
    (lambda: nn.GRU(6, 8, num_layers=2), lambda: [torch.randn(5, 3, 6), torch.randn(2, 3, 8)]),
    (lambda: nn.LSTMCell(6, 8), lambda: [torch.randn(4, 6), (torch.randn(4, 8), torch.randn(4, 8))]),
    (lambda: nn.GRUCell(6, 8, bias=False), lambda: [torch.randn(4, 6), torch.randn(4, 8)]),
], ids=["lstm2", "lstm_bidir_nobias", "gru2_h0", "lstm_cell", "gru_cell_nobias"])
def test_rnn_matches_cpu(module, inputs):
    torch.manual_seed(0)
    m, xs = module(), inputs()
    if isinstance(xs[-1], tuple):   # LSTMCell takes (h, c) as one argument
        m, xs = _HC(m), [xs[0], *xs[1]]
    before = dict(txc.metrics.fallbacks())
    out_c, g_c = _fwd_bwd(m, xs, "cpu")
    out_x, g_x = _fwd_bwd(m, xs, txc.device())
    txc.sync()  # outputs and grads in one graph (each .cpu() alone would compile its own)
    for c, x in zip(out_c, out_x):
        torch.testing.assert_close(x.cpu(), c.detach(), atol=1e-5, rtol=1e-5)
    for c, x in zip(g_c, g_x):
        torch.testing.assert_close(x.cpu(), c, atol=1e-4, rtol=1e-4)
    assert dict(txc.metrics.fallbacks()) == before


def test_lstm_training_step_compiles_once():
    torch.manual_seed(0)
    m = nn.LSTM(4, 8).to(txc.device())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(6, 2, 4).to(txc.device())

    def step():
        out, _ = m(x)
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        txc.sync()

    step()
    misses = txc.metrics.counters().get("cache_miss", 0)
    step()
    step()
    assert txc.metrics.counters().get("cache_miss", 0) == misses


@pytest.mark.parametrize("batch_first", [True, False])
def test_packed_sequences_match_cpu(batch_first):
    """pack_padded_sequence -> LSTM -> pad_packed_sequence, as variable-length batches are fed: batch_sizes
    stay on the host (PackedSequence refuses them elsewhere), outputs and gradients match CPU."""
    torch.manual_seed(0)
    m = nn.LSTM(5, 4, num_layers=2, bidirectional=True, batch_first=batch_first)
    x = torch.randn(3, 6, 5) if batch_first else torch.randn(6, 3, 5)
    lengths = torch.tensor([6, 4, 2])

    def run(mod, x):
        x = x.detach().requires_grad_()
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=batch_first)
        assert packed.batch_sizes.device.type == "cpu" and packed.batch_sizes.tolist() == [3, 3, 2, 2, 1, 1]
        out, _ = nn.utils.rnn.pad_packed_sequence(mod(packed)[0], batch_first=batch_first)
        (out * out).sum().backward()
        return out, x.grad, [p.grad for p in mod.parameters()]

    before = dict(txc.metrics.fallbacks())
    want = run(m, x)
    mx = copy.deepcopy(m).to(txc.device())
    got = run(mx, x.to(txc.device()))
    txc.sync()  # one graph for the output and every grad
    torch.testing.assert_close(got[0].cpu(), want[0].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1].cpu(), want[1], atol=1e-5, rtol=1e-5)
    for g, w in zip(got[2], want[2]):
        torch.testing.assert_close(g.cpu(), w, atol=1e-4, rtol=1e-4)
    assert dict(txc.metrics.fallbacks()) == before
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        nn.utils.rnn.pack_padded_sequence(x.to(txc.device()), torch.tensor([2, 6, 4]), batch_first=batch_first)
