"""Views and in-place ops, including in-place writes through views, against
CPU eager."""
import copy

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


# ---- strides, storage offsets and copies against CPU -------------------------
# A view's wrapper carries torch's strides and storage offset, so that
# contiguous(), reshape() and flatten() copy exactly where CPU's do (a copy
# must not share storage with the base) and view() refuses what CPU's does.

def _pair(shape=(4, 6)):
    c = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    return c, c.to(txc.device())


VIEW_CHAINS = {
    "slice_2d": lambda x: x[1:3, 1:3],
    "slice_steps": lambda x: x[::2, 1::3],
    "slice_offset_rows": lambda x: x[1:3],
    "transpose": lambda x: x.t(),
    "transpose_of_slice": lambda x: x[1:, 2:].t(),
    "slice_of_transpose": lambda x: x.t()[1::2],
    "select": lambda x: x.select(1, 2),
    "select_row": lambda x: x[3],
    "select_of_transpose": lambda x: x.t()[4],
    "narrow": lambda x: x.narrow(1, 1, 3),
    "narrow_dim0": lambda x: x.narrow(0, 1, 2),
    "expand_row": lambda x: x[1:2].expand(3, 6),
    "expand_col": lambda x: x[:, 2:3].expand(-1, 5),
    "expand_new_dims": lambda x: x[1].expand(2, 3, 6),
    "unsqueeze_of_transpose": lambda x: x.t().unsqueeze(1),
    "unsqueeze_end_of_transpose": lambda x: x.t().unsqueeze(2),
    "unsqueeze_front_of_slice": lambda x: x[:, 1:4].unsqueeze(0),
    "squeeze_of_select": lambda x: x[:, 1:2].t().squeeze(0),
    "permute_3d": lambda x: x.view(2, 2, 6).permute(2, 0, 1),
    "view_then_select_transpose": lambda x: x.view(2, 3, 4)[:, 1].transpose(0, 1),
    "view_of_transpose": lambda x: x.t().view(2, 3, 4),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(2),
    "diagonal_negative_of_transpose": lambda x: x.t().diagonal(-1),
    "detach_of_slice": lambda x: x[:, 1:].detach(),
    "unbind_col": lambda x: x.unbind(1)[3],
    "split_cols": lambda x: x.split(4, dim=1)[1],
    "unsqueeze_of_empty": lambda x: x[:0].unsqueeze(0),
    "unsqueeze_of_empty_slice": lambda x: x[:, 6:].unsqueeze(1),
    "view_of_empty_transpose": lambda x: x[:0].t().view(2, 3, 0),
    "unsqueeze_of_contiguous": lambda x: x.unsqueeze(2),
    "squeeze_of_contiguous_unsqueeze": lambda x: x.view(4, 1, 6).squeeze(1),
}


@pytest.mark.parametrize("name", sorted(VIEW_CHAINS))
def test_view_strides_offset_contiguity_match_cpu(name):
    c, x = _pair()
    vc, vx = VIEW_CHAINS[name](c), VIEW_CHAINS[name](x)
    assert vx.shape == vc.shape
    assert vx.stride() == vc.stride()
    assert vx.storage_offset() == vc.storage_offset()
    assert vx.is_contiguous() == vc.is_contiguous()
    torch.testing.assert_close(vx.cpu(), vc)


@pytest.mark.parametrize("how", ["contiguous", "reshape", "flatten"])
@pytest.mark.parametrize("name", sorted(n for n in VIEW_CHAINS if not n.startswith("expand")))
def test_contiguous_reshape_flatten_copy_or_view_as_cpu(name, how):
    ops = {"contiguous": lambda v: v.contiguous(), "reshape": lambda v: v.reshape(-1),
           "flatten": lambda v: v.flatten()}
    c, x = _pair()
    oc, ox = ops[how](VIEW_CHAINS[name](c)), ops[how](VIEW_CHAINS[name](x))
    assert ox.stride() == oc.stride() and ox.storage_offset() == oc.storage_offset()
    oc.add_(100)          # a copy leaves the base alone; a view writes through
    ox.add_(100)
    torch.testing.assert_close(x.cpu(), c)
    c.mul_(-1)            # and a copy does not see later writes to the base
    x.mul_(-1)
    torch.testing.assert_close(ox.cpu(), oc)


