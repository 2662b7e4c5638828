"""Buffer donation (input/output aliasing, torch_xla_core/_execution/executor.py): a
training step overwrites parameters and optimizer state in place, and a
buffer anyone can still read is never donated."""
import copy
import gc

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import executor


@pytest.fixture(autouse=True)
def _nothing_pending():
    gc.collect()
    txc.sync()  # earlier tests' leftovers: these tests read the whole pending graph


def _aliases(tensors=None):
    return txc.debug.cache_key(tensors).aliases


def _stats():
    return executor.last_memory_stats()


def test_in_place_update_donates_and_stays_correct(dev):
    w = torch.ones(64, 64).to(dev)
    w.mul_(3).add_(1)
    assert len(_aliases()) == 1
    assert "tf.aliasing_output = 0 : i32" in txc.debug.stablehlo()
    txc.sync()
    assert _stats()["alias_size_in_bytes"] == 64 * 64 * 4
    assert w.cpu().eq(4).all()
    w.add_(1)
    txc.sync()
    assert w.cpu().eq(5).all()


def test_a_buffer_still_held_is_not_donated(dev):
    x = torch.arange(6.0).to(dev)
    y = x * 2            # pending, reads x's buffer
    assert _aliases() == ()  # x's storage still holds the buffer: no output may overwrite it
    txc.sync()
    assert x.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert y.cpu().tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_partial_sync_does_not_donate_what_other_pending_tensors_read(dev):
    x = torch.arange(4.0).to(dev)
    a = x + 1
    x.mul_(10)           # x's old buffer: read by a (pending) and by x's new value
    assert x.cpu().tolist() == [0.0, 10.0, 20.0, 30.0]   # a partial sync of x alone
    assert a.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]      # a still reads the old buffer


def test_views_and_state_dict_see_updates_like_cpu(dev):
    lin = torch.nn.Linear(4, 4).to(dev)
    sd = lin.state_dict()
    row = lin.weight[0]
    before = lin.weight.detach().cpu().clone()
    with torch.no_grad():
        lin.weight.add_(1)
    txc.sync()
    torch.testing.assert_close(sd["weight"].cpu(), before + 1)   # state_dict entries alias, as on CPU
    torch.testing.assert_close(row.cpu(), before[0] + 1)
    torch.testing.assert_close(lin.weight.cpu(), before + 1)


def test_adamw_step_donates_parameters_and_state(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    ref = copy.deepcopy(model)
    model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(16, 32)
    param_bytes = sum(p.numel() * 4 for p in model.parameters())
    for step in range(3):
        for m, o, inp in ((model, opt, x.to(dev)), (ref, ref_opt, x)):
            o.zero_grad(set_to_none=True)
            m(inp).square().mean().backward()
            o.step()
        txc.sync()
        if step > 0:
            # params, exp_avg, exp_avg_sq (and the step counts) overwrite their old buffers
            assert _stats()["alias_size_in_bytes"] >= 3 * param_bytes
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, atol=1e-5, rtol=1e-5)


def test_donation_is_part_of_the_key_and_can_be_turned_off(dev, monkeypatch):
    w = torch.ones(8).to(dev)
    w.add_(1)
    k1 = txc.debug.cache_key()
    monkeypatch.setenv("TXC_DONATE", "0")
    k2 = txc.debug.cache_key()
    assert k1.graph == k2.graph and k1.aliases and not k2.aliases and k1 != k2
    txc.sync()
    assert _stats()["alias_size_in_bytes"] == 0
    assert w.cpu().eq(2).all()
