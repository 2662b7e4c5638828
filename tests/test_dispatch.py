"""The C++ dispatcher's direct recipes (csrc/py/dispatch.cpp, _ops.direct):
for every overload that has one, the recipe must build exactly what the
overload's Python handler builds (same core node hash, shape and dtype), and
calls that don't fit it must reach the handler (its results and errors)."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import _C
from torch_xla_core._ops import ANY, XLA
from torch_xla_core._tensor import DIRECT, HANDLERS

aten = torch.ops.aten
DEV = txc.device()
_SHAPE = {0: (), 1: (4,), 2: (4, 4), 3: (2, 4, 4), XLA: (4, 4), ANY: (4, 4)}
# Overloads whose recipes take attributes from args: the args to try.
_ATTR_ARGS = {
    aten.view.default: [[16], [2, -1], [4, 2, 2]],
    aten._unsafe_view.default: [[16], [2, 8]],
    aten.reshape.default: [[-1], [8, 2]],
    aten.sum.dim_IntList: [[0], [-1], [0, 1]],
}


def _tensor(shape, dtype):
    t = torch.randn(shape) * 3
    return (t > 0 if dtype is torch.bool else t.to(dtype)).to(DEV)


def _arg_sets(func, recipe, dtype):
    """Argument lists that fit the recipe, following func's schema: Tensor
    operands get tensors of the recipe's ranks, Scalar ones Python numbers."""
    _, nargs, operands, ranks, layout, _, _ = recipe
    kinds = [str(a.type) for a in func._schema.arguments[:nargs]]
    numbers = [True] if dtype is torch.bool else [3, 2.5] if dtype.is_floating_point else [3]
    attr_idx = [i for i in layout if i >= 0]
    sets = []
    for value in (_ATTR_ARGS[func] if attr_idx else [None]):
        base = {i: (_tensor(_SHAPE[r], dtype) if kinds[i] == "Tensor" else numbers[0]) for i, r in zip(operands, ranks)}
        args = [base.get(i, value) for i in range(nargs)]
        sets.append(args)
        for i in operands:
            if kinds[i] == "Scalar":
                sets += [[n if j == i else a for j, a in enumerate(args)] for n in numbers[1:]]
    return sets


@pytest.mark.parametrize("func", sorted(DIRECT, key=str), ids=str)
def test_recipe_builds_what_the_handler_builds(func):
    recipe = DIRECT[func]
    compared = 0
    for dtype in (torch.float32, torch.int32, torch.bool):
        for args in _arg_sets(func, recipe, dtype):
            try:
                want = HANDLERS[func](*args)
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                continue  # not defined for this dtype: the next one
            runs = _C.dispatch_stats()[0]
            got = func(*args)
            assert _C.dispatch_stats()[0] == runs + 1, f"{func}: the recipe did not run for {args}"
            assert (got.shape, got.dtype) == (want.shape, want.dtype)
            assert got._lt.hash == want._lt.hash, f"{func}: recipe and handler build different graphs"
            assert got._lt.is_view == want._lt.is_view
            compared += 1
    assert compared, f"{func}: no sample arguments worked"


def test_calls_that_do_not_fit_reach_the_handler():
    x = torch.randn(4, device=DEV)
    runs, declines = _C.dispatch_stats()
    assert x.t()._lt.op == "alias"                    # t of a 1-D tensor: the handler's alias
    y = aten.add.Tensor(x, x, alpha=2)                # a kwarg: straight to the handler
    torch.testing.assert_close(y.cpu(), 3 * x.cpu())
    with pytest.raises(RuntimeError, match="mm: expected 2D tensors, got 1D and 1D"):
        aten.mm.default(x, x)                         # wrong ranks: the handler's error
    a, b = torch.ones(2, 2, device=DEV), torch.ones(2, 2, dtype=torch.float64, device=DEV)
    with pytest.raises(RuntimeError, match="mm: expected m1 and m2 to have the same dtype"):
        aten.mm.default(a, b)                         # the core refuses: the handler words the error
    assert _C.dispatch_stats()[1] == declines + 3     # t, mm, mm: tried and declined
    assert _C.dispatch_stats()[0] == runs


def test_view_recipe_shares_storage():
    x = torch.zeros(4, 4, device=DEV)
    x.view(16)[3] = 5.0                               # view via recipe, write through it
    x.t()[1, 0] = 7.0
    want = torch.zeros(4, 4)
    want.view(16)[3] = 5.0
    want.t()[1, 0] = 7.0
    torch.testing.assert_close(x.cpu(), want)


def test_handler_error_in_backward_reaches_the_caller(monkeypatch):
    """torch's Python device guard loses a pending exception while autograd
    unwinds; the handler's own error must still reach loss.backward()."""
    from torch_xla_core._tensor import HANDLERS

    def refuse(*args, **kwargs):
        raise NotImplementedError("sigmoid_backward: refused for this test")

    monkeypatch.setitem(HANDLERS, aten.sigmoid_backward.default, refuse)
    _C.dispatch_clear()
    try:
        x = torch.randn(3, device=DEV, requires_grad=True)
        with pytest.raises(NotImplementedError, match="sigmoid_backward: refused for this test"):
            torch.sigmoid(x).sum().backward()
    finally:
        monkeypatch.undo()
        _C.dispatch_clear()
    x = torch.randn(3, device=DEV, requires_grad=True)
    torch.sigmoid(x).sum().backward()                 # the real handler again
    torch.testing.assert_close(x.grad.cpu(), (torch.sigmoid(x.detach().cpu()) * (1 - torch.sigmoid(x.detach().cpu()))))
