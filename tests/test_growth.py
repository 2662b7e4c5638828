"""The "graph grows without bound" trap (torch_xla_core/_execution/growth.py):
a loop that reads loss.item() but never syncs keeps the parameter updates
pending, so each read's graph holds every earlier step. It is warned about
once, naming the cause and the fix, and counted ("growing_graph"); the loops
people write correctly (with txc.sync(), under txc.compile, through dynamo,
with scan, with gradient accumulation, a sequence that grows with nothing
left pending) never are."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_xla_core as txc
from torch_xla_core._execution import growth
from torch_xla_core.scan import scan

STEPS = 10


@pytest.fixture(autouse=True)
def _fresh():
    growth.reset()
    yield
    growth.reset()


def _model(dev):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(dev)
    return m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)


def _batches(dev, n=STEPS):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 8, generator=g).to(dev), torch.randn(5, 4, generator=g).to(dev)) for _ in range(n)]


def _warned(caught):
    return [w for w in caught if "the graph grows at every value read" in str(w.message)]


def _loop(step, dev, sync):
    """Runs step(x, y) -> loss over STEPS batches, reading loss.item() each
    step (txc.sync() after it when sync); returns the losses and the growth
    warnings given."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        losses = []
        for x, y in _batches(dev):
            losses.append(float(step(x, y).item()))
            if sync:
                txc.sync()
    return losses, _warned(caught)


def _plain_step(m, opt):
    """The step people write; m may be the model under torch.compile."""
    def step(x, y):
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def test_reads_without_sync_warn_once_and_count_every_growing_read(dev):
    m, opt = _model(dev)
    graphs = []
    txc.executor.add_sync_listener(graphs.append)
    try:
        losses, got = _loop(_plain_step(m, opt), dev, sync=False)
    finally:
        txc.executor.remove_sync_listener(graphs.append)
    sizes = [p.cut.num_nodes for p in graphs]
    assert all(b > a for a, b in zip(sizes, sizes[1:])), sizes  # the trap itself: every read's graph grows
    assert len(got) == 1, [str(w.message) for w in got]
    msg = str(got[0].message)
    assert "txc.sync() at the end of each step" in msg and "txc.compile" in msg and "loss.item()" in msg
    assert got[0].filename == __file__  # points at the user's line that read the value
    # read 0 sets the size, read 1 the pending size; reads 2..5 grow both: GROWING in a row; 5..9 counted
    assert txc.metrics.counters()["growing_graph"] == STEPS - 1 - growth.GROWING
    assert f"growing graphs: {STEPS - 1 - growth.GROWING} value reads" in txc.metrics.short_report()
    # the same loop with a sync per step computes the same losses and warns of nothing
    m2, opt2 = _model(dev)
    synced, none = _loop(_plain_step(m2, opt2), dev, sync=True)
    assert none == [] and synced == pytest.approx(losses, rel=1e-5, abs=1e-6)


def test_usual_loops_never_warn(dev):
    """A sync per step; gradient accumulation over 8 micro-steps reading each
    micro-step's loss; a sequence growing with nothing left pending."""
    m, opt = _model(dev)
    _, got = _loop(_plain_step(m, opt), dev, sync=True)
    assert got == []

    m, opt = _model(dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(2):
            for x, y in _batches(dev, 8):
                loss = F.mse_loss(m(x), y) / 8
                loss.backward()
                loss.item()
            opt.step()
            opt.zero_grad()
            txc.sync()
        w = torch.randn(4, 4).to(dev)
        seq = torch.randn(1, 4).to(dev)
        for _ in range(STEPS):  # each read's graph is longer (one more row), nothing pending survives it
            out = seq
            for _ in range(seq.shape[0]):
                out = torch.tanh(out @ w)
            out.sum().item()
            seq = torch.cat([seq, torch.randn(1, 4).to(dev)])
            txc.sync()  # (the upload above left the new row's copy pending)
            seq.sum().item()
    assert _warned(caught) == []
    assert "growing_graph" not in txc.metrics.counters()


def test_a_growing_sequence_without_syncs_is_no_trap(dev):
    """Reads whose graphs grow (an RNN unrolled one step further each time)
    but leave nothing pending: not the trap, no warning."""
    w = torch.randn(4, 4).to(dev)
    xs = torch.randn(STEPS + 1, 4).to(dev)
    txc.sync()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(1, STEPS + 1):
            h = torch.zeros(4, device=dev)
            for i in range(t):
                h = torch.tanh(h @ w + xs[i])
            h.sum().item()
    assert _warned(caught) == [] and "growing_graph" not in txc.metrics.counters()


def test_txc_compile_step_without_sync_never_warns(dev):
    m, opt = _model(dev)
    _, got = _loop(txc.compile(_plain_step(m, opt)), dev, sync=False)
    assert got == [] and "growing_graph" not in txc.metrics.counters()
    assert txc.metrics.counters()["replay"] >= STEPS - 2


@pytest.mark.usefixtures("fresh_dynamo")
def test_dynamo_step_without_sync_never_warns(dev):
    m, opt = _model(dev)
    _, got = _loop(_plain_step(torch.compile(m, backend="torch_xla_core"), opt), dev, sync=False)
    assert got == [] and "growing_graph" not in txc.metrics.counters()


def test_scan_loop_never_warns(dev):
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 4).to(dev) * 0.3)
    opt = torch.optim.SGD([w], lr=0.01)

    def step(x, y):
        opt.zero_grad()
        h, _ = scan(lambda c, xi: (torch.tanh(c @ w + xi), None), torch.zeros(5, 4, device=dev), x.unsqueeze(0).expand(3, 5, 8)[..., :4])
        loss = F.mse_loss(h, y)
        loss.backward()
        opt.step()
        return loss
    _, got = _loop(step, dev, sync=True)
    assert got == [] and "growing_graph" not in txc.metrics.counters()
