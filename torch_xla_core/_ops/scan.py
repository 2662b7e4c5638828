"""The scan operator (public as torch_xla_core.scan.scan, with scan_layers
and scan_decoder_layers built on it in the features layer): run a function
over the slices of stacked inputs as ONE loop in the graph, so that compile
time does not grow with the number of iterations (layers). It is a control
flow op, as lax.scan is in JAX: ops (ctc_loss) and features build on it.

    from torch_xla_core.scan import scan, scan_layers
    carry, ys = scan(fn, init, xs)      # fn(carry, x) -> (carry, y); pytrees of xla tensors
    x = scan_layers(model.layers, x)    # instead of: for layer in model.layers: x = layer(x)

How it works. `fn` is traced ONCE, by our own lazy tracing, on placeholder
tensors (core op "placeholder"): the result is a body graph of ordinary core
ops (a `Body`, csrc/ops/scan.cpp), which a "scan" node runs as one
`stablehlo.while` (xs[i] by dynamic_slice, ys[i] by dynamic_update_slice).
Tensors fn reads from outside (weights, masks) are loop-invariant operands of
that node, not copies per iteration. Random ops inside fn draw from the
device RNG state, which the loop threads through its carry: each iteration
draws different numbers, reproducibly per seed.

Autograd: the loop is one torch.autograd.Function. Its forward also stacks
each iteration's input carry (and RNG state); its backward is another scan,
in the opposite direction, of fn's vector-Jacobian product (traced once the
same way: fn re-run on placeholders that require grad, then
torch.autograd.grad), so the backward is one loop too. It recomputes each
iteration's forward from the saved carry (like per-layer activation
checkpointing) and accumulates the gradients of closed-over tensors (layer
weights) in its carry. policy="save" / "offload" instead keep fn's residuals
stacked (on the device / in host memory) so the backward does not recompute
the forward: torch_xla_core/_ops/scan_policy.py.

When fn is traced again. A traced body is reused when
  * fn is the same function: the same code object with the same objects in
    its closure cells and defaults (compared by identity), or the same bound
    method of the same object, or the same callable object; and
  * init, xs (and for scan_layers the extra inputs) have the same pytree
    structure, shapes, dtypes; and
  * every tensor fn read from outside during the trace is still alive and has
    the same shape and dtype.
The reused body then reads the CURRENT values of those same tensor objects
(so optimizer updates are seen without re-tracing). Everything else about
fn is frozen at the first trace, as with jax.jit: Python numbers and flags
fn reads (e.g. `self.training`, a global float), and tensors fn reaches
through a global variable or an attribute that you re-bind to a different
tensor object while the old one stays alive elsewhere. After changing such
state, call `clear_cache()` (scan_layers keys on the modules' `training`
flags itself). `metrics.counters()` counts "scan_trace" (bodies traced) and
"scan_trace_hit" (reuses).

Errors are raised before anything compiles, naming what is wrong: xs leaves
of different lengths, empty xs, a carry whose structure, shape or dtype
changes, in-place writes to a tensor from outside fn, and host reads inside
fn (.item(), .tolist(), .cpu(), print, `if tensor:`): fn is traced on
symbolic values, so data-dependent Python control flow cannot work; use
tensor ops (torch.where) instead. In-place writes to fn's own inputs (the
carry, x) are allowed: they are fresh each iteration and never reach
init/xs. Double backward through scan is not supported.
"""
import collections
import contextlib
import sys
import types
import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .. import _C, metrics
from .._tracing import checks as _checks, random as _random, tensor as _tensor, trace_context as _trace_context
from .._runtime.dtypes import code
from .._tracing.tensor import OP, XlaTensor, xla_leaves
from . import scan_policy as _scan_policy

__all__ = ["scan", "clear_cache"]

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


def _flat(tree):
    """Leaves of a pytree without its Nones (torch's pytree treats None as a
    leaf; here it is an empty subtree), and the spec to rebuild it."""
    leaves, spec = pytree.tree_flatten(tree)
    mask = tuple(t is None for t in leaves)
    return [t for t in leaves if t is not None], (spec, mask)


