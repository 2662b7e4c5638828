"""scan's body trace and plan cache (the loop and its autograd are
_ops/scan.py's; its docstring says when fn is traced again): fn traced once
on placeholder tensors (core op "placeholder") under a dispatch mode that
records the tensors fn reads from outside and rejects in-place writes to them
and host reads; the result is a plan (_Plan: the body graphs, the captured
tensors, the per-gradient-pattern backward functions), cached per fn
identity and the inputs' structure, shapes and dtypes. scan_policy.py traces
fn once more with the same helpers to find the residuals."""
import collections
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .. import _C, metrics
from .._tracing import checks as _checks, tensor as _tensor, trace_context as _trace_context
from .._runtime.dtypes import code
from .._tracing.tensor import OP, XlaTensor, xla_leaves

aten = torch.ops.aten
_CACHE = collections.OrderedDict()  # key -> _Plan
_CACHE_SIZE = 64


def clear_cache() -> None:
    """Forgets every traced body: the next call of each fn traces again."""
    _CACHE.clear()


# --- the body trace ------------------------------------------------------------

_HOST_OPS = {
    aten._local_scalar_dense.default: ".item() or a Python number from a tensor",
    aten.is_nonzero.default: "bool() of a tensor (`if tensor:`)",
    aten.equal.default: "torch.equal",
}


_host_error = _trace_context.host_error


_MUTATED = {}


def _mutated_args(func):
    m = _MUTATED.get(func)
    if m is None:
        m = [(i, a.name) for i, a in enumerate(func._schema.arguments)
             if a.alias_info is not None and a.alias_info.is_write]
        _MUTATED[func] = m
    return m


def flat(tree):
    """Leaves of a pytree without its Nones (torch's pytree treats None as a
    leaf; here it is an empty subtree), and the spec to rebuild it."""
    leaves, spec = pytree.tree_flatten(tree)
    mask = tuple(t is None for t in leaves)
    return [t for t in leaves if t is not None], (spec, mask)


def unflat(vals, spec_mask):
    spec, mask = spec_mask
    it = iter(vals)
    return pytree.tree_unflatten([None if m else next(it) for m in mask], spec)


def _paths(tree):
    """(path string, leaf) for the non-None leaves."""
    return [(pytree.keystr(p), t) for p, t in pytree.tree_flatten_with_path(tree)[0] if t is not None]


class BodyMode(TorchDispatchMode):
    """Watches every aten op while fn is traced: records the tensors fn reads
    from outside (the captures), rejects in-place writes to them and host
    reads."""

    def __init__(self):
        super().__init__()
        self.local = set()   # ids of tensors made inside fn, and fn's inputs
        self.keep = []       # ...kept alive while tracing so their ids stay unique
        self.caps = {}       # id -> tensor read from outside, in first-read order
        self.outer = set()   # storage ids of the captures

    def add_local(self, t):
        self.local.add(id(t))
        self.keep.append(t)

    def see_inputs(self, ts):
        for t in ts:
            i = id(t)
            if i not in self.local and i not in self.caps:
                self.caps[i] = t
                self.outer.add(t._lt.storage_id)

    def see_outputs(self, ts):
        for t in ts:
            i = id(t)
            if i not in self.local and i not in self.caps:
                self.add_local(t)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = _HOST_OPS.get(func)
        if what is not None:
            raise _host_error(what)
        self.see_inputs(xla_leaves((args, kwargs)))
        for i, name in _mutated_args(func):
            t = args[i] if i < len(args) else kwargs.get(name)
            if isinstance(t, XlaTensor) and t._lt.storage_id in self.outer:
                raise RuntimeError(
                    f"scan: fn writes in place ({func._schema.name}) to a tensor from outside fn "
                    f"({_desc(t)}). fn must not mutate tensors it closes over: it runs once per iteration inside "
                    f"one compiled loop. Return the new value as part of the carry instead.")
        out = func(*args, **kwargs)
        self.see_outputs(xla_leaves(out))
        return out


