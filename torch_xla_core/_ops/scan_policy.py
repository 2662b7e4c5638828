"""Scan policies: what a differentiated scan keeps from its forward loop for
the backward loop (torch_xla_core/_ops/scan.py calls in here).

  "recompute" (default): the forward stacks each iteration's input carry; the
      backward body re-runs fn from it and differentiates (per-iteration
      activation checkpointing: least memory, most compute).
  "save": the forward loop also stacks the residuals, the tensors autograd
      saves inside fn (what fn's backward formulas read), as extra stacked
      outputs; the backward body reads them instead of recomputing the
      forward (the recomputation is dead code, so it is not in the body).
  "offload": as "save", with the stacked residuals (and carries) placed in
      host memory (csrc/ops/placement.cpp) by the forward body and each
      iteration's slice brought back to the device in the backward body.

How residuals are found: fn is traced once more on placeholders, with grad
enabled as the backward's pattern needs (which inputs require grad), inside
torch.autograd.graph.saved_tensors_hooks that record every saved tensor. The
ones computed inside fn become extra body outputs; fn's own inputs and
tensors from outside fn are not stacked. The backward's re-run of fn installs
hooks that hand autograd the k-th residual slice in place of the k-th saved
tensor. Both traces see the same saves in the same order (fn is traced, so
its Python runs the same way); a mismatch raises an error naming fn.
This module adds IR (body outputs, placement nodes) only: the loops are
_ops/scan.py's.
"""
import torch
from torch.utils._python_dispatch import _disable_current_modes

from .. import _C
from .._tracing import checks as _checks, trace_context as _trace_context, tensor as _tensor
from .._runtime import runtime
from .._tracing.tensor import OP, XlaTensor
from . import scan_trace as _scan_trace

POLICIES = ("recompute", "save", "offload")
_HOST, _DEVICE = "pinned_host", "device"


def check_policy(policy, where: str) -> str:
    if policy not in POLICIES:
        raise ValueError(f"{where}: unknown policy {policy!r}; use 'recompute' (recompute each iteration's forward "
                         f"in the backward), 'save' (keep its residuals stacked on the device) or 'offload' (keep "
                         f"them stacked in host memory)")
    if policy == "offload":
        runtime.require_memory_kind(_HOST, "torch_xla_core.offload")
    return policy


def _place(lt, kind):
    return _tensor.lazy_op(OP.place, (lt,), (kind,))


class Residuals:
    """A forward body with residuals for one (gradient pattern, policy):
    body outputs = fn's (carry, rng, y), then the stacked input carries, the
    RNG state (if fn draws), then the residuals. slots[k] says what the k-th
    tensor autograd saved inside fn is: ("res", j), or None (fn's own input or
    a tensor from outside fn: the backward's re-run has it already)."""

    def __init__(self, body, slots, metas):
        self.body, self.slots, self.metas = body, slots, metas
        self.n = len(metas)


def forward_body(plan, fn, pattern, policy, caps) -> Residuals:
    """The forward body of `plan` that also stacks residuals (cached per
    pattern and policy on the plan), traced with scan_trace.py's helpers;
    caps: the captured tensors of this call."""
    cache = plan.__dict__.setdefault("residuals", {})
    r = cache.get((pattern, policy))
    if r is not None:
        return r
    fc, _fy, need_x, need_k, _need_cap = pattern
    P, carry, rng, xs, ks, rng_ph = _scan_trace.placeholders(plan)
    for i in fc:
        carry[i].requires_grad_()
    for i in need_x:
        xs[i].requires_grad_()
    for i in need_k:
        ks[i].requires_grad_()
    mode = _scan_trace.BodyMode()
    for t in carry + [rng] + xs + ks:
        mode.add_local(t)
    rec = []

    def pack(t):  # autograd keeps only the index: no cycle through the saved output (freed with the trace)
        rec.append(t)
        return len(rec) - 1

    try:
        with _trace_context.body(mode, rng_ph) as trace, torch.enable_grad(), _disable_current_modes(), mode, \
                _checks.suspended(), torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked):
            c = _scan_trace.unflat(carry, plan.c_spec)
            x = _scan_trace.unflat(xs, plan.x_spec)
            out = fn(c, x, _scan_trace.unflat(ks, plan.k_spec)) if plan.with_consts else fn(c, x)
        rng_out = trace.rng_state
    except BaseException as e:
        _scan_trace.discard_body_values(mode, P, e)
        raise
    finally:
        # autograd's saved variables hold the hooks (C++ references that Python's gc cannot see through):
        # empty the list pack() closes over, so the trace's tensors are freed with it
        saved = list(rec)
        rec.clear()
    new_c, y = out
    c_out = _scan_trace.flat(new_c)[0]
    y_out = _scan_trace.flat(y)[0]
    inputs = {id(t) for t in carry + xs + ks}
    cand = [t for t in saved if isinstance(t, XlaTensor) and id(t) not in inputs]
    dep = _C.depends_on([t._lt for t in cand], P) if cand else []
    inner = {id(t) for t, d in zip(cand, dep) if d}
    slots, res, index = [], [], {}
    for t in saved:
        if id(t) not in inner:
            slots.append(None)
            continue
        j = index.get(id(t))
        if j is None:
            j = index[id(t)] = len(res)
            res.append(t)
        slots.append(("res", j))
    kind = _HOST if policy == "offload" else None
    keep = [t._lt for t in c_out] + [rng_out] + [t._lt for t in y_out]
    extra = list(P[:plan.nc]) + ([rng_ph] if plan.rng_used else [])
    stacked = [_place(lt, kind) if kind else lt for lt in extra[:plan.nc]] + extra[plan.nc:] + \
              [_place(t._lt, kind) if kind else t._lt for t in res]
    body = _C.build_body(P, keep + stacked, [t._lt for t in caps])
    r = Residuals(body, slots, [(tuple(t.shape), t.dtype) for t in res])
    cache[(pattern, policy)] = r
    return r


