"""txc.compile's Compiled: a function whose calls replay recorded graphs. A
call walks its inputs (_walk.py) and, when a recording of that signature
exists, binds their buffers and runs the recorded executables through the
executor's pipeline (executor.run_recorded); else it traces fn once under a
recording session (_session.py), makes the Recording from what the session
saw (_recording.py), and keeps it. The user's page: docs/replay.md."""
import concurrent.futures
import functools
import gc
import sys
import warnings
import weakref

import torch

from .. import _C, config, metrics
from .._execution import executor, pending as _pending
from .._runtime import dtypes as _dtypes
from .._tracing import checks as _checks, random as _random, tensor as _tensor
from .._tracing.tensor import XlaTensor
from . import _schedulers
from ._lift import lift_optimizer
from ._recording import Recording, buffer, flat_kind, flatten, number_to_data, own_storage, returned, root_buffer
from ._session import UNREACHED, Refused, Session, host_value
from ._walk import captured, plain_getters, walk

__all__ = ["compile", "Compiled", "MAX_RECORDINGS", "MAX_VARIANTS"]

MAX_RECORDINGS = 16  # signatures recorded per compiled function
MAX_VARIANTS = 4     # recordings per signature that differ in the values they read on the host
_GUARD = "a value it reads on the host differs from every recorded one"
_LOST = "that are not among its inputs or outputs (their new values would be lost on replay)"
_tracing = 0          # > 0 while a compiled function traces (a nested one then just runs)
_GRAD = _C.replay_slot_kinds["grad"]


def compile(fn=None, *, lift_optimizers: bool = True, wait: bool = False):
    """Wraps fn so that repeated calls replay its recorded graph (docs/replay.md
    says what is guarded and what is refused). Usable as @txc.compile on
    functions and methods. wait=True: a replay blocks until the device is done
    (timer "execute", as a sync(wait=True) records it), after writing its
    outputs (that work overlaps the device's); a traced call then syncs with
    wait too."""
    if fn is None:
        return lambda f: Compiled(f, lift_optimizers=lift_optimizers, wait=wait)
    return Compiled(fn, lift_optimizers=lift_optimizers, wait=wait)


