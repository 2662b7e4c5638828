"""Deferred checks of what only the device knows: class targets and indices
out of range. torch raises at the op; a lazy trace cannot look at values
without a sync, so a handler that would need one registers instead a 0-d bool
"violated" tensor with its error message (require()). The next sync computes
the pending checks with the rest of the graph (one extra bool output each);
their values are read on the host when they are ready anyway — at once with
sync(wait=True) or when a value is fetched (.item(), .cpu(), print), else at
the start of the following sync — and the first violated check raises its
message, which names the op. Results of that sync are still assigned, but the
error says the step computed with invalid input. Inside a scan body (traced on
placeholders) checks are not made."""
import contextlib
import functools

from . import _C, runtime

_make = _C.make
_OP = _C.op_ids()
_ANY, _OR, _LT, _GE = _OP["any"], _OP["logical_or"], _OP["lt"], _OP["ge"]

_pending = []    # (LazyTensor bool, message, exception type): not yet computed
_computed = []   # the same, holding device data, not yet read
_suspended = 0


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
        n = len(_pending)
        try:
            return handler(*args, **kwargs)
        except BaseException:
            del _pending[n:]
            raise
    return h


def require(violated, message, exc=IndexError):
    """Raise exc(message) at the sync that finds `violated` (a bool LazyTensor
    of any shape: any true element) true."""
    if _suspended:
        return
    if violated.shape:
        violated = _make(_ANY, (violated,), ([], False))
    _pending.append((violated, message, exc))


def out_of_range(index, low, high):
    """Bool LazyTensor: where the integer LazyTensor `index` is outside [low, high)."""
    return _make(_OR, (_make(_LT, (index, low), ()), _make(_GE, (index, high), ())), ())


def roots():
    """The pending checks' tensors: a sync computes them too."""
    return [c[0] for c in _pending]


def computed():
    """After a sync assigned its results: the pending checks now hold values."""
    _computed.extend(_pending)
    _pending.clear()


def verify():
    """Reads the computed checks; raises the first violated one's error."""
    if not _computed:
        return
    checks = list(_computed)
    _computed.clear()
    for lt, message, exc in checks:
        if bool(runtime.to_host(lt.data)):
            raise exc(message + " (found when the graph was computed; results of that step are invalid)")


def clear():
    _pending.clear()
    _computed.clear()