def _unflat(vals, spec_mask):
    spec, mask = spec_mask
    it = iter(vals)
    return pytree.tree_unflatten([None if m else next(it) for m in mask], spec)


def _paths(tree):
    """(path string, leaf) for the non-None leaves."""
    return [(pytree.keystr(p), t) for p, t in pytree.tree_flatten_with_path(tree)[0] if t is not None]


class _BodyMode(TorchDispatchMode):
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


def _placeholders(plan):
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
    P, carry, rng, xs, ks, rng_ph = _placeholders(plan)
    mode = _BodyMode()
    for t in carry + [rng] + xs + ks:
        mode.add_local(t)
    # An enclosing trace's mode must not see this body's ops: a nested
    # scan reports its operands and results to it as one op (see _scan).
    try:
        with _trace_context.body(mode, rng_ph) as trace, torch.no_grad(), _disable_current_modes(), mode, \
                _checks.suspended():
            c = _unflat(carry, plan.c_spec)
            x = _unflat(xs, plan.x_spec)
            if plan.with_consts:
                out = plan.fn(c, x, _unflat(ks, plan.k_spec))
            else:
                out = plan.fn(c, x)
        _finish_trace(plan, mode, trace, rng_ph, P, out)
    except BaseException as e:
        _discard_body_values(mode, P, e)
        raise


def _discard_body_values(mode, P, exc):
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
    y_leaves, plan.y_spec = _flat(y)
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
    leaves, spec = _flat(new_c)
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


# --- running the loop ----------------------------------------------------------

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


def _get_plan(fn, init, xs, consts, fn_key):
    c_leaves, c_spec = _flat(init)
    x_leaves, x_spec = _flat(xs)
    k_leaves, k_spec = _flat(consts)
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


def _rng_in(plan):
    if plan.rng_used:
        return _random.state()  # the current state (the device state moves on; we set it after the loop)
    return _tensor.lazy_op(OP.full, (), (0.0, code(torch.int64), [2]))


def _loop(plan, body, c_leaves, x_leaves, k_leaves, caps, length, reverse):
    """Builds the loop node; returns its results as xla tensors, and sets the
    RNG state to the loop's final one."""
    operands = [t._lt for t in c_leaves] + [_rng_in(plan)] + [t._lt for t in x_leaves] + \
               [t._lt for t in k_leaves] + [t._lt for t in caps]
    res = _C.scan_loop(body, operands, plan.nc + 1, plan.nx, length, reverse)
    if plan.rng_used:
        _random.set_state(res[plan.nc])
    return [_tensor.wrap(r) for r in res]


def _scan(fn, init, xs, consts, reverse, fn_key=None, policy="recompute"):
    plan, caps, c_leaves, x_leaves, k_leaves, length = _get_plan(fn, init, xs, consts, fn_key)
    nc, ny = plan.nc, plan.ny
    need_grad = torch.is_grad_enabled() and any(
        t.requires_grad for t in (*c_leaves, *x_leaves, *k_leaves, *caps))
    if need_grad:
        outs = _ScanFn.apply((plan, fn, policy), length, bool(reverse), *c_leaves, *x_leaves, *k_leaves, *caps)
        c_out, y_out = outs[:nc], outs[nc:]
    else:
        res = _loop(plan, plan.body, c_leaves, x_leaves, k_leaves, caps, length, bool(reverse))
        c_out, y_out = res[:nc], res[nc + 1:nc + 1 + ny]
    trace = _trace_context.current()
    if trace is not None:  # scan inside an enclosing fn being traced: one op to that trace
        trace.mode.see_inputs([*c_leaves, *x_leaves, *k_leaves, *caps])
        trace.mode.see_outputs([*c_out, *y_out])
    return _unflat(list(c_out), plan.c_spec), _unflat(list(y_out), plan.y_spec)