class Compiled:
    """A function whose calls replay recorded graphs (docs/replay.md)."""

    def __init__(self, fn, lift_optimizers=True, wait=False, inner=False):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._lift = lift_optimizers
        self._wait = wait
        # a graph inside the user's step (dynamo's): it reads no deferred checks (the step's sync does), and its
        # input views, lone ones too (the forward's saved views of its outputs), are read through their chains
        self._inner = inner
        self._recordings = {}   # signature -> [Recording]: variants told apart by the values they read
        self._refused = {}      # signature -> reason
        self._warned = set()
        self._late, self._late_tries = [], 0  # weakrefs: tensors walked after the rest (_retry_late)

    def __get__(self, obj, objtype=None):  # @txc.compile on a method: self is an argument
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __call__(self, *args, **kwargs):
        if _tracing:
            return self._fn(*args, **kwargs)
        src = self._fn
        if self._lift:
            for a in list(args) + list(kwargs.values()) + [v for _, v in captured(src)]:
                if isinstance(a, torch.optim.Optimizer):
                    lift_optimizer(a)
        if not config.get("TXC_REPLAY"):  # trace every call (same lifting: same numerics)
            metrics.counter_add("replay_trace")
            return self._run(args, kwargs)
        # No garbage collection during the guard and a replay: they make ~1300 objects per step (the
        # outputs' arrays) that live on and free as many, none of them garbage, yet crossing gen-0's
        # threshold mid-step ran a collection over them every step (and promoted them, which made
        # full collections ~200 ms every few hundred steps). Allocations and frees net out per step.
        collecting = gc.isenabled()
        if collecting:
            gc.disable()
        try:
            w = walk(src, args, kwargs, self._inner, self._late_inputs())
            sig = w.signature()
            recs = self._recordings.get(sig) if w.refusal is None else None
            if recs is not None:
                out, why = self._replay(recs, w)
                if why is None:
                    return out
        finally:
            if collecting:
                gc.enable()
        if w.refusal is not None:
            return self._traced(w.refusal, args, kwargs)
        if recs is not None:
            if why is _GUARD and len(recs) < MAX_VARIANTS:  # another value read: record that path too
                metrics.counter_add("replay_guard_miss")
                return self._record(sig, w, src, args, kwargs)
            return self._traced(why, args, kwargs)
        why = self._refused.get(sig)
        if why is not None:
            return self._traced(why, args, kwargs)
        return self._record(sig, w, src, args, kwargs)

    # -- tracing ------------------------------------------------------------
    def _traced(self, why, args, kwargs):
        metrics.counter_add("replay_trace")
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"torch_xla_core.compile({getattr(self._fn, '__qualname__', self._fn)}): this call is "
                          f"traced, not replayed: {why}", RuntimeWarning, stacklevel=3)
        return self._run(args, kwargs)

    def _run(self, args, kwargs):
        out = self._call_fn(args, kwargs)
        if self._wait:
            _tensor.sync_lazy(wait=True)
        return out

    def _call_fn(self, args, kwargs):
        global _tracing
        _tracing += 1
        try:
            return self._fn(*args, **kwargs)
        finally:
            _tracing -= 1

    def _record(self, sig, pre, src, args, kwargs):
        metrics.counter_add("replay_trace")
        for t in pre.tensors:
            if t is not None and not (self._inner and t._lt.is_view):
                own_storage(t)  # a lone view gets a storage of its own; a shared one is read through its chain
        _tensor.sync_lazy()  # inputs become device data; nothing else pending
        rng = _random.current_state()
        slots = {}
        for i, t in enumerate(pre.tensors):
            if t is not None:
                b = root_buffer(t)  # a view's graph parameter is its storage's buffer
                if b is None:
                    return self._refuse(sig, "an input is a view of another tensor", args, kwargs)
                slots[id(b)] = i
        session = Session(slots, rng.data, keep_text=self._inner)
        c0 = metrics.counters().get("execute", 0)
        with executor.recording(session):
            out = self._call_fn(args, kwargs)
        if metrics.counters().get("execute", 0) - c0 != len(session.segments):
            session.refuse("it ran a sync the recording cannot replay (a graph over a mesh of devices)")
        out = session.detach_consumed(out)  # (and lets go of those graphs before the step's last sync)
        try:
            if session.refusal is not None:
                raise Refused(session.refusal)
            rec, outs, results = self._capture(sig, pre, src, args, kwargs, out, session)
        except Refused as e:
            _tensor.sync_lazy()
            if self._retry_late(session, str(e)):
                metrics.counter_add("replay_retry")
                return out
            self._refused[sig] = str(e)
            metrics.counter_add("replay_refused")
            return self._warn_refused(str(e), out)
        finally:
            _schedulers.run(session.schedulers)  # after the step's graph: the lr they write is the next call's input
        if rec is not None and (sig in self._recordings or len(self._recordings) < MAX_RECORDINGS):
            self._recordings.setdefault(sig, []).append(rec)
            metrics.counter_add("replay_record")
            return returned(rec, pre.tensors, outs, results)  # what a replay returns (detached, the same views)
        return out

    def _late_inputs(self):
        return [t for t in (r() for r in self._late) if t is not None]

    def _retry_late(self, session, why):
        """Whether a call refused for reading device data outside the walk,
        or for writing tensors outside it, is recorded again on the next
        call, because a torch.distributed collective wrote tensors the walk
        did not reach (DDP's gradient buckets: its reducer holds them): then
        those are walked too, after the rest, as state that each replay reads
        and writes in place. DDP makes new buckets once, in its second step,
        hence up to 3 tries; refusals of the same signature are forgotten
        (a new bucket has the old one's shape)."""
        walked = {id(t) for t in self._late_inputs()}
        written = [t for t in dict.fromkeys(session.written) if isinstance(t, XlaTensor)]
        if (why != UNREACHED and _LOST not in why) or self._late_tries >= 3 or all(
                id(t) in walked for t in written):
            return False
        self._late_tries += 1
        self._late = [weakref.ref(t) for t in written]
        self._refused.clear()
        return True

    def _warn_refused(self, why, out):
        if why not in self._warned:
            self._warned.add(why)
            warnings.warn(f"torch_xla_core.compile({getattr(self._fn, '__qualname__', self._fn)}): not "
                          f"replayable, every call is traced: {why}", RuntimeWarning, stacklevel=4)
        return out

    def _refuse(self, sig, why, args, kwargs):
        self._refused[sig] = why
        metrics.counter_add("replay_refused")
        return self._warn_refused(why, self._run(args, kwargs))

    def _capture(self, sig, pre, src, args, kwargs, out, session):
        """Syncs the traced step (its last segment) and makes the recording
        from the session's segments: where each output goes, what it returns.
        The recording is None when the step is transitional (its outputs have
        another signature than its inputs: optimizer state or grads appeared)."""
        post = walk(src, args, kwargs, self._inner, self._late_inputs())
        leaves = []
        tpl = flatten(out, leaves)
        inputs = {id(t) for t in pre.tensors}
        # fine: an input returned as it is, a view made under no_grad (no grad_fn; returned not requiring grad)
        if any(t.requires_grad and id(t) not in inputs and (t.grad_fn is not None or t._base is None)
               for t in leaves):
            raise Refused("it returns a tensor that requires grad and that no backward pass in the step "
                           "consumed: replay covers whole steps (forward, backward and optimizer) and no_grad "
                           "functions; return the loss after loss.backward(), or loss.detach()")
        shared = [t for t in post.tensors  # views read through chains
                  if t is not None and (self._inner and t._lt.is_view or not own_storage(t))]
        host = {j for j, t in enumerate(leaves) if not isinstance(t, XlaTensor)}  # constants (below)
        views = {j: t._lt for j, t in enumerate(leaves) if j not in host and not own_storage(t)}  # re-made
        gc.collect()  # garbage of the trace holds no pending values
        n_before = len(session.segments)
        with executor.recording(session):  # (its one sync: the session sees nothing else here)
            _tensor.sync_lazy(wait=self._wait)
        if session.refusal is not None:
            raise Refused(session.refusal)
        tpl = session.classify_reads(tpl)
        outs, out_of = session.outs, session.out_of
        for t in shared:  # their storage must be an input's or an output's, else its new value is lost
            b = id(root_buffer(t))
            if b not in session.slots and b not in out_of:
                raise Refused("a tensor it wrote is a view sharing its storage with other tensors")
        # claimed: outputs that go somewhere (a tensor, a later segment, a read, a check)
        claimed = set(session.used)
        claimed.update(r.source[1] for r in session.reads if r.source[0] == "out")
        rec = Recording()
        rec.segments = session.segments
        rec.reads = session.reads
        rec.schedulers = session.schedulers
        rec.specs = [None] * len(outs)
        rec.donated = sorted({i for seg in session.segments for i in seg.donated})
        rec.trailing_guard = any(not r.returned and r.after == len(session.segments) for r in session.reads)

        def output(t):
            k = out_of.get(id(buffer(t)))
            if k is not None:
                claimed.add(k)
                rec.specs[k] = (t._lt.dtype, list(t._lt.shape))
            return k
        # where each output goes
        transitional = post.signature() != sig
        writes = []
        for i, t in enumerate(post.tensors):
            before = pre.tensors[i] if i < len(pre.tensors) else None
            if t is None:
                if before is not None and not transitional:
                    writes.append((i, None, "none"))
                continue
            k = output(t)
            if k is None:
                if t is not before and not transitional:
                    raise Refused("it put an existing tensor where another was (an input moved)")
                continue
            writes.append((i, k, "inplace" if t is before else "new"))
        rec.inplace = [(i, k) for i, k, mode in writes if mode == "inplace"]
        others = [w for w in writes if w[2] != "inplace"]
        ret = []
        for j, t in enumerate(leaves):
            if j in host:  # a CPU tensor the step made from no input (a dynamo graph's 0-d constant saved for
                ret.append(("host", t.detach().clone()))  # its backward): the same value every call
                continue
            if j in views:
                ret.append(self._view_of(views[j], session.slots, out_of, claimed, rec))
                continue
            k = output(t)
            if k is not None:
                ret.append(("out", k))
            elif id(buffer(t)) in session.slots:
                ret.append(("slot", session.slots[id(buffer(t))]))
            else:
                raise Refused("it returned a tensor that is neither computed by it nor an input")
        rec.ret = (tpl, ret)
        rec.rng_out = None
        st = _random.peek_state()
        if st is not None and st.is_data and id(st.data) in out_of:
            rec.rng_out = out_of[id(st.data)]
            claimed.add(rec.rng_out)
        rec.checks = session.checks
        claimed.update(k for k, _, _ in rec.checks)
        # an output nobody claims is lost on replay: refused where a live tensor still holds it (an output of
        # an earlier segment that the step only used meanwhile, a temporary, is dead by now)
        last = sum(seg.n for seg in session.segments[:n_before])  # the first output of the step's last sync
        lost = [k for k in range(len(outs)) if k not in claimed and (k >= last or sys.getrefcount(outs[k]) > 3)]
        if lost:
            shapes = ", ".join(f"{outs[k].dtype} {list(outs[k].shape)}" for k in lost[:4])
            raise Refused(f"it wrote {len(lost)} tensor(s) {_LOST}: {shapes}")
        rec.flat = flat_kind(tpl)
        p, session.last_plan = session.last_plan, None  # (its cut holds the traced graph)
        key = p.key if p is not None else None
        grads = self._donated_grads(p, session, pre, others, rec, transitional)
        rec.plan = _C.ReplayPlan([], rec.inplace, others, rec.specs, ret, [i for i, _ in grads])
        rec.fuse = None
        # (a dynamo graph's: its text is kept; not one partitioned over a mesh, or with parameters or outputs
        # outside device memory, whose launch or signature the fused executable does not carry:
        # _execution/pending.py, fusion.py)
        if self._inner and len(rec.segments) == 1 and not rec.reads and key is not None and key.spmd is None \
                and not key.memory:
            simple = not (rec.inplace or others or rec.rng_out is not None or rec.donated or rec.segments[0].donates
                          or rec.schedulers)
            rec.fuse = "defer" if simple else "join"
        results = {idx: r.value[0] for idx, r in enumerate(session.reads) if r.returned}
        _grad_refs()  # (its probe runs ops: here, not in a replay)
        return (None if transitional else rec), outs, results

    @staticmethod
    def _donated_grads(p, session, pre, others, rec, transitional):
        """The grads a replay hands to its last executable (p: the last
        segment's executor Plan) to write the new
        ones into, as (input slot, output) pairs, and that executable
        (rec.grad_exe, executor.donating_variant: one unread parameter per old
        grad, donated to its new value; a Future: compiled in the background). The old grads that zero_grad let go
        in the recorded call are then neither freed before the launch nor
        replaced by new buffers: their buffers are written in place (a replay
        frees ~256 grad buffers a step in the MLP bench otherwise). Those are
        the grads the last segment makes anew that no segment reads, of the
        old grad's dtype and shape. A replay whose old grads cannot all be
        given (one held elsewhere: ReplayPlan.release) runs the recorded
        executable, releasing them as before. None for a transitional step (not kept)."""
        rec.grad_exe = None
        if p is None or transitional or rec.trailing_guard or not config.get("TXC_DONATE"):
            return []
        first = sum(seg.n for seg in session.segments[:-1])  # the last segment's first output
        aliased = {o for _, o in p.key.aliases}
        grads = []
        for i, k, mode in others:
            t = pre.tensors[i]
            if (mode == "new" and pre.kinds[i] == _GRAD and t is not None and k >= first and i not in session.bound
                    and k - first not in aliased and (t._lt.dtype, list(t._lt.shape)) == tuple(rec.specs[k])):
                grads.append((i, k))
        if grads:
            try:
                rec.grad_exe = executor.donating_variant(p, [k - first for _, k in grads])  # compiled in the background
            except Exception as e:  # noqa: BLE001  (its lowering: said at the first replay, as a failed compile)
                rec.grad_exe = concurrent.futures.Future()
                rec.grad_exe.set_exception(e)
        return grads

    @staticmethod
    def _grad_exe(rec):
        """rec's donating executable (_donated_grads) once its background
        compile is done, else None (the recorded executable serves meanwhile,
        and for good if that compile failed: said once)."""
        f = rec.grad_exe
        if f is None or not f.done():
            return None
        try:
            return f.result()
        except Exception as e:  # noqa: BLE001
            rec.grad_exe = None
            warnings.warn(f"torch_xla_core.compile: replays free and reallocate the grads: their donating "
                          f"executable failed to compile ({e})", RuntimeWarning, stacklevel=4)
            return None

    @staticmethod
    def _view_of(lt, slots, out_of, claimed, rec):
        """A returned view sharing its storage with an input or an output
        (a dynamo graph returning a transposed weight): on replay, its view
        chain is applied to that input's or output's new value. The chain is
        kept on a shape-only placeholder (no buffer), so the recording holds
        no device memory of the traced call."""
        root = lt.root()
        b = root.data if root.is_data else None
        template = lt.rebase(_C.from_data(None, root.dtype, list(root.shape)))
        k = out_of.get(id(b))
        if k is not None:
            claimed.add(k)
            rec.specs[k] = (root.dtype, list(root.shape))
            return ("view_out", k, template)
        if id(b) in slots:
            return ("view_slot", slots[id(b)], template)
        raise Refused("it returned a view of a tensor that is neither computed by it nor an input")

    # -- replaying ----------------------------------------------------------
    def _replay(self, recs, w):
        tensors = w.tensors
        pending = False
        if not _C.replay_ready(tensors, self._inner):  # (the common case, every input device data: one C++ pass)
            for t in tensors:
                if t is not None and not t._lt.is_data and buffer(t) is None:  # pending, or a view
                    if self._inner and t._lt.is_view:  # read through its chain, lone or not
                        pending = pending or root_buffer(t) is None
                    elif own_storage(t) and not number_to_data(t._lt) or root_buffer(t) is None:
                        pending = True  # (a shared view reads its storage)
        st = _random.current_state()
        if not st.is_data or pending:
            # values computed since by traced ops (clip_grad_norm_'s scaling of the grads): launched first, without
            # waiting and without reading deferred checks (the user's sync or value read does)
            executor.sync(wait=self._wait, read_checks=False)
            st = _random.peek_state()
            if self._inner:  # a view's chain over its storage's old pending value holds that graph, and with it
                for t in tensors:  # the nodes of inputs that may be donated (a parameter a saved activation read)
                    if t is not None and t._lt.is_view:
                        t._lt.hash  # (reading its value rebuilds the chain over the storage's new buffer)
        if not self._inner:
            _pending.flush()  # (a dynamo graph's launch left pending: only the next dynamo graph joins it)
        for rec in recs:
            # (a buffer the pending launch also holds may be donated: it runs first, or fused with this one)
            if _C.replay_exclusive(tensors, rec.donated, _pending.held() if rec.fuse else []) >= 0:
                if not _pending.pending():
                    return None, "a donated buffer is held elsewhere (e.g. a copy of the model)"
                _pending.flush()
                if _C.replay_exclusive(tensors, rec.donated) >= 0:
                    return None, "a donated buffer is held elsewhere (e.g. a copy of the model)"
            try:
                return self._run_segments(rec, w, st), None
            except _GuardMiss:
                continue
        return None, _GUARD

    def _run_segments(self, rec, w, st):
        """Runs a recording's segments through the executor's one pipeline
        (executor.Launch: executable, bound parameters, output writes),
        comparing each value read on the host with the recorded one; returns
        what the step returns. A value that differs raises _GuardMiss with
        nothing written and no input donated: the segments before a guard
        donate nothing, and the last one writes (its Launch.write) only once
        the values read after it hold."""
        tensors = w.tensors
        outs, reads, ri = [], rec.reads, 0
        last = len(rec.segments) - 1
        ret = []
        bound = []  # the last launch's parameter list, emptied once launched (write, below)

        def value(r):
            kind, v = r.source
            return host_value(outs[v] if kind == "out" else root_buffer(tensors[v]))[0]

        def write(o):  # the last segment's outputs: the step's writes (while the device runs)
            for p in bound:  # the launch holds the inputs' arrays: let go of them, so that the writes free the
                p.clear()    # replaced ones now, while the device runs, not after the wait (~1300 in the MLP)
            outs.extend(o)
            results = {}
            for idx in range(ri, len(reads)):
                r = reads[idx]
                v = value(r)
                if r.returned:
                    results[idx] = v[0]
                elif v != r.value:
                    raise _GuardMiss
            plan = rec.plan
            plan.write(tensors, outs)
            plan.set(tensors, w.kinds, w.owners, w.keys, outs)  # new tensors (a grad after zero_grad) or None
            if rec.rng_out is not None:
                _random.set_state(_C.from_data(outs[rec.rng_out], _dtypes.code(torch.int64), [2]))
            metrics.counter_add("replay")
            ret.append(returned(rec, tensors, outs, results))
            _schedulers.run(rec.schedulers)  # as in the recorded call, after the step's graph

        def checks(_):  # (after write: outs holds every segment's outputs)
            return [(_C.from_data(outs[k], _dtypes.code(torch.bool), []), msg, exc) for k, msg, exc in rec.checks]

        # a dynamo graph's replay: left pending itself (joined to the pending launch where its outputs feed ours),
        # or run fused with the pending launch (_execution/pending.py)
        fuse = rec.fuse if not self._wait and _pending.enabled() and not executor.multi_device() else None
        first, routing = None, ()
        if fuse is not None and _pending.pending():
            first, routing = _pending.bind(rec.segments[0].plan, tensors, st.data)
            if not routing:
                _pending.flush()
        if fuse == "defer" and (not routing or _pending.may_join(rec.segments[0])):
            outs.extend(_pending.defer(rec.segments[0], first if first is not None else
                                       rec.segments[0].plan.params(tensors, st.data, outs), routing))
            if rec.checks:
                _checks.computed(checks(None))
            metrics.counter_add("replay")
            return returned(rec, tensors, outs, {})
        for s, seg in enumerate(rec.segments):
            while ri < len(reads) and reads[ri].after == s:
                if value(reads[ri]) != reads[ri].value:
                    raise _GuardMiss
                ri += 1
            params = seg.plan.params(tensors, st.data, outs) if first is None else first
            if s == last:
                bound.append(params)
            release = s == last and not rec.trailing_guard
            exe = seg.exe
            if release:
                # the grads this step replaces let their buffers go first, as zero_grad did in the recorded
                # call (one set of grads at the peak, not two), or, where every one can be given, go to the
                # launch donated, to be written with the new grads (_donated_grads); one that nobody else
                # holds is kept to take its new value
                with plain_getters():  # (its reads of the old grads: requires_grad, is_contiguous())
                    given = rec.plan.release(tensors, w.kinds, _grad_refs())
                donating = self._grad_exe(rec) if given and not routing else None  # (a fused launch: its own)
                if donating is not None:
                    params.extend(given)
                    exe = donating
                del given
            launch = (executor.Launch(exe, params, write, checks if rec.checks else None) if s == last
                      else executor.Launch(exe, params))
            del params  # (the inputs' buffers: donated ones must not stay referenced past the launch)
            try:
                if routing:
                    o = _pending.launch(launch, seg, routing)
                else:
                    o, _ = executor.run_recorded(launch, wait=self._wait and s == last, read_checks=not self._inner)
            except BaseException:
                if release:
                    rec.plan.unrelease(tensors, w.kinds, w.owners)
                raise
            del launch
            if s != last:
                outs.extend(o)
        if not rec.segments:  # nothing to run on the device (a dynamo graph returning inputs' views)
            write([])
        return ret[0]


class _GuardMiss(Exception):
    """A value a replay read on the host differs from the recorded one."""


_grad_refs_seen = None


def _grad_refs() -> int:
    """The reference count of a grad tensor that only its parameter and one
    list hold (ReplayPlan.release checks it before that tensor takes the
    step's new grad): torch 2.13 keeps a reference to the Python object of
    a tensor that C++ holds. Measured once on a probe; 0 (never reuse) if
    the probe cannot tell a grad somebody else holds from one nobody does."""
    global _grad_refs_seen
    if _grad_refs_seen is None:
        dev = torch.device("xla", 0)
        p = torch.zeros(1, device=dev, requires_grad=True)
        p.grad = torch.zeros(1, device=dev)
        held = [p.grad]
        alone = sys.getrefcount(held[0]) - 1  # (minus getrefcount's own argument)
        held.append(p.grad)  # somebody else holds it now
        other = sys.getrefcount(held[0]) - 1
        _grad_refs_seen = alone if other == alone + 1 else 0
    return _grad_refs_seen
