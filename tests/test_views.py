"""Views and in-place ops, including in-place writes through views, against
CPU eager."""
import pytest
import torch

import torch_xla_core as txc
from util import assert_matches_cpu


def _run_both(fn, *shapes):
    """fn mutates its inputs; compare the mutated inputs and outputs."""
    cpu = [torch.arange(float(torch.Size(s).numel())).reshape(s) for s in shapes]
    xla = [t.to(txc.device()) for t in cpu]
    out_c = fn(*cpu)
    out_x = fn(*xla)
    for c, x in zip(cpu, xla):
        torch.testing.assert_close(x.cpu(), c)
    if out_c is not None:
        torch.testing.assert_close(out_x.cpu(), out_c)


def test_write_through_select_slice():
    def f(x):
        x[:, 0] = 1
        x[1] = -2
        x[0, 1:3] += 5
    _run_both(f, (3, 4))


def test_write_through_view_and_transpose():
    def f(x):
        x.view(-1).add_(1)
        x.t()[0].mul_(3)
        return x.sum()
    _run_both(f, (3, 4))


def test_inplace_metadata_t_():
    def f(x):
        x.t_()
        x.add_(1)
        return x
    _run_both(f, (2, 3))


def test_strided_slice_write_and_views_see_writes():
    def f(x):
        v = x[:, ::2]
        x[::2] = 0          # v must see this write
        v.mul_(10)          # and x must see this one
        return v.clone()
    _run_both(f, (4, 6))


def test_view_chain_of_views():
    def f(x):
        a = x.view(2, 6)
        b = a[1]
        c = b.view(3, 2)
        c[0, 0] = 100
        c.unsqueeze(0).squeeze(0)[2].fill_(-1)
        return a + 0
    _run_both(f, (3, 4))


def test_detach_and_data_alias():
    def f(x):
        y = x.detach()
        y.add_(1)
        x.data.mul_(2)
        return y
    _run_both(f, (5,))


def test_split_chunk_unbind_cat_stack():
    x = torch.randn(6, 4, requires_grad=True)
    assert_matches_cpu(lambda t: torch.cat([*t.split(2), *t.split([1, 5])], dim=0) * 3, x)
    assert_matches_cpu(lambda t: torch.cat(t.chunk(2, dim=1)[::-1], dim=1), x)
    assert_matches_cpu(lambda t: torch.stack(t.unbind(1), dim=0) * 2, x)


def test_shape_ops_autograd():
    x = torch.randn(2, 3, 4, requires_grad=True)
    assert_matches_cpu(lambda t: t.permute(2, 0, 1).reshape(4, 6).transpose(0, 1).expand(2, 6, 4).flip(0), x)
    assert_matches_cpu(lambda t: torch.nn.functional.pad(t, (1, 2, 0, 1), value=0.5), x)
    assert_matches_cpu(lambda t: t.unsqueeze(1).squeeze().narrow(2, 1, 2), x)


def test_inplace_dtype_rules(dev):
    x = torch.zeros(3, dtype=torch.int64, device=dev)
    with pytest.raises(RuntimeError, match="can't be cast"):
        x.add_(torch.ones(3, device=dev) * 0.5)
    y = torch.zeros(3, device=dev)
    y.add_(torch.ones(3, dtype=torch.int64, device=dev))
    assert y.dtype == torch.float32 and y.cpu().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.zeros(3, device=dev).add_(torch.ones(2, 3, device=dev))


def test_autograd_through_inplace_on_view():
    def f(t):
        y = t * 1
        y[:, 0] = y[:, 1] * 2
        return y.exp()
    assert_matches_cpu(f, torch.randn(3, 3, requires_grad=True))


def test_views_bad_input_errors(dev):
    x = torch.zeros(2, 3, device=dev)
    with pytest.raises(RuntimeError, match="invalid for input of size 6"):
        x.view(4, 2)
    with pytest.raises(IndexError):
        x.select(0, 5)
    with pytest.raises(RuntimeError, match="expand"):
        x.expand(3, 3)