def scan(fn, init, xs, reverse=False, policy="recompute", pure=False):
    """Runs fn over the slices of xs along dim 0, threading a carry:

        carry = init
        for i in range(len(xs)):             # reversed(range(...)) with reverse=True
            carry, ys[i] = fn(carry, xs[i])
        return carry, stack(ys)

    init, xs and fn's results are pytrees of xla tensors (every leaf of xs is
    sliced; all have the same length). fn is traced once into a body that
    compiles as one loop; see the module docstring for when it is traced
    again and what fn may not do. Differentiable w.r.t. init, xs and the
    tensors fn closes over. policy: what the forward keeps for the backward,
    "recompute" (each iteration's input carry; the backward re-runs fn),
    "save" (also fn's residuals, stacked) or "offload" (those stacked in host
    memory); see torch_xla_core/_ops/scan_policy.py. pure=True (torch_xla's
    is_fn_pure): a trace is reused whenever fn is the same object, whatever
    its closure cells and defaults hold now (you promise fn does not depend
    on them)."""
    fn_key = ((id(fn),), [_Ref(fn)], [fn]) if pure else None
    return _scan(fn, init, xs, None, reverse, fn_key=fn_key, policy=_scan_policy.check_policy(policy, "scan"))


# --- autograd ------------------------------------------------------------------

def _floating(dtype):
    return dtype.is_floating_point or dtype.is_complex


class _ScanFn(torch.autograd.Function):
    """The loop as one autograd node. Inputs: init leaves, xs leaves, consts
    leaves, captured tensors. Outputs: final carry leaves, then ys leaves."""

    @staticmethod
    def forward(ctx, plan_fn, length, reverse, *flat):
        plan, ctx.fn, policy = plan_fn
        nc, nx, nk, ny = plan.nc, plan.nx, plan.nk, plan.ny
        c, x, k, caps = flat[:nc], flat[nc:nc + nx], flat[nc + nx:nc + nx + nk], flat[nc + nx + nk:]
        body, ctx.n_res = plan.body_res, 0
        if policy != "recompute":
            pattern = _scan_policy.pattern_of(plan, ctx.needs_input_grad[3:], len(caps))
            info = _scan_policy.forward_body(sys.modules[__name__], plan, ctx.fn, pattern, policy, caps)
            body, ctx.n_res = info.body, info.n
        res = _loop(plan, body, c, x, k, caps, length, reverse)
        outs = res[:nc] + res[nc + 1:nc + 1 + ny]
        resid = res[nc + 1 + ny:]  # stacked carries (nc), stacked RNG states (0 or 1), residuals (n_res)
        ctx.plan, ctx.length, ctx.reverse, ctx.policy = plan, length, reverse, policy
        ctx.save_for_backward(*x, *k, *caps, *resid)
        ctx.mark_non_differentiable(*[o for o in outs if not _floating(o.dtype)])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        plan = ctx.plan
        nc, nx, nk, ny = plan.nc, plan.nx, plan.nk, plan.ny
        saved = ctx.saved_tensors
        nr = 1 if plan.rng_used else 0
        ncap = len(saved) - nx - nk - nc - nr - ctx.n_res
        x = saved[:nx]
        k = saved[nx:nx + nk]
        caps = saved[nx + nk:nx + nk + ncap]
        resid = saved[nx + nk + ncap:]
        need = ctx.needs_input_grad[3:]
        need_c = need[:nc]
        need_x = tuple(i for i in range(nx) if need[nc + i])
        need_k = tuple(i for i in range(nk) if need[nc + nx + i])
        need_cap = tuple(i for i in range(ncap) if need[nc + nx + nk + i])
        fc = tuple(i for i in range(nc) if _floating(plan.c_meta[i][1]))
        fy = tuple(j for j in range(ny) if _floating(plan.y_meta[j][1]))
        vjp = _vjp_fn(plan, fc, fy, need_x, need_k, need_cap, ctx.policy)
        g_c = [_zeros(grads[i], plan.c_meta[i]) for i in fc]
        acc = [torch.zeros_like(k[i]) for i in need_k] + [torch.zeros_like(caps[i]) for i in need_cap]
        g_y = [_zeros(grads[nc + j], ((ctx.length,) + plan.y_meta[j][0], plan.y_meta[j][1])) for j in fy]
        bxs = (list(x), list(resid[:nc]), g_y, list(resid[nc:nc + nr]), list(resid[nc + nr:]))
        plan.bwd_caps, plan.fn = caps, ctx.fn
        try:
            (g_c0, acc_out), g_xs = _scan(vjp, (g_c, acc), bxs, list(k), not ctx.reverse, fn_key=vjp.key)
        finally:
            plan.bwd_caps = plan.fn = None
        out = [None] * (nc + nx + nk + ncap)
        for pos, i in enumerate(fc):
            if need_c[i]:
                out[i] = g_c0[pos]
        for pos, i in enumerate(need_x):
            out[nc + i] = g_xs[pos]
        for pos, i in enumerate(need_k):
            out[nc + nx + i] = acc_out[pos]
        for pos, i in enumerate(need_cap):
            out[nc + nx + nk + i] = acc_out[len(need_k) + pos]
        return (None, None, None, *out)


