"""torch.einsum of two xla tensors as ONE dot_general (the core `dot` op).

aten::einsum is CompositeImplicitAutograd: torch decomposes it above the
backend into permutes, reshapes that merge dims, and a bmm, so the graph
loses which input dim became which (XLA's SPMD partitioner cannot carry a
sharded dim through a merging reshape) and holds copies for the transposes.
torch_xla registers einsum on its autograd key for that reason; so do we
(AutogradPrivateUse1): a two-operand equation becomes

    sum over labels only one operand has and the output lacks   (torch.sum)
    dot_general(batch = labels in both and the output,
                contract = labels in both, not in the output)
    a permute to the output's label order

with a backward of two more einsums of the same kind (each again one
dot_general). Anything else — one or three+ operands, a label repeated
within an operand (a diagonal), ellipses of different shapes, size-1
broadcasting between operands, mixed dtypes — takes torch's own
decomposition, unchanged (and torch's error messages)."""
import string

import torch

from .._tracing import tensor as _tensor
from .._tracing.tensor import XlaTensor

aten = torch.ops.aten
_lib = torch.library.Library("aten", "IMPL")


def _parse(equation, a, b):
    """(la, lb, lo): label strings of a, b and the output with ellipses
    spelled out, or None when the fast path does not apply."""
    eq = equation.replace(" ", "")
    if "->" in eq:
        lhs, out = eq.split("->")
    else:
        lhs, out = eq, None
    ops = lhs.split(",")
    if len(ops) != 2:
        return None
    free = [c for c in string.ascii_letters if c not in eq]
    shapes = []
    for s, t in zip(ops, (a, b)):
        if "..." in s:
            n = t.dim() - (len(s) - 3)
            if n < 0:
                return None
            shapes.append(tuple(t.shape[s.index("..."):s.index("...") + n]))
        else:
            shapes.append(None)
    ell = [sh for sh in shapes if sh is not None]
    if ell and any(sh != ell[0] for sh in ell):
        return None
    ell_labels = "".join(free[:len(ell[0])]) if ell else ""
    la, lb = (s.replace("...", ell_labels) for s in ops)
    if len(la) != a.dim() or len(lb) != b.dim() or len(set(la)) != len(la) or len(set(lb)) != len(lb):
        return None
    if out is None:  # implicit output: ellipsis dims, then labels seen once, sorted
        once = sorted(c for c in set(la + lb) if (la + lb).count(c) == 1 and c not in ell_labels)
        lo = ell_labels + "".join(once)
    else:
        lo = out.replace("...", ell_labels)
    if len(set(lo)) != len(lo) or any(c not in la + lb for c in lo):
        return None
    for c in set(la) & set(lb):
        if a.shape[la.index(c)] != b.shape[lb.index(c)]:
            return None  # broadcasting of size-1 dims: torch's decomposition
    return la, lb, lo


def _dot_labels(la, lb, lo):
    """The label order of the dot node's result: batch, then a's free
    labels, then b's (dot_general's output order)."""
    batch = "".join(c for c in la if c in lb and c in lo)
    return batch + "".join(c for c in la if c not in lb) + "".join(c for c in lb if c not in la)


class _EinsumDot(torch.autograd.Function):
    """The dot node, in dot_general's label order `lr`. It returns a fresh
    tensor, never a view: the permute to the equation's order happens
    outside (a plain autograd view), so the result's views may be written
    in place as CPU's einsum result's may (a custom Function's view output
    may not)."""

    @staticmethod
    def forward(ctx, a, b, la, lb, lr):
        ctx.save_for_backward(a, b)
        ctx.labels = la, lb, lr
        batch = [c for c in la if c in lb and c in lr]
        contract = [c for c in la if c in lb and c not in lr]
        attrs = ([la.index(c) for c in batch], [lb.index(c) for c in batch],
                 [la.index(c) for c in contract], [lb.index(c) for c in contract])
        return _tensor.op("dot", a, b, attrs=attrs)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        la, lb, lr = ctx.labels
        ga = gb = None
        if ctx.needs_input_grad[0]:
            ga = torch.einsum(f"{lr},{lb}->{la}", g, b)
        if ctx.needs_input_grad[1]:
            gb = torch.einsum(f"{lr},{la}->{lb}", g, a)
        return ga, gb, None, None, None


def einsum(equation, tensors, *, path=None):
    if len(tensors) == 2 and all(type(t) is XlaTensor for t in tensors) and tensors[0].dtype == tensors[1].dtype \
            and tensors[0].dtype.is_floating_point:
        a, b = tensors
        p = _parse(equation, a, b)
        if p is not None:
            la, lb, lo = p
            lone_a = [i for i, c in enumerate(la) if c not in lb and c not in lo]
            lone_b = [i for i, c in enumerate(lb) if c not in la and c not in lo]
            if lone_a:
                a, la = a.sum(lone_a), "".join(c for i, c in enumerate(la) if i not in lone_a)
            if lone_b:
                b, lb = b.sum(lone_b), "".join(c for i, c in enumerate(lb) if i not in lone_b)
            lr = _dot_labels(la, lb, lo)
            r = _EinsumDot.apply(a, b, la, lb, lr)
            return r if lr == lo else r.permute([lr.index(c) for c in lo])
    return aten.einsum.default.decompose(equation, tensors, path=path)


_lib.impl("einsum", einsum, "AutogradPrivateUse1")
