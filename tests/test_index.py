"""Indexing ops (csrc/ops/index.cpp, _ops/index.py): advanced indexing and
assignment through Python indexing, gather/scatter, masks, embedding's
backward, cumsum, sort/topk, tril/triu, diagonal — forward and backward
against CPU eager."""
import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc
from util import assert_matches_cpu


def rand(*shape):
    return torch.randn(*shape).requires_grad_()


IDX = torch.tensor([0, 2, -1, 2])  # negative and repeated


@pytest.mark.parametrize("name,fn", [
    ("int", lambda x, i: x[1]),
    ("slice", lambda x, i: x[1:3, ::2]),
    ("tensor", lambda x, i: x[i]),
    ("tensor_dim1", lambda x, i: x[:, i]),
    ("two_tensors", lambda x, i: x[i, i.abs() % 3]),
    ("broadcast_indices", lambda x, i: x[i[:, None], i.abs()[None, :2]]),
    ("none", lambda x, i: x[None, i]),
    ("ellipsis", lambda x, i: x[..., i.abs()]),
    ("separated", lambda x, i: x.reshape(4, 3, 5)[i, :, i.abs()]),
    ("adjacent_middle", lambda x, i: x.reshape(4, 3, 5)[:, i.abs() % 3, i.abs()]),
    ("list", lambda x, i: x[[0, 3]]),
])
def test_getitem(name, fn):
    assert_matches_cpu(fn, rand(4, 5 if name not in ("separated", "adjacent_middle") else 15), IDX)


def test_getitem_mask_syncs_and_matches():
    x = rand(4, 5)
    mask = x.detach() > 0
    before = txc.metrics.counters().get("data_dependent::index", 0)
    assert_matches_cpu(lambda x, m: x[m], x, mask)
    assert_matches_cpu(lambda x, m: x[:, m[0]] * 2, x, mask)
    assert txc.metrics.counters().get("data_dependent::index", 0) == before + 2


def _setitem(fn):
    def f(x, *a):
        y = x * 1
        fn(y, *a)
        return y
    return f


@pytest.mark.parametrize("name,fn", [
    ("tensor", lambda y, i, m: y.__setitem__(i.abs() % 2, y[2:4] * 3)),
    ("tensor_dim1_scalar", lambda y, i, m: y.__setitem__((slice(None), i), 7.0)),
    ("mask_scalar", lambda y, i, m: y.__setitem__(m, 0.0)),
    ("mask_row", lambda y, i, m: y.__setitem__(m[:, 0], y[0] * 2)),
    ("mask_dim1_rows", lambda y, i, m: y.__setitem__((slice(None), m[0]), y[:, :1] + 1)),
    ("int_slice", lambda y, i, m: y.__setitem__((1, slice(0, 3)), -1.0)),
    ("iadd_tensor", lambda y, i, m: y[:, 1:3].add_(y[:, 3:5])),
    ("ellipsis", lambda y, i, m: y.__setitem__((Ellipsis, 0), y[..., 1])),
])
def test_setitem(name, fn):
    x = rand(4, 5)
    mask = x.detach() > 0
    assert_matches_cpu(_setitem(fn), x, torch.tensor([0, 3]), mask)


def test_setitem_mask_values_stays_on_device():
    # x[mask] = v with one value per selected element: no host sync needed.
    x = torch.randn(4, 5)
    mask = x > 0.3
    v = torch.arange(int(mask.sum()), dtype=torch.float32)
    before = dict(txc.metrics.counters())
    out = assert_matches_cpu(_setitem(lambda y, m, v: y.__setitem__(m, v)), x, mask, v)
    assert txc.metrics.counters().get("data_dependent::index_put", 0) == before.get("data_dependent::index_put", 0)
    assert out.shape == x.shape
    cols = mask[0]  # x[:, cols] = v with v holding one column per selected column
    w = torch.randn(4, int(cols.sum()))
    assert_matches_cpu(_setitem(lambda y, c, w: y.__setitem__((slice(None), c), w)), x, cols, w)
    assert txc.metrics.counters().get("data_dependent::index_put", 0) == before.get("data_dependent::index_put", 0)