def _desc(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


class _Ref:
    """Identity check of an object without keeping it alive when possible."""
    __slots__ = ("w", "o")

    def __init__(self, obj):
        try:
            self.w, self.o = weakref.ref(obj), None
        except TypeError:
            self.w, self.o = None, obj

    def get(self):
        return self.w() if self.w is not None else self.o


def identity_key(fn):
    """A plan-cache key (as _fn_key's) that matches fn itself only, whatever
    its closure cells and defaults hold (scan's pure=True, the backward's
    vjp bodies, scan_layers' per-call functions)."""
    return (id(fn),), [_Ref(fn)], [fn]


class _Plan:
    """A traced fn: forward bodies (with and without the residuals autograd
    needs), the captured tensors, and the backward functions per gradient
    pattern."""

    def __init__(self, fn, with_consts, c_spec, c_meta, x_spec, x_meta, k_spec, k_meta):
        # fn is held only while it runs (trace, backward): the cache must not
        # keep alive what a per-call lambda closes over.
        self.fn, self.with_consts = fn, with_consts
        self.c_spec, self.c_meta = c_spec, c_meta
        self.x_spec, self.x_meta = x_spec, x_meta
        self.k_spec, self.k_meta = k_spec, k_meta
        self.nc, self.nx, self.nk = len(c_meta), len(x_meta), len(k_meta)
        self.vjps = {}
        self.refs = []

    def captures(self):
        """The captured tensors (current objects), or None if one died or
        changed shape/dtype."""
        out = []
        for w, meta in zip(self.cap_refs, self.cap_meta):
            t = w()
            if t is None or (tuple(t.shape), t.dtype) != meta:
                return None
            out.append(t)
        return out


def placeholders(plan):
    """A body's parameters for one trace of plan.fn: (P, the placeholder
    LazyTensors in order; the tensors fn sees for the carry, the RNG state,
    one slice of each x, the consts; the RNG placeholder)."""
    P = []

    def ph(meta):
        shape, dtype = meta
        lt = _C.placeholder(len(P), code(dtype), list(shape))
        P.append(lt)
        # fn gets a storage of its own (alias node, free when lowered), so an
        # in-place write in fn never changes the placeholder itself.
        return _tensor.wrap(_tensor.lazy_op(OP.alias, (lt,), ()))

    carry = [ph(m) for m in plan.c_meta]
    rng = ph(((2,), torch.int64))
    xs = [ph((shape[1:], dtype)) for shape, dtype in plan.x_meta]
    ks = [ph(m) for m in plan.k_meta]
    return P, carry, rng, xs, ks, P[plan.nc]


def _trace(plan):
    """Runs plan.fn once on placeholders; fills the plan's bodies."""
    P, carry, rng, xs, ks, rng_ph = placeholders(plan)
    mode = BodyMode()
    for t in carry + [rng] + xs + ks:
        mode.add_local(t)
    # An enclosing trace's mode must not see this body's ops: a nested
    # scan reports its operands and results to it as one op (scan.py's scan_with_consts).
    try:
        with _trace_context.body(mode, rng_ph) as trace, torch.no_grad(), _disable_current_modes(), mode, \
                _checks.suspended():
            c = unflat(carry, plan.c_spec)
            x = unflat(xs, plan.x_spec)
            if plan.with_consts:
                out = plan.fn(c, x, unflat(ks, plan.k_spec))
            else:
                out = plan.fn(c, x)
        _finish_trace(plan, mode, trace, rng_ph, P, out)
    except BaseException as e:
        discard_body_values(mode, P, e)
        raise


def discard_body_values(mode, P, exc):
    """After a failed trace: the placeholders and every tensor fn made from
    them now hold a failed value (raising, when used, what went wrong), so the
    pending graph keeps no trace of the body, whoever still holds those
    tensors (the exception's traceback holds fn's frames and their locals).
    Views of tensors from outside fn are left alone."""
    lts = [t._lt for t in mode.keep if t._lt.storage_id not in mode.outer]
    try:
        body = list(P) + [lt for lt, d in zip(lts, _C.depends_on(lts, P)) if d]
        if body:
            cut = _C.GraphCut(body)
            cut.poison(list(range(cut.num_roots)), f"scan: this tensor was computed inside a scan body whose "
                       f"trace raised {type(exc).__name__}: {exc}; it has no value")
    except RuntimeError:  # a value already failed: it raises its own error when used
        pass


def _finish_trace(plan, mode, trace, rng_ph, P, out):
    """Checks fn's results and builds the plan's bodies from them."""
    rng_out = trace.rng_state
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"scan: fn must return a pair (carry, y), got {type(out).__name__}")
    new_c, y = out
    c_out = _check_carry(plan, new_c)
    y_leaves, plan.y_spec = flat(y)
    for path, t in _paths(y):
        if not isinstance(t, XlaTensor):
            raise TypeError(f"scan: fn returned {type(t).__name__} at y{path}; every leaf of y "
                            f"must be a tensor on the xla device")
    plan.y_meta = [(tuple(t.shape), t.dtype) for t in y_leaves]
    plan.ny = len(y_leaves)
    plan.rng_used = rng_out is not rng_ph
    caps = list(mode.caps.values())
    if caps:  # tensors made from fn's inputs where the tracer could not watch are body values
        dep = _C.depends_on([t._lt for t in caps], P)
        caps = [t for t, d in zip(caps, dep) if not d]
    plan.first_caps = caps  # this call's captures (weakly held afterwards: see captures())
    plan.cap_refs = [weakref.ref(t) for t in caps]
    plan.cap_meta = [(tuple(t.shape), t.dtype) for t in caps]
    cap_lts = [t._lt for t in caps]
    outs = [t._lt for t in c_out] + [rng_out] + [t._lt for t in y_leaves]
    plan.body = _C.build_body(P, outs, cap_lts)
    plan.body_res = _C.build_body(P, outs + P[:plan.nc] + ([rng_ph] if plan.rng_used else []), cap_lts)
    metrics.counter_add("scan_trace")


