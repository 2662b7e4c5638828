"""The autograd engine hook: torch's engine with the error of an op handler
that raised inside a backward pass kept, and the graphs backward consumes
told to a txc.compile recording under way (executor.recording). Installed at
import (_install.py) as Variable._execution_engine."""
import torch
from torch.autograd.variable import Variable

from .. import _C
from .._execution import executor
from .._tracing import trace_context as _trace_context


class Engine(torch._C._ImperativeEngine):
    """The autograd engine's Python face (Variable._execution_engine), through
    which Tensor.backward, torch.autograd.backward and torch.autograd.grad all
    run. When an op handler raises inside a backward pass, torch's Python
    device guard (_device._Guard: every query of it calls type_) runs Python while the
    engine unwinds and the pending exception is lost: the engine then raises
    "SystemError: ... returned NULL without setting an exception". The
    dispatcher keeps the handler's exception per thread
    (csrc/py/dispatch.cpp): raise that one instead."""

    def run_backward(self, *args, **kwargs):
        session = executor.recording_session()
        # a txc.compile recording notes the graphs a backward pass consumes; not those of a scan body's trace
        # (its vjp body's torch.autograd.grad): it would hold them, their leaves are body values, and its sync
        # would then read them
        if session is not None and _trace_context.current() is None:
            session.backward(args[0] if args else kwargs.get("tensors", ()),
                             args[2] if len(args) > 2 else kwargs.get("keep_graph", False))
        _C.take_handler_error()
        try:
            return super().run_backward(*args, **kwargs)
        except SystemError as e:
            err = _C.take_handler_error()
            if err is None or "without setting an exception" not in str(e):
                raise
            raise err from None
        finally:
            _C.take_handler_error()  # reported (or harmless): hold no traceback or tensors


def install() -> None:
    """Makes Engine the autograd engine of Tensor.backward, torch.autograd.backward and .grad."""
    if not isinstance(Variable._execution_engine, Engine):
        Variable._execution_engine = Engine()