def test_mask_backward_stays_on_device():
    x = rand(3, 4)
    mask = x.detach() > 0
    xx = x.detach().to(txc.device()).requires_grad_()
    mm = mask.to(txc.device())
    y = xx[mm]  # one sync for the forward
    n = txc.metrics.counters().get("data_dependent::index", 0)
    (y * 3).sum().backward()
    assert txc.metrics.counters().get("data_dependent::index", 0) == n
    torch.testing.assert_close(xx.grad.cpu(), mask.float() * 3)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put(accumulate):
    x = rand(5, 3)
    v = rand(4, 3)
    # Without accumulate, repeated indices leave the winner undefined (torch and
    # XLA alike; GPUs do differ), so only the accumulating case repeats one.
    i = torch.tensor([0, 4, 2, -2]) if not accumulate else torch.tensor([0, 4, 0, -1])
    assert_matches_cpu(lambda x, v, i: torch.index_put(x, (i,), v, accumulate=accumulate), x, v, i)
    j = torch.tensor([1, 0, 2, 2])
    assert_matches_cpu(lambda x, v, i, j: torch.index_put(x, (i, j), v[:, 0], accumulate=accumulate), x, v, i, j)


def test_index_put_inplace_bool_accumulate():
    x = torch.zeros(4, dtype=torch.bool)
    assert_matches_cpu(lambda x, i: x.index_put_((i,), torch.tensor(True), accumulate=True), x, torch.tensor([1, 1, 3]))


def test_index_select_and_add():
    x = rand(4, 5)
    i = torch.tensor([4, 0, 0, 2])
    assert_matches_cpu(lambda x, i: x.index_select(1, i), x, i)
    assert_matches_cpu(lambda x, i: x.index_select(0, i[1:3].int()), x, i)
    src = rand(4, 4)
    assert_matches_cpu(lambda x, i, s: x.index_add(1, i, s, alpha=2), x, i, src)
    assert_matches_cpu(lambda x, i, s: x.index_copy(1, i[1:], s[:, 1:]), x, torch.tensor([4, 0, 2, 3]), src)
    assert_matches_cpu(lambda x, i: x.index_fill(0, i[:2], -2.0), x, torch.tensor([3, 1]))


def test_gather():
    x = rand(4, 5)
    i = torch.tensor([[0, 4], [1, 1], [2, 2], [3, 0]])
    assert_matches_cpu(lambda x, i: torch.gather(x, 1, i), x, i)
    assert_matches_cpu(lambda x, i: torch.gather(x, 0, i.abs() % 4), x, i)
    assert_matches_cpu(lambda x, i: torch.take_along_dim(x, i.abs(), dim=1), x, i)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_src_value_add():
    x = rand(3, 5)
    src = rand(3, 4)
    i = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1], [1, 1, 1, 1]])
    iu = torch.tensor([[0, 1, 2, 3], [4, 3, 2, 1], [0, 2, 4, 1]])  # unique per row: defined result
    assert_matches_cpu(lambda x, i, s: x.scatter(1, i, s), x, iu, src)
    assert_matches_cpu(lambda x, i: x.scatter(1, i, 2.5), x, iu)
    assert_matches_cpu(lambda x, i, s: x.scatter_add(1, i, s), x, i, src)
    assert_matches_cpu(lambda x, i, s: x.scatter(1, i, s, reduce="multiply"), x.detach(), i, src.detach())


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = torch.randn(3, 5)
    src = torch.randn(3, 4)
    i = torch.tensor([[0, 0, 2, 3], [4, 4, 4, 1], [1, 1, 1, 1]])
    grad = reduce in ("sum", "mean")
    assert_matches_cpu(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self),
                       x.requires_grad_(grad), i, src.requires_grad_(grad))