def _zeros(g, meta):
    if g is not None:
        return g
    shape, dtype = meta
    return torch.zeros(shape, dtype=dtype, device=_tensor.DEVICE)


def _vjp_fn(plan, fc, fy, need_x, need_k, need_cap, policy="recompute"):
    """fn's vector-Jacobian product as a scan body (cached per pattern and
    policy): carry (g_carry, accumulated invariant grads), x (x_i, carry_i,
    g_y_i, rng_i, residuals_i), consts (fn's consts) -> (g_carry_in,
    accumulators), g_x_i. With a residual policy, fn's saved tensors are the
    residual slices (_scan_policy.ResidualHooks)."""
    pattern = (fc, fy, need_x, need_k, need_cap)
    f = plan.vjps.get((pattern, policy))
    if f is not None:
        return f
    fc_set, nx_set, nk_set = set(fc), set(need_x), set(need_k)

    def vjp(bc, bx, ks):
        g_c, acc = bc
        x_l, c_l, gy_l, r_l, res_l = bx
        caps = plan.bwd_caps  # the captures of the forward being differentiated
        hooks = contextlib.nullcontext()
        if policy != "recompute":
            c_l = _scan_policy.carry_in(c_l, policy)
            hooks = _scan_policy.ResidualHooks(plan.residuals[(pattern, policy)], res_l, policy, plan.fn)
        with torch.enable_grad():
            c_in = [t.requires_grad_() if i in fc_set else t for i, t in enumerate(c_l)]
            x_in = [t.requires_grad_() if i in nx_set else t for i, t in enumerate(x_l)]
            k_in = [t.requires_grad_() if i in nk_set else t for i, t in enumerate(ks)]
            # the same draws as this iteration's forward
            with _random.replaying(r_l[0]._lt) if plan.rng_used else contextlib.nullcontext():
                c = _unflat(c_in, plan.c_spec)
                x = _unflat(x_in, plan.x_spec)
                with hooks:
                    if plan.with_consts:
                        new_c, y = plan.fn(c, x, _unflat(k_in, plan.k_spec))
                    else:
                        new_c, y = plan.fn(c, x)
            c_out = _flat(new_c)[0]
            y_out = _flat(y)[0]
            outs, gouts = [], []
            for pos, i in enumerate(fc):
                if c_out[i].requires_grad:
                    outs.append(c_out[i])
                    gouts.append(g_c[pos])
            for pos, j in enumerate(fy):
                if y_out[j].requires_grad:
                    outs.append(y_out[j])
                    gouts.append(gy_l[pos])
            inputs = [c_in[i] for i in fc] + [x_in[i] for i in need_x] + [k_in[i] for i in need_k] + \
                     [caps[i] for i in need_cap]
            gs = torch.autograd.grad(outs, inputs, gouts, allow_unused=True) if outs else [None] * len(inputs)
            if policy != "recompute":
                hooks.close()
            gs = [g if g is not None else torch.zeros_like(t) for g, t in zip(gs, inputs)]
        n1, n2 = len(fc), len(need_x)
        acc_new = [a + g for a, g in zip(acc, gs[n1 + n2:])]
        return ([g.detach() for g in gs[:n1]], acc_new), [g.detach() for g in gs[n1:n1 + n2]]

    vjp.key = ((id(vjp),), [_Ref(vjp)], [vjp])
    plan.vjps[(pattern, policy)] = vjp
    return vjp
