"""What a txc.compile recording sees while the step's Python runs
(_compiled.py records; a Session watches, inside `with
executor.recording(session):`, the one hook the executor, the tracing
layer, the autograd engine, the scheduler hook and the "xla" backend ask):
every sync the step makes (a segment: an executable and where each of its
parameters comes from), every value it reads on the host (a guard, or a
value it returns), every upload (baked as a constant when that is sound),
every backward pass (the graphs it consumed), every LR scheduler step (run
again after each replay) and the tensors collectives wrote.

A step that reads a tensor value on the host (`.item()`, `if tensor:`,
transformers' mask checks) is cut there: the recording syncs everything
pending (one segment), reads the value and goes on. A replay runs the
segments in order and reads the same values from their outputs: a value
that differs from the recorded one stops the replay before anything is
written, and that call is traced instead (and recorded as another variant).
That is sound only while the segments before a guard overwrite no input
(they donate nothing): a step that reads after its optimizer update is
refused, unless the read is its last act and the value is what it returns
(`return loss.item()`): that value is read again from each replay's
outputs, as a result, not a guard."""
import math
import os
import sys

import torch

from .. import _C
from .._runtime import runtime
from .._tracing import checks as _checks, tensor as _tensor

GUARD_ELEMENTS = 64   # the largest value a step may read on the host (a guard compares every element)
_ALIAS = _C.op_ids()["alias"]


UNREACHED = ("it reads device data that is not among its inputs (a tensor reached other than through arguments, "
             "modules, optimizers, globals or closure)")


class Refused(Exception):
    """This call cannot be recorded for replay; the message says why."""


class Segment:
    """One sync of a recorded step: its executable, the plan that binds its
    parameters (slots, constants, the RNG state, earlier segments' outputs),
    how many outputs it has, whether it donates input buffers, its
    executor Key, and its StableHLO (text: kept for a dynamo graph's
    recording, whose replay may run fused with the graphs before it,
    _execution/pending.py; else None); chains: those fused executables,
    (earlier segments, binds) -> executable."""
    __slots__ = ("exe", "plan", "n", "donated", "donates", "key", "text", "chains")

    def __init__(self, exe, plan, n, donated, donates, key, text=None):
        self.exe, self.plan, self.n, self.donated, self.donates = exe, plan, n, donated, donates
        self.key, self.text, self.chains = key, text, {}


class Read:
    """A value the step read on the host: after how many segments, from where
    (("out", k): output k of the segments; ("slot", i): input slot i), its
    recorded value (flat tuple) and dtype; returned: the step returns it (a
    result read on every replay, not a guard)."""
    __slots__ = ("after", "source", "value", "dtype", "returned")

    def __init__(self, after, source, value, dtype):
        self.after, self.source, self.value, self.dtype = after, source, value, dtype
        self.returned = False


def host_value(buf):
    """A device buffer's value as (flat tuple, dtype) on the host."""
    t = runtime.to_host(buf, "a value a compiled step reads on the host")
    return tuple(t.reshape(-1).tolist()), t.dtype


