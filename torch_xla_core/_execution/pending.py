"""Pending launches: a step's torch.compile graphs as one launch (issue 43).

A dynamo step calls its graphs one after the other (forward, backward,
optimizer), each replayed by a replay.Compiled of its own. A replay whose
recording is simple (one segment; no in-place writes, RNG output, host
reads, donation or LR schedulers: replay/_compiled.py's rec.fuse) does
not launch: defer() keeps its segment and bound parameters as the pending
chain and returns Placeholders for its outputs, which the replay makes
its tensors over (their data leaves hold them: csrc/py/data.h).

The next inner replay whose parameters hold placeholders of that chain
(bind() leaves them as they are while it binds) joins it: a simple one
defers too (the chain grows, up to MAX_SEGMENTS - 1), any other, or the
last, runs one executable of the chain and itself (launch()): the segments' StableHLO as private functions of one
module whose main routes outputs into the parameters they feed and returns
the outputs of all (fusion.py; compiled by the executor once per segments
and routings, kept by the last segment).
The chain's outputs then fill its placeholders: a placeholder's leaf takes
its buffer when it is next read. Anything else that reads a placeholder's
buffer (a value read, a sync of traced ops over it, a replay binding it
otherwise) resolves it, which first launches the chain alone (flush()), as
does every sync (executor.sync) and every replay that does not join it.
One "execute" per launch, fused or not. TXC_FUSE_GRAPHS=0 turns deferring
off."""
import warnings

from .. import _C, config, metrics
from . import executor, fusion

__all__ = ["MAX_SEGMENTS", "Placeholder", "enabled", "pending", "held", "may_join", "defer", "bind", "launch", "flush"]

MAX_SEGMENTS = 3  # a chain's segments at most (a training step's forward, backward and optimizer)
_current = None   # the chain whose launch is pending, or None
_holding = None   # the chain whose placeholders bind() leaves as they are
_failed = None    # the error of a fused executable that failed to build or compile: no replay defers since


class Placeholder:
    """Output k of a chain: what the data leaves of that output hold until
    they are read (then its buffer)."""
    __slots__ = ("chain", "k")

    def __init__(self, chain, k):
        self.chain, self.k = chain, k

    def __del__(self):  # nobody will read output k: the chain lets go of its buffer, or never makes it
        chain = self.chain
        if chain.outs is not None:
            chain.outs[self.k] = None
        else:
            chain.dead.add(self.k)


class _Chain:
    """Pending launches: their segments (replay/_session.py Segment), each
    one's binds (per parameter: a >= 0, the fused launch's parameter a;
    -1 - k, the chain's output k, counted over the segments before it), the
    fused launch's parameters (each buffer once); dead: the outputs whose
    placeholders died before the launch (a forward's activations, freed by
    autograd once the backward joined: the fused executable does not return
    them); outs: the outputs of all once launched (None where dead)."""
    __slots__ = ("segs", "binds", "params", "index", "n", "dead", "outs", "error")

    def __init__(self):
        self.segs, self.binds, self.params, self.index = [], [], [], {}
        self.n, self.dead, self.outs, self.error = 0, set(), None, None

    def left_out(self, seg=None) -> frozenset:
        """The outputs the launch of this chain (with segment `seg`) leaves out: the
        dead ones; none where a graph holds collectives across processes
        (Key.replicas: every process must launch the same program, and a
        placeholder freed by the garbage collector dies at a different
        moment in each)."""
        if seg is not None and seg.key.replicas is not None or any(s.key.replicas is not None for s in self.segs):
            return frozenset()
        return frozenset(self.dead)

    def spread(self, outs, dead) -> list:
        """outs of a launch that left out the outputs `dead`, at their
        places (None there, and where the placeholder died since)."""
        if not self.dead:
            return list(outs)
        full, it, gone = [None] * self.n, iter(outs), self.dead
        for k in range(self.n):
            if k not in dead:
                v = next(it)
                if k not in gone:
                    full[k] = v
        return full

    def bound(self, params, routing) -> tuple:
        """The binds of a segment's parameters (routing: bind()'s; those
        parameters are None), its buffers added to the chain's parameters."""
        routed = dict(routing)
        index, chained = self.index, self.params
        binds = [0] * len(params)
        for j, p in enumerate(params):
            if p is None:
                binds[j] = -1 - routed[j]
                continue
            a = index.get(id(p))
            if a is None:
                a = index[id(p)] = len(chained)
                chained.append(p)
            binds[j] = a
        return tuple(binds)

    def add(self, seg, params, routing):
        self.binds.append(self.bound(params, routing))
        self.segs.append(seg)
        base, self.n = self.n, self.n + seg.n
        return [Placeholder(self, base + k) for k in range(seg.n)]


def enabled() -> bool:
    """Whether replays may defer their launch (TXC_FUSE_GRAPHS; not after
    a fused executable failed to build or compile)."""
    return _failed is None and config.get("TXC_FUSE_GRAPHS")


def pending() -> bool:
    """Whether a launch is pending."""
    return _current is not None


def may_join(seg) -> bool:
    """Whether seg may join the pending chain deferred (else it launches
    fused with it): the chain is short of MAX_SEGMENTS and does not hold seg
    already (a graph fed its own outputs call after call, an RNN's state,
    would grow the chain, and compile a new executable, on every call)."""
    return len(_current.segs) < MAX_SEGMENTS - 1 and seg not in _current.segs


