"""Deferred checks (torch_xla_core/_tracing/checks.py): inputs only the device can
judge (class targets, indices) raise torch's kind of error, naming the op,
at the sync that computes them; never a silently wrong result."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc


def test_cross_entropy_target_out_of_range_raises(dev):
    x = torch.randn(3, 4)
    ok = F.cross_entropy(x.to(dev), torch.tensor([0, 3, -100]).to(dev))   # -100: ignore_index
    torch.testing.assert_close(ok.cpu(), F.cross_entropy(x, torch.tensor([0, 3, -100])))
    bad = F.cross_entropy(x.to(dev), torch.tensor([0, 4, 1]).to(dev))
    with pytest.raises(IndexError, match=r"nll_loss: a target class is out of bounds.*\[0, 4\)"):
        bad.item()


def test_embedding_index_out_of_range_raises_at_a_following_sync(dev):
    w = torch.randn(5, 2).to(dev)
    F.embedding(torch.tensor([1, 5]).to(dev), w)
    txc.sync()                                    # computed, not waited for: no error yet
    with pytest.raises(IndexError, match=r"embedding: index out of range in self.*\[0, 5\)"):
        txc.sync()                                # read at the start of the next one if ready,
        txc.sync()                                # else of the one after (at most two steps in flight)
    txc.sync(wait=True)                           # reported once


def test_a_sync_does_not_wait_for_the_previous_steps_checks(dev, monkeypatch):
    """The host launches step N+1 while step N runs: a check not yet
    computed is kept for a later sync, one two syncs old is waited for."""
    from torch_xla_core._tracing import checks as _checks
    w = torch.randn(5, 2).to(dev)
    F.embedding(torch.tensor([1, 5]).to(dev), w)
    txc.sync()
    monkeypatch.setattr(_checks, "_ready", lambda lt: False)  # the device still runs the first step
    txc.sync()                                    # not ready, one step old: kept, no wait
    assert len(_checks._computed) == 1
    with pytest.raises(IndexError, match=r"embedding: index out of range"):
        txc.sync()                                # two steps old: waited for and read


def test_gather_and_index_select_out_of_range(dev):
    x = torch.randn(3, 2).to(dev)
    with pytest.raises(RuntimeError, match=r"gather: index out of range.*\[0, 3\)"):
        torch.gather(x, 0, torch.tensor([[3, 0]]).to(dev)).cpu()
    with pytest.raises(IndexError, match=r"index_select: index out of range"):
        torch.index_select(x, 0, torch.tensor([-1]).to(dev)).cpu()    # torch refuses negatives here
    torch.testing.assert_close(torch.gather(x, 0, torch.tensor([[2, 0]]).to(dev)).cpu(),
                               torch.gather(x.cpu(), 0, torch.tensor([[2, 0]])))


def test_advanced_index_wraps_negatives_and_rejects_out_of_range(dev):
    x = torch.randn(3, 2)
    torch.testing.assert_close(x.to(dev)[torch.tensor([-1, 0]).to(dev)].cpu(), x[torch.tensor([-1, 0])])
    with pytest.raises(IndexError, match=r"index: index out of range.*\[-3, 3\)"):
        x.to(dev)[torch.tensor([3])]              # a host index: checked at once
    with pytest.raises(IndexError, match=r"index: index out of range"):
        x.to(dev)[torch.tensor([-4]).to(dev)].cpu()


def test_failed_op_leaves_no_check_and_valid_steps_do_not_recompile(dev):
    with pytest.raises(RuntimeError, match="embedding"):
        F.embedding(torch.randn(3).to(dev), torch.randn(4, 2).to(dev))   # float indices: refused
    txc.sync(wait=True)                           # nothing pending from the failed op
    w, i = torch.randn(5, 2).to(dev), torch.tensor([0, 4]).to(dev)
    F.embedding(i, w).sum().item()
    misses = txc.metrics.counters().get("cache_miss", 0)
    F.embedding(i, w).sum().item()                # the check is part of a stable graph
    assert txc.metrics.counters().get("cache_miss", 0) == misses


def test_scatter_family_and_index_add_copy_fill_out_of_range(dev):
    x = torch.zeros(3, 2).to(dev)
    i_big, i_neg = torch.tensor([3]).to(dev), torch.tensor([-1]).to(dev)
    ones = torch.ones(1, 2).to(dev)
    with pytest.raises(RuntimeError, match=r"scatter_add: index out of range.*\[0, 3\)"):
        x.scatter_add(0, torch.tensor([[-1, 0]]).to(dev), ones).cpu()
    with pytest.raises(RuntimeError, match=r"scatter: index out of range"):
        x.scatter(0, torch.tensor([[3, 0]]).to(dev), 1.0).cpu()
    with pytest.raises(RuntimeError, match=r"index_add: index out of range"):
        x.index_add(0, i_big, ones).cpu()
    with pytest.raises(IndexError, match=r"index_copy: index out of range"):
        x.index_copy(0, i_neg, ones).cpu()
    with pytest.raises(IndexError, match=r"index_fill: index out of range.*\[-3, 3\)"):
        x.index_fill(0, i_big, 1.0).cpu()
    want = torch.zeros(3, 2).index_fill(0, torch.tensor([-1]), 1.0)    # index_fill wraps negatives, like torch
    torch.testing.assert_close(x.index_fill(0, i_neg, 1.0).cpu(), want)