@pytest.mark.parametrize("name", ["expand_row", "expand_col", "expand_new_dims"])
def test_contiguous_and_reshape_of_expand_copy(name):
    c, x = _pair()
    for fn in (lambda v: v.contiguous(), lambda v: v.reshape(-1), lambda v: v.flatten()):
        oc, ox = fn(VIEW_CHAINS[name](c)), fn(VIEW_CHAINS[name](x))
        assert ox.stride() == oc.stride() and ox.is_contiguous() == oc.is_contiguous()
        oc.add_(1)
        ox.add_(1)
        torch.testing.assert_close(x.cpu(), c)
        torch.testing.assert_close(ox.cpu(), oc)


def test_contiguous_of_transpose_is_a_copy(dev):
    x = torch.zeros(2, 3, device=dev)
    y = x.t().contiguous()
    y.add_(1)
    assert x.cpu().tolist() == [[0.0] * 3] * 2
    assert y.cpu().tolist() == [[1.0] * 2] * 3


def test_reshape_of_noncontiguous_slice_is_a_copy(dev):
    z = torch.arange(12.0, device=dev).reshape(3, 4)
    w = z[:, 1:].reshape(-1)
    z.fill_(5)
    assert w.cpu().tolist() == [1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 9.0, 10.0, 11.0]


def test_slice_reports_cpu_strides(dev):
    v = torch.zeros(4, 4, device=dev)[1:3, 1:3]
    assert v.stride() == (4, 1) and v.storage_offset() == 5 and not v.is_contiguous()


def test_view_errors_on_incompatible_strides_like_cpu():
    c, x = _pair((2, 3))
    for fn in (lambda v: v.t().view(-1), lambda v: v.t().view(6), lambda v: v[:, 1:].view(4),
               lambda v: v.t().view(size=(6,))):
        with pytest.raises(RuntimeError, match=r"view size is not compatible .* Use \.reshape\(\.\.\.\) instead"):
            fn(c)
        with pytest.raises(RuntimeError, match=r"view size is not compatible .* Use \.reshape\(\.\.\.\) instead"):
            fn(x)


def test_view_of_noncontiguous_where_strides_allow_writes_through():
    c, x = _pair()
    outs = []
    for t in (c, x):
        v = t.t().view(2, 3, 4)       # splits the stride-1 dim of the transpose
        v[1, 0].fill_(-1)
        w = t[1:3].view(-1)           # contiguous rows at an offset
        w[::3] = 7
        outs.append([(v.stride(), v.storage_offset()), (w.stride(), w.storage_offset()), v.sum().item()])
    assert outs[0] == outs[1]
    torch.testing.assert_close(x.cpu(), c)


def test_inplace_view_ops_keep_cpu_metadata():
    def check(fn):
        c, x = _pair()
        rc, rx = fn(c), fn(x)
        assert rx is not None and (rx.shape, rx.stride(), rx.storage_offset()) == \
            (rc.shape, rc.stride(), rc.storage_offset())
        rc.add_(1000)
        rx.add_(1000)
        torch.testing.assert_close(x.cpu(), c)
        torch.testing.assert_close(rx.cpu(), rc)
    check(lambda x: x.t_())
    check(lambda x: x[1:].transpose_(0, 1))
    check(lambda x: x[:, 2:].t().unsqueeze_(1))
    check(lambda x: x[:, 2:3].squeeze_(1))
    check(lambda x: x[1:].as_strided_((2, 3), (2, 5), 3))