def _check_carry(plan, new_c):
    leaves, spec = flat(new_c)
    if spec != plan.c_spec:
        raise TypeError(f"scan: fn changed the structure of the carry: init is {plan.c_spec[0]}, fn returned "
                        f"{spec[0]}; the carry must keep its structure, shapes and dtypes")
    paths = [p for p, _ in _paths(new_c)]
    for path, t, (shape, dtype) in zip(paths, leaves, plan.c_meta):
        if not isinstance(t, XlaTensor):
            raise TypeError(f"scan: fn returned {type(t).__name__} as carry{path}; carry leaves must be tensors on "
                            f"the xla device")
        if tuple(t.shape) != shape or t.dtype != dtype:
            raise TypeError(f"scan: fn changed carry{path} from {_desc_meta(shape, dtype)} (init) to {_desc(t)}; "
                            f"the carry must keep its shapes and dtypes across iterations")
    return leaves


def _desc_meta(shape, dtype):
    return f"{str(dtype).replace('torch.', '')}{list(shape)}"


# --- the plan cache ------------------------------------------------------------

def _fn_key(fn):
    """(hashable key, refs to verify by identity) for a function."""
    if isinstance(fn, types.FunctionType):
        objs = [fn.__code__]
        for c in fn.__closure__ or ():
            try:
                objs.append(c.cell_contents)
            except ValueError:  # an empty cell
                objs.append(None)
        objs.extend(fn.__defaults__ or ())
        objs.extend((fn.__kwdefaults__ or {}).values())
    elif isinstance(fn, types.MethodType):
        objs = [fn.__func__, fn.__self__]
    else:
        objs = [fn]
    return tuple(id(o) for o in objs), [_Ref(o) for o in objs], objs


def _meta(leaves, what, spec_tree):
    out = []
    for path, t in _paths(spec_tree):
        if not isinstance(t, XlaTensor):
            kind = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            hint = " (move it with .to('xla'))" if isinstance(t, torch.Tensor) else ""
            raise TypeError(f"scan: {what}{path} is {kind}; {what} leaves must be tensors on the "
                            f"xla device{hint}")
        out.append((tuple(t.shape), t.dtype))
    return out


def get_plan(fn, init, xs, consts, fn_key):
    c_leaves, c_spec = flat(init)
    x_leaves, x_spec = flat(xs)
    k_leaves, k_spec = flat(consts)
    c_meta = _meta(c_leaves, "init", init)
    x_meta = _meta(x_leaves, "xs", xs)
    k_meta = _meta(k_leaves, "consts", consts)
    if not x_leaves:
        raise ValueError("scan: xs is empty (it has no tensors); scan needs at least one tensor to iterate over "
                         "(every leaf of xs is sliced along dim 0)")
    paths = [p for p, _ in _paths(xs)]
    for path, (shape, _) in zip(paths, x_meta):
        if len(shape) == 0:
            raise ValueError(f"scan: xs{path} is 0-d; every leaf of xs needs a leading dim to iterate over")
    length = x_meta[0][0][0]
    for path, (shape, _) in zip(paths, x_meta):
        if shape[0] != length:
            raise ValueError(f"scan: xs leaves have different lengths along dim 0: xs{paths[0]} has {length}, "
                             f"xs{path} has {shape[0]}")
    if length == 0:
        raise ValueError(f"scan: xs is empty (length 0 along dim 0, xs{paths[0]} has shape "
                         f"{list(x_meta[0][0])}); scan needs at least one iteration")
    if fn_key is None:
        fn_key = _fn_key(fn)
    key_ids, refs, objs = fn_key
    key = (key_ids, c_spec, tuple(c_meta), x_spec, tuple(x_meta), k_spec, tuple(k_meta), consts is not None)
    plan = _CACHE.get(key)
    if plan is not None:
        caps = plan.captures() if all(r.get() is o for r, o in zip(plan.refs, objs)) else None
        if caps is not None:
            _CACHE.move_to_end(key)
            metrics.counter_add("scan_trace_hit")
            return plan, caps, c_leaves, x_leaves, k_leaves, length
        del _CACHE[key]
    plan = _Plan(fn, consts is not None, c_spec, c_meta, x_spec, x_meta, k_spec, k_meta)
    plan.refs = refs
    try:
        _trace(plan)
    finally:
        plan.fn = None
    _CACHE[key] = plan
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    caps, plan.first_caps = plan.first_caps, None
    return plan, caps, c_leaves, x_leaves, k_leaves, length
