"""The "graph grows without bound" trap, named. A loop that reads a value
(loss.item()) but never syncs leaves everything else pending: the read
computes the loss alone, the parameter updates stay pending, and the next
step's loss is computed from them, so each read's graph holds every earlier
step (a new compile each step, each slower than the last; torch_xla has the
same trap, silently).

The signal, from the executor's syncs (sync() calls note()): between two
full syncs (txc.sync(), which leaves nothing pending), a read is "trapped"
when its graph is larger than the previous read's and it computed again a
pending computation that was already pending at the previous read. That
computation is found by the device buffers it reads that no tensor holds
any more, only pending values (a parameter's buffer before an update that
was never materialized: GraphCut.donations() of the pending graph names
them): the same such buffer left pending after the previous read and after
this one, and read by this read's graph. GROWING trapped reads in a row are
the trap. The first time, a warning names the cause, the user's line and
the fix; every trapped read from then on counts in metrics
("growing_graph"). Normal loops never get there: a full sync resets the
count; reads of a fixed-shape step (gradient accumulation too) compile one
graph that does not grow; a graph that grows but recomputes nothing left
from an earlier read (a sequence getting longer) is no trap. A read whose
graph did not grow costs two integer comparisons; one that did, one cut of
the pending graph (a C++ walk) and its buffer list."""
import warnings

from .. import _C, metrics
from . import recompiles

GROWING = 4     # trapped reads in a row that make the trap

_last_read = None      # nodes of the previous read's graph since the last full sync, or None
_last_stale = None     # ids of the buffers only pending values held after the previous read (None: not looked at)
_streak = 0            # trapped reads in a row
_warned = False


def _stale_buffers(devices) -> set:
    """ids of the device buffers that only pending values read: no tensor
    holds them (the pending graph's donatable parameters)."""
    out = set()
    for d in devices:
        cut = _C.GraphCut(None, d)
        donated = cut.donations()  # before params(): a Python reference to a buffer makes it "held elsewhere"
        if donated:
            params = cut.params()
            out.update(id(params[p]) for p, _ in donated)
    return out


def note(read: bool, cuts) -> None:
    """Called by the executor after each sync (under its lock): read is True
    for a sync of some tensors (a value read), False for a sync of every live
    tensor; cuts: the GraphCut of each graph it ran."""
    global _last_read, _last_stale, _streak
    if not read:
        _last_read, _last_stale, _streak = None, None, 0
        return
    if not cuts:
        return  # nothing was pending: no graph
    nodes = sum(c.num_nodes for c in cuts)
    grew = _last_read is not None and nodes > _last_read
    _last_read = nodes
    if not grew:
        _last_stale, _streak = None, 0
        return
    stale = _stale_buffers(sorted({max(c.device, 0) for c in cuts}))
    again = stale & _last_stale if _last_stale else set()
    if again:  # ... and this read's graph read them: it computed that pending computation again
        again &= {id(b) for c in cuts for b in c.params()}
    _last_stale = stale
    _streak = _streak + 1 if again else 0
    if _streak >= GROWING:
        _found(nodes)


def _found(nodes: int) -> None:
    global _warned
    metrics.counter_add("growing_graph")
    if _warned:
        return
    _warned = True
    warnings.warn(
        f"torch_xla_core: the graph grows at every value read: {GROWING} reads in a row (the last at "
        f"{recompiles.call_site()}: {nodes} ops) each computed a larger graph than the read before, holding again "
        f"what that read had computed and left pending. Those values are never materialized, so every read computes "
        f"them again with everything done since: a training loop that reads loss.item() but never syncs keeps all "
        f"earlier steps' parameter updates pending, and each step compiles a new, larger graph. Call txc.sync() at "
        f"the end of each step (torch_xla: xm.mark_step()), or run the step under txc.compile. Counted in "
        f"txc.metrics as 'growing_graph'.", RuntimeWarning, stacklevel=recompiles.user_stacklevel())


def reset() -> None:
    """Forgets the reads seen and whether the warning was given (tests)."""
    global _last_read, _last_stale, _streak, _warned
    _last_read, _last_stale, _streak, _warned = None, None, 0, False
