"""Body traces: what tracing a loop body (_ops/scan_trace.py, _ops/scan_policy.py) changes
for the ops it runs, as an explicit stack of contexts instead of swapped
module globals. While a body is traced: a sync raises (the body's tensors are
symbolic: nothing has a value on the host), the device RNG draws chain from
the body's own state (a placeholder: _random.draw), and a nested scan
reports itself to the innermost trace's dispatch mode as one op."""
import contextlib
import threading


class BodyTrace:
    """One body being traced: its dispatch mode (_ops/scan_trace.py BodyMode) and its
    current RNG state (a LazyTensor; draws replace it)."""

    def __init__(self, mode, rng_state):
        self.mode = mode
        self.rng_state = rng_state


_local = threading.local()


def _stack():
    s = getattr(_local, "stack", None)
    if s is None:
        s = _local.stack = []
    return s


def current():
    """The innermost body trace under way on this thread, or None."""
    s = getattr(_local, "stack", None)
    return s[-1] if s else None


@contextlib.contextmanager
def body(mode, rng_state):
    """Traces a body: yields its BodyTrace (read its rng_state at the end)."""
    t = BodyTrace(mode, rng_state)
    s = _stack()
    s.append(t)
    try:
        yield t
    finally:
        s.pop()


def host_error(what):
    return RuntimeError(
        f"scan: fn needs a tensor's value on the host ({what}). Inside scan, fn is traced once on symbolic "
        f"tensors, so .item(), .tolist(), .cpu(), print(), `if tensor:` and other data-dependent Python control "
        f"flow cannot work there; compute with tensor ops instead (e.g. torch.where), or move that code out of fn.")


def check_sync():
    """Raises the scan error when a sync is asked for inside a body trace."""
    if current() is not None:
        raise host_error(".cpu()/.tolist()/print()/sync() inside fn")
