"""Mappings (torch_xla_core._ops.mapping, csrc/py/mapping.cpp): an aten
overload declared once as one core op is run by the C++ dispatcher without
entering Python, computes what CPU eager computes, and is the same code when
called as a handler from Python; calls it does not fit reach the overload's
handler, refusals give torch's or the core's error."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core import _C, metrics
from torch_xla_core._ops import Arg, mapping
from torch_xla_core._ops import HANDLERS

aten = torch.ops.aten
DEV = txc.device()
MAPPINGS = sorted((f for f, h in HANDLERS.items() if isinstance(h, _C.Mapping)), key=str)
# Overloads whose mappings read attributes from args: the args to try.
_ATTR_ARGS = {
    aten.view.default: [[16], [2, -1], [4, 2, 2]],
    aten._unsafe_view.default: [[16], [2, 8]],
    aten.reshape.default: [[-1], [8, 2]],
    aten.sum.dim_IntList: [[0], [-1], [0, 1]],
}
_SHAPE = {aten.bmm.default: (2, 4, 4)}


def _tensor(func, dtype):
    t = torch.randn(_SHAPE.get(func, (4, 4))) * 3
    return t > 0 if dtype is torch.bool else t.to(dtype)


def _samples(func, dtype):
    """CPU argument lists for func following its schema: tensors, Python
    numbers for Scalar args, the listed values for attribute args."""
    numbers = [True] if dtype is torch.bool else [3, 2.5] if dtype.is_floating_point else [3]
    args = [a for a in func._schema.arguments if not a.kwarg_only and not a.has_default_value()]
    out = []
    for value in _ATTR_ARGS.get(func, [None]):
        for n in numbers:
            out.append([_tensor(func, dtype) if str(a.type) == "Tensor" else n if str(a.type) in ("Scalar", "number") else value
                        for a in args])
    return out


def _to_xla(args):
    return [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]


def test_elementwise_and_hot_ops_are_mappings():
    assert {aten.add.Tensor, aten.mul.Scalar, aten.neg.default, aten.mm.default, aten.view.default,
            aten.t.default, aten.sum.dim_IntList, aten.gelu.default} <= set(MAPPINGS)


@pytest.mark.parametrize("func", MAPPINGS, ids=str)
def test_mapping_runs_in_cpp_and_matches_cpu(func):
    m = HANDLERS[func]
    metrics.clear()
    compared = 0
    for dtype in (torch.float32, torch.int32, torch.bool):
        for args in _samples(func, dtype):
            try:
                want = func(*args).resolve_neg().resolve_conj()  # _neg_view/_conj: CPU's lazy bits, resolved
            except (RuntimeError, TypeError, ValueError, NotImplementedError):
                continue  # not defined for this dtype on CPU either
            runs = _C.dispatch_stats()[0]
            got = func(*_to_xla(args))
            assert _C.dispatch_stats()[0] == runs + 1, f"{func}: the mapping did not run for {args}"
            assert got._lt.op == m.op and got._lt.is_view == m.view
            assert (got.shape, got.dtype) == (want.shape, want.dtype)
            torch.testing.assert_close(got.cpu(), want, equal_nan=True, atol=1e-5, rtol=1e-5)
            compared += 1
    assert compared, f"{func}: no sample arguments worked"
    assert metrics.fallbacks() == {}


def test_mapping_called_from_python_is_the_dispatch_path():
    x, y = torch.randn(3, 4, device=DEV), torch.randn(3, 4, device=DEV)
    runs = _C.dispatch_stats()[0]
    a = HANDLERS[aten.add.Tensor](x, y)    # a handler call (as call() and in-place variants make)
    b = x + y                               # the dispatcher
    assert _C.dispatch_stats()[0] == runs + 2
    assert a._lt.hash == b._lt.hash and a._lt.op == "add"


def test_python_numbers_take_the_op_dtype_when_the_node_is_built():
    xi = torch.arange(3, dtype=torch.int32, device=DEV)
    f, i = xi + 2.5, xi + 2
    assert "scalar() {arg 0} : float32[]" in txc.debug.graph_text([f])   # OpDef::number_dtype, before hashing
    assert "scalar() {arg 0} : int32[]" in txc.debug.graph_text([i])
    assert (xi + 7.5)._lt.hash == f._lt.hash != i._lt.hash       # numbers are parameters: same graph
    torch.testing.assert_close(f.cpu(), torch.arange(3, dtype=torch.int32) + 2.5)
    torch.testing.assert_close(i.cpu(), torch.arange(3, dtype=torch.int32) + 2)


def test_calls_that_do_not_fit_reach_the_handler():
    x = torch.randn(4, device=DEV)
    runs, declines = _C.dispatch_stats()
    assert x.t()._lt.op == "alias"                    # t of a 1-D tensor: its handler makes an alias
    y = aten.add.Tensor(x, x, alpha=2)                # a keyword the mapping does not take: add's handler
    torch.testing.assert_close(y.cpu(), 3 * x.cpu())
    with pytest.raises(RuntimeError, match="mm: expected 2D tensors, got 1D and 1D"):
        aten.mm.default(x, x)                         # wrong ranks: the mapping's check words torch's error
    a, b = torch.ones(2, 2, device=DEV), torch.ones(2, 2, dtype=torch.float64, device=DEV)
    with pytest.raises(RuntimeError, match="mm: expected m1 and m2 to have the same dtype"):
        aten.mm.default(a, b)                         # the core refuses: the check words the error
    assert _C.dispatch_stats()[1] == declines + 3     # t, add, mm(1-D): declined
    assert _C.dispatch_stats()[0] == runs + 1         # the alias t's handler made


def test_core_refusal_raises_the_core_error():
    a, b = torch.ones(2, 3, device=DEV), torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError, match=r"add: shapes \[2, 3\] and \[4\] cannot be broadcast"):
        a + b


def test_a_mapping_that_does_not_cover_the_schema_is_refused():
    with pytest.raises(ValueError, match="argument 'dim' is neither an operand nor an attribute"):
        mapping(aten.sum.dim_IntList, op="sum", operands=(0,))
    with pytest.raises(ValueError, match="has no argument 'dims'"):
        mapping(aten.sum.dim_IntList, op="sum", attrs=(Arg("dims"),))
    assert isinstance(HANDLERS[aten.sum.dim_IntList], _C.Mapping)  # untouched


def test_view_mapping_shares_storage():
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