def test_out_resize_gives_contiguous_independent_result(dev):
    # (CPU lays a fresh out= result out like its inputs; ours is contiguous.)
    a = torch.arange(6.0).reshape(2, 3)
    ax = a.to(dev)
    out_c, out_x = torch.empty(0), torch.empty(0, device=dev)
    torch.mul(a.t(), a.t(), out=out_c)
    torch.mul(ax.t(), ax.t(), out=out_x)
    assert out_x.shape == out_c.shape and out_x.is_contiguous() and out_x.storage_offset() == 0
    ax.add_(1)
    out_x.view(-1)[0] = 5
    out_c.view(3, 2)[0, 0] = 5
    torch.testing.assert_close(out_x.cpu(), out_c)
    torch.testing.assert_close(ax.cpu(), a + 1)


# ---- as_strided: relative to the storage, as on CPU ------------------------------

AS_STRIDED = {
    "slice_explicit_offset": lambda x: x[1:].as_strided((2, 2), (1, 2), 1),
    "slice_own_offset": lambda x: x[1:].as_strided((2, 3), (4, 1)),
    "select_reaches_outside": lambda x: x[2].as_strided((3, 2), (5, 1), 0),
    "transpose": lambda x: x.t().as_strided((3,), (5,), 2),
    "overlapping": lambda x: x[1:, 1:].as_strided((3, 3), (1, 1)),
    "zero_stride": lambda x: x.as_strided((2, 3), (0, 2), 7),
    "scalar": lambda x: x[3].as_strided((), (), 9),
    "empty": lambda x: x.as_strided((0, 3), (3, 1), 15),
    "of_as_strided": lambda x: x[1:].as_strided((3, 4), (4, 1), 4)[1:].t(),
}


@pytest.mark.parametrize("name", sorted(AS_STRIDED))
def test_as_strided_matches_cpu(name):
    c, x = _pair((4, 4))
    rc, rx = AS_STRIDED[name](c), AS_STRIDED[name](x)
    assert (rx.shape, rx.stride(), rx.storage_offset()) == (rc.shape, rc.stride(), rc.storage_offset())
    torch.testing.assert_close(rx.cpu(), rc)
    assert not txc.metrics.fallbacks()


def test_as_strided_writes_reach_the_base_and_see_its_writes():
    def f(x):
        v = x[2:].as_strided((2, 2), (4, 1), 1)
        v.mul_(10)
        x[0, 1:3] = -1
        return v + 0
    _run_both(f, (4, 4))


def test_as_strided_scatter_and_errors(dev):
    c, x = _pair((4, 4))
    src = torch.arange(4.0).reshape(2, 2) * -1
    want = torch.as_strided_scatter(c, src, (2, 2), (1, 4), 1)
    got = torch.as_strided_scatter(x, src.to(dev), (2, 2), (1, 4), 1)
    torch.testing.assert_close(got.cpu(), want)
    # the whole storage is in reach of a view's as_strided
    torch.testing.assert_close(x[1:].as_strided((12,), (1,), 4).cpu(), c[1:].as_strided((12,), (1,), 4))
    assert not txc.metrics.fallbacks()
    for t in (c, x):
        with pytest.raises(RuntimeError, match="out of bounds"):
            t[1:].as_strided((5,), (4,), 0)
        with pytest.raises(RuntimeError, match="Negative strides"):
            t.as_strided((2,), (-1,), 3)


def test_autograd_through_strided_views():
    x = torch.randn(4, 6, requires_grad=True)
    assert_matches_cpu(lambda t: t.t().contiguous().view(-1) * 2, x)
    assert_matches_cpu(lambda t: t[:, 1:].reshape(-1).exp() + t.t()[1:].flatten().sum(), x)
    assert_matches_cpu(lambda t: t[1:].as_strided((2, 3), (2, 1), 3) * 3, x)
    w = torch.randn(5, 6, requires_grad=True)
    assert_matches_cpu(lambda t, u: (t @ u.t()).relu() @ u, x, w)


# ---- tensor identity: .data =, set_, Module dtype conversion ----------------------------

