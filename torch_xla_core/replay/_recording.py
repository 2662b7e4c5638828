"""What a txc.compile recording holds (Recording) and the helpers around
it: which device buffer holds an input's value (buffer, root_buffer), a lone
view given a storage of its own (own_storage), a pending number made the
buffer of that number (number_to_data), and a step's return value taken
apart into tensors (flatten) and made again from a replay's outputs
(returned)."""
import torch

from .. import _C
from .._execution import executor
from .._runtime import runtime
from .._tracing import tensor as _tensor
from ._session import Refused
from ._walk import SCALARS

_ALIAS, _FULL = _C.op_ids()["alias"], _C.op_ids()["full"]


def number_to_data(lt) -> bool:
    """A pending 0-d value made from one number alone (an lr that a scheduler
    filled, autograd's seed of a loss) becomes the device buffer of that
    number (runtime.scalar's, kept per value and never donated): no launch,
    and the value is not part of any graph or guard. False: lt is
    something else."""
    c = lt.constant
    if c is None or c[0] != _FULL or lt.shape or executor.multi_device():  # (one device: the number's buffer is on xla:0)
        return False
    attrs = c[1]
    value = complex(attrs[0], attrs[3]) if len(attrs) > 3 else attrs[0]
    lt.assign(_C.from_data(runtime.scalar(value, lt.dtype), lt.dtype, []))
    return True


def buffer(t):
    """The device buffer holding t's value, or None (pending, or a view that
    is not just an alias of its whole storage, like x.detach())."""
    lt = t._lt
    if lt.is_data:
        return lt.data
    if lt.is_view and _alias_only(lt):
        r = lt.root()
        return r.data if r.is_data else None
    return None


def root_buffer(t):
    """The device buffer of t's storage (t's own, or for a view its root's),
    or None while that is pending."""
    lt = t._lt
    if lt.is_data:
        return lt.data
    if lt.is_view:
        r = lt.root()
        return r.data if r.is_data else None
    return None


def _alias_only(lt) -> bool:
    return all(op == "alias" for op in lt.view_ops) and lt.shape == lt.root().shape


def own_storage(t) -> bool:
    """Makes a view tensor hold its value in a storage of its own, when no
    other tensor shares its storage (then nobody can tell): autograd's grads
    and Module.to's parameters are such views. An alias of a whole storage
    that others share (x.detach()) is left as it is: it reads and writes
    that storage. False when neither is safe."""
    lt = t._lt
    if not lt.is_view:
        return True
    if lt.storage_refs != 1 or not t.is_contiguous():
        return _alias_only(lt)
    t._lt = _tensor.lazy_op(_ALIAS, (lt,), ())
    return True


class Recording:
    """One recorded path of a step: its segments (syncs) and the values it
    read between them, the LR schedulers stepped after it, the input slots
    its segments donate, the last segment's executable that takes the old
    grads donated (grad_exe: its Future, or None), where each output goes
    (plan, inplace, specs), what it returns (ret; flat: a flat tuple or list
    of tensors), which outputs are the RNG state and the deferred checks,
    and how its replay may take part in a fused launch (fuse: None, "join":
    run fused with the launch left pending before it, "defer": also leave
    its own pending; _execution/pending.py)."""
    __slots__ = ("segments", "reads", "schedulers", "donated", "trailing_guard", "inplace", "ret", "flat",
                 "rng_out", "checks", "specs", "plan", "grad_exe", "fuse")


def flatten(out, leaves):
    """out's structure with tensors replaced by ("T", index into leaves)."""
    if isinstance(out, torch.Tensor):
        leaves.append(out)
        return ("T", len(leaves) - 1)
    if isinstance(out, (tuple, list)):
        return (type(out), [flatten(x, leaves) for x in out])
    if isinstance(out, dict):
        return (dict, [(k, flatten(x, leaves)) for k, x in out.items()])
    if isinstance(out, SCALARS):
        return ("V", out)
    raise Refused(f"it returned a {type(out).__name__}; return tensors, numbers and containers of them")


def _unflatten(tpl, leaves, results):
    tag, v = tpl
    if tag == "T":
        return leaves[v]
    if tag == "V":
        return v
    if tag == "R":  # a value read on the host and returned (return loss.item())
        return v[1](results[v[0]])
    if tag is dict:
        return {k: _unflatten(x, leaves, results) for k, x in v}
    seq = [_unflatten(x, leaves, results) for x in v]
    return tag(seq) if tag is not list else seq


def returned(rec, tensors, outs, results):
    """What a recorded step returns, made from its outputs' buffers and its
    inputs (the recording call returns the same, so that the tensors it
    returns look as those of later calls do: detached, the same views): the
    tensors in one C++ call (ReplayPlan.returned, csrc/py/replay.cpp), put
    in the step's structure."""
    leaves = rec.plan.returned(tensors, outs)
    tpl = rec.ret[0]
    flat = rec.flat
    if flat is not None:  # a flat tuple or list of tensors (a dynamo graph's outputs)
        return leaves if flat is list else tuple(leaves)
    return _unflatten(tpl, leaves, results)


def flat_kind(tpl):
    """tuple or list when a step's return template is a flat tuple or list
    of its tensors in order (returned() then skips _unflatten), else None."""
    tag, v = tpl
    if tag in (tuple, list) and all(x[0] == "T" and x[1] == j for j, x in enumerate(v)):
        return tag
    return None