def _never_unpacked(i):
    raise RuntimeError("scan: the residual trace's autograd graph is never run backward")


def pattern_of(plan, need, ncap):
    """The gradient pattern (as scan.py's backward computes it) from
    needs_input_grad of the loop's inputs (init, xs, consts, captures)."""
    nc, nx, nk = plan.nc, plan.nx, plan.nk
    fl = lambda d: d.is_floating_point or d.is_complex  # noqa: E731
    fc = tuple(i for i in range(nc) if fl(plan.c_meta[i][1]))
    fy = tuple(j for j in range(plan.ny) if fl(plan.y_meta[j][1]))
    need_x = tuple(i for i in range(nx) if need[nc + i])
    need_k = tuple(i for i in range(nk) if need[nc + nx + i])
    need_cap = tuple(i for i in range(ncap) if need[nc + nx + nk + i])
    return fc, fy, need_x, need_k, need_cap


class ResidualHooks:
    """saved_tensors_hooks for the backward body's re-run of fn: the k-th
    saved tensor is replaced by its residual slice (on the device)."""

    def __init__(self, info: Residuals, res_slices, policy, fn):
        self.info, self.slices, self.policy, self.fn = info, list(res_slices), policy, fn
        self.k = 0
        self.ready = {}
        self.kept = {}  # what autograd would have saved itself (see close())

    def pack(self, t):
        k, self.k = self.k, self.k + 1
        slot = self.info.slots[k] if k < len(self.info.slots) else "missing"
        if slot is None:
            self.kept[k] = t
            return ("kept", k)
        if slot == "missing" or (tuple(t.shape), t.dtype) != self.info.metas[slot[1]]:
            name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
            raise RuntimeError(f"scan(policy={self.policy!r}): fn ({name}) saved different tensors for backward "
                               f"when traced again (saved tensor {k}: {tuple(t.shape)} {t.dtype}); fn must run the "
                               f"same ops each time it is traced. Use policy='recompute' for this fn.")
        return slot

    def unpack(self, p):
        if p[0] == "kept":
            return self.kept[p[1]]
        j = p[1]
        t = self.ready.get(j)
        if t is None:
            s = self.slices[j]
            t = _tensor.wrap(_place(s._lt, _DEVICE)) if self.policy == "offload" else s
            self.ready[j] = t
        return t

    def close(self):
        """After the backward body's autograd.grad: autograd's saved variables
        hold these hooks from C++, where Python's gc cannot see a cycle
        through them; holding no tensors here lets the trace be freed."""
        self.kept, self.ready, self.slices = {}, {}, []

    def __enter__(self):
        self._cm = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        return self._cm.__enter__()

    def __exit__(self, *a):
        return self._cm.__exit__(*a)


def carry_in(c_l, policy):
    """The backward body's view of a stacked carry slice: on the device."""
    if policy != "offload":
        return list(c_l)
    return [_tensor.wrap(_place(t._lt, _DEVICE)) for t in c_l]