def test_scatter_reduce_int():
    x = torch.arange(6).reshape(2, 3)
    i = torch.tensor([[0, 0], [2, 1]])
    for r in ("sum", "amax", "amin", "prod"):
        assert_matches_cpu(lambda x, i: x.scatter_reduce(1, i, x[:, 1:] * 3, r), x, i)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_scatter_reduce_mean_of_integers_rounds_down_as_cpu(dtype):
    """torch divides an integer mean by its count with floor division
    (-7 / 2 -> -4); it was refused (the fuzzer's case 1:57). Bools raise as CPU."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-50, 50, (4, 5), generator=g).to(dtype)
    src = torch.randint(-50, 50, (6, 5), generator=g).to(dtype)
    i = torch.randint(0, 4, (6, 5), generator=g)
    for include_self in (True, False):
        want = x.scatter_reduce(0, i, src, "mean", include_self=include_self)
        got = x.to(txc.device()).scatter_reduce(0, i.to(txc.device()), src.to(txc.device()), "mean",
                                                include_self=include_self).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (include_self, want, got)
    b = torch.tensor([True, False])
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        b.scatter_reduce(0, torch.tensor([0]), b[:1], "mean")
    with pytest.raises(NotImplementedError, match="not implemented for 'Bool'"):
        b.to(txc.device()).scatter_reduce(0, torch.tensor([0]).to(txc.device()), b[:1].to(txc.device()), "mean")


def test_masked_scatter_and_select():
    x = rand(3, 4)
    mask = x.detach() > 0
    src = rand(12)
    assert_matches_cpu(lambda x, m, s: x.masked_scatter(m, s * 2), x, mask, src)
    assert_matches_cpu(lambda x, m, s: x.masked_scatter(m[0], s.reshape(3, 4)), x, mask, src)  # broadcast mask
    assert_matches_cpu(lambda x, m: torch.masked_select(x, m), x, mask)


def test_nonzero_counts_sync():
    x = torch.tensor([[0, 1, 0], [2, 0, 3]])
    n = txc.metrics.counters().get("data_dependent::nonzero", 0)
    assert_matches_cpu(torch.nonzero, x)
    assert_matches_cpu(torch.argwhere, x)
    assert txc.metrics.counters().get("data_dependent::nonzero", 0) == n + 2


@pytest.mark.parametrize("padding_idx", [None, 0, 3])
def test_embedding_forward_backward(padding_idx):
    w = rand(6, 4)
    idx = torch.tensor([[0, 3, 5], [3, 3, 1]])
    assert_matches_cpu(lambda w, i: F.embedding(i, w, padding_idx=padding_idx), w, idx)


def test_embedding_dense_backward_direct():
    g = torch.randn(2, 3, 4)
    idx = torch.tensor([[0, 3, 5], [3, 3, 1]])
    for pad, freq in [(-1, False), (3, False), (-1, True), (0, True)]:
        assert_matches_cpu(lambda g, i: torch.ops.aten.embedding_dense_backward(g, i, 7, pad, freq), g, idx)


def test_cumsum_cumprod():
    x = rand(3, 6)
    assert_matches_cpu(lambda x: x.cumsum(1), x)
    assert_matches_cpu(lambda x: x.cumsum(0, dtype=torch.float64), x)
    assert_matches_cpu(lambda x: torch.cumprod(x, 1), torch.rand(3, 5).add(0.5).requires_grad_())
    assert_matches_cpu(lambda x: x.cumsum(0), torch.tensor([True, False, True]))
    out = assert_matches_cpu(lambda x: x.cumsum(-1), torch.arange(5, dtype=torch.int32))
    assert out.dtype == torch.int64


def test_cummax_cummin():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 5.0, 0.0], [2.0, 1.0, 1.0, 0.0, 4.0, 4.0]]).requires_grad_()
    assert_matches_cpu(lambda x: torch.cummax(x, 1), x)
    assert_matches_cpu(lambda x: torch.cummin(x, 1), x)
    assert_matches_cpu(lambda x: torch.cummax(x, 0), torch.tensor([[3, 1], [3, 5], [2, 5]]))


def test_kthvalue():
    x = torch.randn(3, 6).requires_grad_()
    assert_matches_cpu(lambda x: torch.kthvalue(x, 2, 1), x)
    assert_matches_cpu(lambda x: torch.kthvalue(x, 3, 0, keepdim=True), x)


def test_sort_topk_argsort():
    x = torch.randn(4, 7).requires_grad_()
    assert_matches_cpu(lambda x: torch.sort(x, 1), x)
    assert_matches_cpu(lambda x: torch.sort(x, 0, descending=True), x)
    assert_matches_cpu(lambda x: torch.topk(x, 3), x)
    assert_matches_cpu(lambda x: torch.topk(x, 2, dim=0, largest=False), x)
    assert_matches_cpu(lambda x: x.argsort(1, descending=True), x.detach())
    assert_matches_cpu(lambda x: torch.sort(x, stable=True), torch.tensor([3, 1, 2, 1, 3, 0]))


def test_sort_nan_and_ties():
    # NaN sorts above +inf, -0.0 ties with 0.0 (stable order kept).
    x = torch.tensor([1.0, float("nan"), -0.0, 0.0, float("-inf"), 2.0, 1.0])
    for desc in (False, True):
        v, i = torch.sort(x.to(txc.device()), stable=True, descending=desc)
        cv, ci = torch.sort(x, stable=True, descending=desc)
        torch.testing.assert_close(v.cpu(), cv, equal_nan=True)
        assert torch.equal(i.cpu(), ci)


def test_tril_triu_causal_mask():
    x = rand(2, 4, 5)
    for k in (-1, 0, 2):
        assert_matches_cpu(lambda x: x.tril(k), x)
        assert_matches_cpu(lambda x: x.triu(k), x)
    ones = torch.ones(5, 5, dtype=torch.bool)
    assert_matches_cpu(lambda s, o: s.masked_fill(~o.tril(), float("-inf")).softmax(-1), rand(5, 5), ones)


def test_diagonal_and_write_through():
    x = rand(3, 4, 5)
    assert_matches_cpu(lambda x: x.diagonal(), x)
    assert_matches_cpu(lambda x: x.diagonal(1, -1, 0), x)
    assert_matches_cpu(lambda x: torch.diagonal(x, -2, 2, 1) * 2, x)

    def write(x):
        y = x * 1
        y.diagonal(1).fill_(7.0)
        return y
    assert_matches_cpu(write, x)


def test_one_hot():
    assert_matches_cpu(lambda i: F.one_hot(i, 6), torch.tensor([0, 5, 2, 2]))


def test_no_recompile_for_new_index_values():
    x = torch.randn(6, 4).to(txc.device())
    (x[torch.tensor([0, 1]).to(txc.device())] * 2).cpu()
    n = txc.metrics.counters().get("compile", 0)
    out = (x[torch.tensor([5, 3]).to(txc.device())] * 2).cpu()
    assert txc.metrics.counters().get("compile", 0) == n
    torch.testing.assert_close(out, x.cpu()[[5, 3]] * 2)


def test_errors_name_the_op():
    d = txc.device()
    x = torch.randn(3, 4).to(d)
    with pytest.raises(IndexError, match="too many indices"):
        x[torch.tensor([0]).to(d), torch.tensor([0]).to(d), torch.tensor([0]).to(d)]
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool"):
        x[torch.tensor([0.5]).to(d)]
    with pytest.raises(IndexError, match="shape of the mask"):
        x[torch.tensor([True, False]).to(d)]
    with pytest.raises(RuntimeError, match="gather.*Size does not match at dimension 0"):
        torch.gather(x, 1, torch.zeros(5, 2, dtype=torch.long).to(d))
    with pytest.raises(RuntimeError, match="index_put: shape mismatch"):
        x[torch.tensor([0, 1]).to(d)] = torch.ones(3, 3).to(d)
    with pytest.raises(RuntimeError, match="scatter_reduce.*reduce argument"):
        x.scatter_reduce(0, torch.zeros(1, 4, dtype=torch.long).to(d), x, "median")
    with pytest.raises(RuntimeError, match="tril: input tensor must have at least 2 dimensions"):
        torch.tril(torch.ones(3).to(d))
    with pytest.raises(RuntimeError, match="topk.*out of range"):
        torch.topk(x, 5)


def test_gather_and_scatter_take_int32_indices_like_cpu():
    x = torch.randn(3, 5, requires_grad=True)
    i = torch.tensor([[0, 4, 2], [1, 1, 3], [4, 0, 0]], dtype=torch.int32)
    src = torch.randn(3, 3)
    assert_matches_cpu(lambda t, idx: torch.gather(t, 1, idx), x, i)
    unique = torch.tensor([[0, 4, 2], [1, 2, 3], [4, 0, 1]], dtype=torch.int32)  # scatter: no duplicate targets
    assert_matches_cpu(lambda t, idx, s: t.scatter(1, idx, s), x, unique, src)
    assert_matches_cpu(lambda t, idx, s: t.scatter_add(1, idx, s), x, i, src)
    with pytest.raises(RuntimeError, match=r"gather\(\): Expected dtype int32/int64 for index"):
        torch.gather(x.detach().to(txc.device()), 1, i.float().to(txc.device()))


@pytest.mark.parametrize("xshape,ishapes,dims", [
    ((10, 0, 10, 10), [(5, 0, 5), (5, 1, 1)], (1, 3)),  # the indices broadcast to an empty shape
    ((0, 0, 10, 0), [(5, 5, 0), (5, 5, 1)], (1, 3)),
    ((10, 3), [(0,)], (0,)),
])
def test_indices_that_select_nothing_are_not_range_checked_as_cpu(xshape, ishapes, dims, dev):
    """Out-of-range values in index tensors whose broadcast shape is empty are
    never read: CPU returns the empty result, and so do we (no error at the sync)."""
    x = torch.rand(xshape)
    idx = [torch.randint(50, 100, s) for s in ishapes]  # every value out of range
    key = [slice(None)] * len(xshape)
    xkey = list(key)
    for d, i in zip(dims, idx):
        key[d], xkey[d] = i, i.to(dev)
    want = x[tuple(key)]
    got = x.to(dev)[tuple(xkey)]
    assert got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want)
    with pytest.raises(IndexError, match="index out of range"):  # a used index is still checked
        torch.rand(10).to(dev)[torch.tensor([50]).to(dev)].cpu()