class Session:
    """The recording of one call (see the module docstring). slots: id of each
    input buffer -> its input slot; rng_in: the RNG state's buffer at entry."""

    def __init__(self, slots, rng_in, keep_text=False):
        self.slots, self.rng_in = slots, rng_in
        self.keep_text = keep_text        # each segment keeps its StableHLO (Segment.text)
        self.segments = []
        self.outs, self.out_of = [], {}   # every segment's outputs in order; id(buffer) -> index
        self.used = set()                 # outputs that a later segment reads
        self.reads = []
        self.consts = {}                  # id(buffer) -> buffer: uploads baked as constants (held: never donated)
        self.checks = []                  # (output index, message, exception type) of deferred checks
        self.refusal = None
        self.roots = []                   # grad_fns whose graphs a backward pass consumed
        self.schedulers = []              # LR schedulers whose step() ran after the step (in order)
        self.synced = 0                   # syncs the executor ran meanwhile (each must be a segment)
        self.written = []                 # tensors a torch.distributed collective wrote (collective_wrote)
        self.last_plan = None             # the last segment's executor Plan (its donating variant: _compiled.py)
        self.bound = set()                # the input slots some segment reads

    def refuse(self, why):
        if self.refusal is None:
            self.refusal = why

    def collective_wrote(self, tensors):
        """The "xla" backend's collectives name the tensors they write: DDP's
        gradient buckets, state its reducer keeps out of the walk's reach
        (Compiled records again with them among the inputs)."""
        self.written.extend(tensors)

    # -- every sync during the call (executor._run) ----------------------------
    def grab(self, p, exe, params, outs):
        binds = []
        for a in p.cut.params():
            if type(a) is tuple:
                binds.append(("const", runtime.scalar(*a)))
            elif id(a) in self.slots:
                binds.append(("slot", self.slots[id(a)]))
            elif a is self.rng_in:
                binds.append(("rng", None))
            elif id(a) in self.out_of:
                binds.append(("out", self.out_of[id(a)]))
                self.used.add(self.out_of[id(a)])
            elif id(a) in self.consts:
                binds.append(("const", a))
            else:
                self.refuse(UNREACHED)
                binds.append(("const", a))
        base = len(self.outs)
        for j, b in enumerate(outs):
            self.out_of[id(b)] = base + j
        self.outs.extend(outs)
        for lt, msg, exc in p.checks:
            k = self.out_of.get(id(lt.data)) if lt.is_data else None
            if k is not None:
                self.checks.append((k, msg, exc))
        self.bound.update(v for kind, v in binds if kind == "slot")
        self.last_plan = p
        donated = [binds[i][1] for i, _ in p.key.aliases if binds[i][0] == "slot"]
        self.segments.append(Segment(exe, _C.ReplayPlan(binds, [], [], []), len(outs), donated, bool(p.key.aliases),
                                     p.key, p.stablehlo() if self.keep_text else None))

    # -- host reads (_tensor.materialize) --------------------------------------
    def read(self, t):
        lt = t._lt
        constant = False
        if not lt.is_data:
            if lt.is_view:
                lt = _tensor.lazy_op(_ALIAS, (lt,), ())  # a storage of its own holding the view's value
            # a value computed from constants alone (transformers' packed-sequence check of an arange's
            # positions) is the same on every replay of this graph: no guard, no wait for the device
            cut = _C.GraphCut([lt], _tensor.ALL_DEVICES)
            constant = all(type(a) is tuple or id(a) in self.consts for a in cut.params())
            # the user's read: everything pending is one segment (nothing computed twice); an op handler's read
            # (CTC's target lengths) syncs only its value, as a traced call does: the handler's half-built
            # values (a scan body's) are not ready to run
            _tensor.sync_lazy(None if not _in_op_handler() else [lt], wait=True)
        else:  # a value is read: checks computed with it raise now (as materialize does)
            _checks.verify()
        buf = lt.data
        k = self.out_of.get(id(buf))
        if constant:
            return buf
        if k is not None:
            source = ("out", k)
        else:
            i = self.slots.get(id(buf))
            if i is None:
                return buf  # a constant (an upload baked into the recording) or data nobody else can change
            source = ("slot", i)
        n = math.prod(lt.shape)
        if n > GUARD_ELEMENTS:
            self.refuse(f"it read a tensor of {n} elements on the host; a replay compares every value a step "
                        f"reads with the recorded one (up to {GUARD_ELEMENTS} elements): read smaller values, or "
                        f"move the read out of the step")
            return buf
        value, dtype = host_value(buf)
        self.reads.append(Read(len(self.segments), source, value, dtype))
        return buf

    # -- uploads (_tensor.from_cpu) -------------------------------------------
    def upload(self, host, buf, user):
        if user and host.dim() > 0 and host.numel() > 0 and not _in_module_call():
            self.refuse(f"it uploaded host data (a {list(host.shape)} tensor made from Python or CPU data inside "
                        f"the step, outside any module's forward); pass it as an argument")
        else:
            # a constant of the recording: an empty tensor (DynamicCache's torch.tensor([])), a Python number
            # (torch.tensor(mid - 1): baked as a number in an op is, under the same guards), a tensor a module's
            # forward makes from Python values (Falcon's x[..., [-2], :]: its structure and number attributes
            # are guarded), or a tensor an op made from shapes, numbers and values the step read (guarded)
            self.consts[id(buf)] = buf

    # -- backward passes (_ops/engine.py) --------------------------------------
    def backward(self, roots, keep_graph):
        if keep_graph:
            return
        for r in roots if isinstance(roots, (tuple, list)) else (roots,):
            fn = getattr(r, "grad_fn", None)
            if fn is not None:
                self.roots.append(fn)

    def consumed(self, t) -> bool:
        """Whether a backward pass in the call consumed t's autograd graph (a
        loss returned after loss.backward(): nothing can backward through it
        again, so a detached value is all a caller can use)."""
        fn = t.grad_fn
        if fn is None or not self.roots:
            return False
        seen, todo = set(), list(self.roots)
        while todo:
            n = todo.pop()
            if n is None or id(n) in seen:
                continue
            if n is fn:
                return True
            seen.add(id(n))
            todo.extend(f for f, _ in n.next_functions)
        return False

    def detach_consumed(self, out):
        """out with each tensor whose graph a backward pass in the step
        consumed detached (a loss returned after loss.backward()); the graphs
        are let go, so that what only they held (a custom Function's saved
        values) is not computed by the step's last sync."""
        if not self.roots:
            return out
        out = self._detach(out)
        self.roots = []
        return out

    def _detach(self, out):
        if isinstance(out, torch.Tensor):
            return out.detach() if out.requires_grad and self.consumed(out) else out
        if type(out) in (tuple, list):
            return type(out)(self._detach(x) for x in out)
        if type(out) is dict:
            return {k: self._detach(x) for k, x in out.items()}
        return out

    # -- LR schedulers ---------------------------------------------------------
    def scheduler_step(self, sched) -> bool:
        """A scheduler's step() inside the step: run after the step's graph
        (and again after each replay), so that its host-side count and the
        lr it writes move on every call. True: deferred."""
        self.schedulers.append(sched)
        return True

    # -- after the call -----------------------------------------------------------
    def classify_reads(self, template):
        """Reads that are the step's last act and whose value it returns
        (return loss.item()) become results; every other read is a guard,
        refused where a segment before it overwrote inputs. Returns the
        template with those values as ("R", read index)."""
        last = len(self.segments)
        for idx, r in enumerate(self.reads):
            if r.after == last and len(r.value) == 1:
                kind = bool if r.dtype == torch.bool else float if r.dtype.is_floating_point else int
                template, found = _mark_returned(template, r.value[0], idx, kind)
                r.returned = found
        for r in self.reads:
            if not r.returned and any(s.donates for s in self.segments[:r.after]):
                raise Refused("it reads a tensor value on the host after a sync that updated its inputs in place, "
                              "and goes on computing; a replay could not redo the step if the value differed. "
                              "Read values at the end of the step and return them (return loss.item())")
        return template


