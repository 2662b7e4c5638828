"""Deferred checks of what only the device knows: class targets and indices
out of range. torch raises at the op; a lazy trace cannot look at values
without a sync, so a handler that would need one registers instead a 0-d bool
"violated" tensor with its error message (require()). The next sync computes
the pending checks with the rest of the graph (one extra bool output each);
their values are read on the host when they are ready anyway — at once with
sync(wait=True) or when a value is fetched (.item(), .cpu(), print), else at
the start of a following sync that finds them ready, at the latest two syncs
later (verify(block=False): a sync does not wait for the previous step's
device work) — and the first violated check raises its message, which names
the op. Results of that sync are still assigned, but the
error says the step computed with invalid input. Inside a scan body (traced on
placeholders) checks are not made.

Threads: the pending list is shared (a sync computes every thread's checks);
a handler's checks are staged per thread until it returns, and a sync moves
exactly the checks it computed (see torch_xla_core/_execution/executor.py)."""
import contextlib
import functools
import threading

from .. import _C
from .._runtime import runtime



def _make(op, operands, attrs=()):  # a LazyTensor (this module loads before _tensor)
    return _C.op(op, operands, attrs, True)

_OP = _C.op_ids()
_ANY, _OR, _LT, _GE = _OP["any"], _OP["logical_or"], _OP["lt"], _OP["ge"]

_pending = []    # (LazyTensor bool, message, exception type): not yet computed
_computed = []   # the same, holding device data, not yet read
_suspended = 0
_lock = threading.Lock()
_local = threading.local()  # .staging: this thread's handlers' checks, innermost last


@contextlib.contextmanager
def suspended():
    """No checks while tracing graphs that are not run on their own (scan bodies)."""
    global _suspended
    _suspended += 1
    try:
        yield
    finally:
        _suspended -= 1


def staged(handler):
    """Decorates a handler: the checks it required are dropped if it raises
    (the op failed, so they check nothing)."""
    @functools.wraps(handler)
    def h(*args, **kwargs):
        stack = getattr(_local, "staging", None)
        if stack is None:
            stack = _local.staging = []
        stack.append([])
        try:
            r = handler(*args, **kwargs)
        except BaseException:
            stack.pop()
            raise
        mine = stack.pop()
        if mine:
            if stack:
                stack[-1].extend(mine)
            else:
                with _lock:
                    _pending.extend(mine)
        return r
    return h


def require(violated, message, exc=IndexError):
    """Raise exc(message) at the sync that finds `violated` (a bool LazyTensor
    of any shape: any true element) true."""
    if _suspended:
        return
    if violated.shape:
        violated = _make(_ANY, (violated,), ([], False))
    stack = getattr(_local, "staging", None)
    if stack:
        stack[-1].append((violated, message, exc))
    else:
        with _lock:
            _pending.append((violated, message, exc))


def out_of_range(index, low, high):
    """Bool LazyTensor: where the integer LazyTensor `index` is outside [low, high)."""
    return _make(_OR, (_make(_LT, (index, low), ()), _make(_GE, (index, high), ())), ())


def snapshot():
    """The checks pending now: a sync computes them with its graph."""
    with _lock:
        return list(_pending)


_generation = 0  # syncs started that did not wait (verify(block=False) calls)


def computed(checks):
    """After a sync assigned its results: these checks (its snapshot) now hold values."""
    done = {id(c) for c in checks}
    with _lock:
        _pending[:] = [c for c in _pending if id(c) not in done]
        _computed.extend((lt, msg, exc, _generation) for lt, msg, exc in checks)


def discard_failed():
    """Drops pending checks whose graph failed (they hold no value to read)."""
    with _lock:
        _pending[:] = [c for c in _pending if c[0].op != "error"]


def verify(block=True):
    """Reads the computed checks; raises the first violated one's error.
    block=False (a sync that does not wait, a replay): reads the checks whose
    values are ready and those of two or more syncs ago (waiting for them if
    need be), and keeps the rest for a later call, so that the host launches
    step N+1 while step N still runs (at most two steps in flight) instead of
    waiting for step N's checks."""
    global _generation
    if not block:
        _generation += 1
    if not _computed:
        return
    with _lock:
        checks = list(_computed)
        _computed.clear()
        if not block:
            keep = [c for c in checks if c[3] >= _generation - 1 and not _ready(c[0])]
            _computed.extend(keep)
            kept = {id(c) for c in keep}
            checks = [c for c in checks if id(c) not in kept]
    for lt, message, exc, _ in checks:
        if bool(runtime.to_host(lt.data)):
            raise exc(message + " (found when the graph was computed; results of that step are invalid)")


def _ready(lt) -> bool:
    try:
        return lt.data.is_ready()
    except Exception:  # noqa: BLE001  (a buffer that cannot say: read it)
        return True


def clear():
    with _lock:
        _pending.clear()
        _computed.clear()