def defer(seg, params, routing=()) -> list:
    """Leaves seg's launch on params pending: joined to the pending chain
    where `routing` (bind()) says the chain's outputs feed it, else as a new
    chain (the one pending before launched first); returns a placeholder
    per output."""
    global _current
    if not routing:
        flush()
        _current = _Chain()
    return _current.add(seg, params, routing)


def bind(plan, tensors, rng):
    """plan.params(...) with the placeholders of the pending chain left in
    place: (params, routing), routing ((j, k), ...) where parameter j is
    the chain's output k (params[j] is None there)."""
    global _holding
    _holding = _current
    try:
        params = plan.params(tensors, rng)
    finally:
        _holding = None
    routing = tuple((j, p.k) for j, p in enumerate(params) if type(p) is Placeholder)
    for j, _ in routing:
        params[j] = None
    return params, routing


def held() -> list:
    """The buffers the pending chain holds (its parameters), or []."""
    return _current.params if _current is not None else []


def launch(last, seg, routing):
    """Launches the pending chain fused with `last`, the executor.Launch of
    segment `seg` on the parameters bind() gave (routing: those the chain's
    outputs feed, None in last.params); last.write and last.checks get
    last's own outputs, which it returns."""
    global _current
    chain = _current
    _current = None
    binds = chain.bound(last.params, routing)
    dead = chain.left_out(seg)  # (those that die from here on are dropped once launched)
    n = chain.n - len(dead)
    exe = fused(chain.segs + [seg], chain.binds + [binds], dead)
    params, chain.params, chain.index = chain.params, None, None
    if exe is None:
        return _apart(chain, params, last, binds)

    def write(outs):
        chain.outs = chain.spread(outs[:n], dead)
        if last.write is not None:
            last.write(outs[n:])
    checks = (lambda outs: last.checks(outs[n:])) if last.checks is not None else None
    try:
        o, _ = executor.run_recorded(executor.Launch(exe, params, write, checks), read_checks=False)
    except BaseException as e:
        chain.error = e
        raise
    return o[n:]


def flush() -> None:
    """Launches the pending chain alone, if there is one."""
    global _current
    chain = _current
    if chain is None:
        return
    _current = None
    dead = frozenset()
    if len(chain.segs) == 1:  # (its recorded executable: all its outputs)
        exe, params = chain.segs[0].exe, [chain.params[a] for a in chain.binds[0]]
    else:
        dead = chain.left_out()
        exe, params = fused(chain.segs, chain.binds, dead), chain.params
    chain.params = chain.index = None
    if exe is None:
        _apart(chain, params)
        return
    try:
        o, _ = executor.run_recorded(executor.Launch(exe, params), read_checks=False)
    except BaseException as e:
        chain.error = e
        raise
    chain.outs = chain.spread(o, dead)


def _resolve(p):
    """A placeholder's buffer, for a data leaf that holds it (csrc/py/data.h):
    the chain launched first if it has not been; p itself while bind() holds
    its chain. (The chain keeps the buffer until p is gone: other leaves may
    hold p too, a returned tensor and a deferred check of one output.)"""
    chain = p.chain
    if chain is _holding:
        return p
    if chain.outs is None:
        if chain is not _current:
            raise RuntimeError(f"this tensor's value was never computed: its graph's launch failed ({chain.error})")
        flush()
    return chain.outs[p.k]


_C.set_pending(Placeholder, _resolve)
executor.before_sync(flush)  # a sync computes everything: the pending launch runs first


def fused(segs, binds, dead):
    """The executable of segments `segs` as one (binds: _Chain's): its
    outputs all of theirs in turn, but those in `dead`. Compiled by the
    executor (its cache, the persistent cache, the segments' compile
    options: fusion.ChainPlan) once per (segments, binds, dead); the last
    segment keeps it, as a recording keeps each segment's executable."""
    memo, key = segs[-1].chains, (tuple(segs[:-1]), tuple(binds), dead)
    exe = memo.get(key)
    if exe is None:
        try:
            exe = executor.executable(fusion.plan(segs, binds, dead), explain=False)
        except Exception as e:  # noqa: BLE001  (said once; the graphs then launch one by one: _apart)
            _give_up(e)
            return None
        memo[key] = exe
    return exe


def _give_up(e) -> None:
    """A fused executable failed to build or compile (an XLA or jaxlib MLIR
    error): said once, counted ("fuse_failed"), and no replay defers its
    launch from then on."""
    global _failed
    _failed = e
    metrics.counter_add("fuse_failed")
    first = (str(e).strip().splitlines() or [""])[0][:300]
    warnings.warn(f"torch_xla_core: running a step's torch.compile graphs as one launch failed ({type(e).__name__}: "
                  f"{first}); each graph launches on its own from now on, as with TXC_FUSE_GRAPHS=0 (the values are "
                  f"the same). Please report it.", RuntimeWarning, stacklevel=2)


def _apart(chain, params, last=None, binds=None):
    """Runs the chain's segments one launch each, then `last` on `binds`
    (launch()'s), where their fused executable failed: chain.outs all
    theirs; returns last's outputs."""
    outs = []

    def bound(b):  # (a segment's binds: the chain's parameters, or outputs of the segments before)
        return [params[a] if a >= 0 else outs[-1 - a] for a in b]
    try:
        for seg, b in zip(chain.segs, chain.binds):
            o, _ = executor.run_recorded(executor.Launch(seg.exe, bound(b)), read_checks=False)
            outs.extend(o)
        chain.outs = chain.spread(outs, frozenset())
        if last is None:
            return None
        o, _ = executor.run_recorded(last._replace(params=bound(binds)), read_checks=False)
    except BaseException as e:
        chain.error = e
        raise
    return o
