"""The autograd engine hook: torch's engine with the error of an op handler
that raised inside a backward pass kept, and a listener that a txc.compile
recording uses to see the graphs backward consumes. Installed at import
(_install.py) as Variable._execution_engine."""
import torch
from torch.autograd.variable import Variable

from .. import _C


class Engine(torch._C._ImperativeEngine):
    """The autograd engine's Python face (Variable._execution_engine), through
    which Tensor.backward, torch.autograd.backward and torch.autograd.grad all
    run. When an op handler raises inside a backward pass, torch's Python
    device guard (_device._Guard: every query of it calls type_) runs Python while the
    engine unwinds and the pending exception is lost: the engine then raises
    "SystemError: ... returned NULL without setting an exception". The
    dispatcher keeps the handler's exception per thread
    (csrc/py/dispatch.cpp): raise that one instead."""

    backward_listener = None  # fn(roots, keep_graph): a txc.compile recording notes the graphs it consumes

    def run_backward(self, *args, **kwargs):
        if Engine.backward_listener is not None:
            Engine.backward_listener(args[0] if args else kwargs.get("tensors", ()),
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
