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
import contextlib

import torch

from .. import _C
from .._tracing import random as _random, tensor as _tensor, trace_context as _trace_context
from .._runtime.dtypes import code
from .._tracing.tensor import OP
from . import scan_policy as _scan_policy
from .scan_trace import clear_cache, flat, get_plan, identity_key, unflat

__all__ = ["scan", "clear_cache"]


# --- running the loop (the body trace and the plan cache: scan_trace.py) -------

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


def scan_with_consts(fn, init, xs, consts, reverse, fn_key=None, policy="recompute"):
    """scan() with consts (a pytree of xla tensors, or None): fn(carry, x,
    consts), the same tensors every iteration, not sliced (the backward's
    vjp bodies: fn's consts; scan_layers: the layers' extra tensor
    arguments); fn_key: the plan-cache key of
    fn (None: scan_trace._fn_key's, from its code, closure and defaults)."""
    plan, caps, c_leaves, x_leaves, k_leaves, length = get_plan(fn, init, xs, consts, fn_key)
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
    return unflat(list(c_out), plan.c_spec), unflat(list(y_out), plan.y_spec)


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
    fn_key = identity_key(fn) if pure else None
    policy = _scan_policy.check_policy(policy, "scan")
    return scan_with_consts(fn, init, xs, None, reverse, fn_key=fn_key, policy=policy)


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
            info = _scan_policy.forward_body(plan, ctx.fn, pattern, policy, caps)
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
            (g_c0, acc_out), g_xs = scan_with_consts(vjp, (g_c, acc), bxs, list(k), not ctx.reverse,
                                                     fn_key=vjp.key)
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
                c = unflat(c_in, plan.c_spec)
                x = unflat(x_in, plan.x_spec)
                with hooks:
                    if plan.with_consts:
                        new_c, y = plan.fn(c, x, unflat(k_in, plan.k_spec))
                    else:
                        new_c, y = plan.fn(c, x)
            c_out = flat(new_c)[0]
            y_out = flat(y)[0]
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

    vjp.key = identity_key(vjp)
    plan.vjps[(pattern, policy)] = vjp
    return vjp