_MODULE_CALLS = {torch.nn.Module._call_impl.__code__, torch.nn.Module._wrapped_call_impl.__code__}


def _in_module_call() -> bool:
    """Whether a module's forward is running (a frame of Module.__call__ on the stack)."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code in _MODULE_CALLS:
            return True
        f = f.f_back
    return False


_OPS_DIR = os.path.dirname(os.path.dirname(__file__)) + "/_ops/"  # torch_xla_core/_ops/


_READ_ENTRIES = {"local_scalar_dense", "is_nonzero", "_to_copy", "to_copy", "copy_"}  # _ops/elementwise.py


def _in_op_handler() -> bool:
    """Whether an op handler of ours (torch_xla_core/_ops) reads the value
    for its own work (a mask's nonzero indices), not as the user's read
    (.item(), `if tensor:`, .cpu(): the handlers of _READ_ENTRIES)."""
    f = sys._getframe(2)
    while f is not None:
        c = f.f_code
        if c.co_filename.startswith(_OPS_DIR) and c.co_name not in _READ_ENTRIES:
            return True
        f = f.f_back
    return False


def _mark_returned(tpl, value, idx, kind):
    """tpl with the first returned Python number of type kind (the read's
    .item() type) equal to value replaced by ("R", (idx, kind))."""
    tag, v = tpl
    if tag == "V":
        if type(v) is kind and v == value:
            return ("R", (idx, kind)), True
        return tpl, False
    if tag in ("T", "R"):
        return tpl, False
    items = list(v)
    for j, x in enumerate(items):
        if tag is dict:
            k, sub = x
            new, found = _mark_returned(sub, value, idx, kind)
            if found:
                items[j] = (k, new)
                return (tag, items), True
        else:
            new, found = _mark_returned(x, value, idx, kind)
            if found:
                items[j] = new
                return (tag, items), True
    return tpl, False