def test_data_setter_takes_the_new_value(dev):
    """`t.data = other` makes t hold other's value (it was silently ignored: the wrapper took
    other's shape and dtype but kept its old payload)."""
    p = torch.nn.Parameter(torch.zeros(3, device=dev))
    p.data = torch.arange(3.0, device=dev)
    assert torch.equal(p.cpu(), torch.arange(3.0)) and p.requires_grad
    p.data = torch.ones(2, 2, device=dev)  # a new shape
    assert p.shape == (2, 2) and torch.equal(p.cpu(), torch.ones(2, 2))
    lin = torch.nn.Linear(2, 3).to(dev)
    lin.weight.data = torch.ones(3, 2, device=dev)
    x = torch.randn(4, 2)
    torch.testing.assert_close(lin(x.to(dev)).cpu(), x.sum(1, keepdim=True) + lin.bias.cpu().detach())
    with pytest.raises(RuntimeError):
        p.data = torch.ones(3)  # a CPU tensor: torch's own refusal


def test_module_dtype_conversion_on_device(dev):
    """model.to(dev).bfloat16() / .half().float(): Module._apply sets param.data on the device."""
    torch.manual_seed(0)
    cpu = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    xla = copy.deepcopy(cpu).to(dev).bfloat16()
    assert xla.weight.dtype == torch.bfloat16
    torch.testing.assert_close(xla(x.to(dev).bfloat16()).cpu(), cpu.bfloat16()(x.bfloat16()), atol=1e-2, rtol=1e-2)
    back = xla.float()
    assert back.weight.cpu().dtype == torch.float32
    torch.testing.assert_close(back.weight.cpu(), cpu.weight.float().detach())  # cpu is bfloat16 now too


def test_set_aliases_the_source(dev):
    p, q = torch.zeros(3, device=dev), torch.arange(3.0, device=dev)
    p.set_(q[1:])
    q.add_(1)
    assert p.shape == (2,) and torch.equal(p.cpu(), torch.tensor([2.0, 3.0]))
    p.set_()
    assert p.shape == (0,)
    with pytest.raises(RuntimeError, match="Could not set|dtypes must match"):
        torch.zeros(2, device=dev).set_(torch.zeros(2, dtype=torch.int64, device=dev))


@pytest.mark.parametrize("name", ["shift right", "shift rows", "transposed onto itself", "same elements",
                                  "disjoint", "columns (not dense: allowed)"])
def test_copy_between_overlapping_views_raises_as_on_cpu(dev, name):
    """A copy whose source and destination overlap in part raises torch's
    "single memory location" error as CPU does (the result would depend on
    the order of element copies); the same elements, disjoint blocks and
    views torch cannot judge (not dense blocks) copy, matching CPU."""
    cases = {
        "shift right": lambda x: x.view(-1).__setitem__(slice(5, 8), x.view(-1)[4:7]),
        "shift rows": lambda x: x.__setitem__(slice(1, 3), x[0:2]),
        "transposed onto itself": lambda x: x.view(4, 3).copy_(x.t()),
        "same elements": lambda x: x.view(-1)[4:7].copy_(x.view(-1)[4:7]),
        "disjoint": lambda x: x.view(-1).__setitem__(slice(0, 3), x.view(-1)[5:8]),
        "columns (not dense: allowed)": lambda x: x.__setitem__((slice(None), slice(2, 4)), x[:, 0:2]),
    }
    f = cases[name]
    cpu = torch.arange(12.0).reshape(3, 4)
    try:
        f(cpu)
        cpu_err = None
    except RuntimeError as e:
        cpu_err = e
    x = torch.arange(12.0).reshape(3, 4).to(dev)
    if cpu_err is not None:
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            f(x)
        torch.testing.assert_close(x.cpu(), torch.arange(12.0).reshape(3, 4))  # nothing written
    else:
        f(x)
        torch.testing.assert_close(x.cpu(), cpu)
