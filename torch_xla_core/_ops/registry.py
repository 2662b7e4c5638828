"""How the op modules declare their handlers (the registry of the ops
layer): mapping() for an aten overload that is one core op (a table row; the
C++ dispatcher runs it without entering Python), @impl for a Python handler,
decomposed() for overloads torch's decompositions run, impl_by_name() for
custom ops of libraries we do not import. They write table.py's HANDLERS and
BY_NAME; resolution.py finds the handlers of every other overload, and of
the calls a mapping without an @impl handler does not fit (Rest, on first
use). The tables sit in table.py, below both, so that this module can
import resolution.py without a circle."""
import torch

from .. import _C
from .._runtime import torch_compat as _compat
from .._tracing.tensor import OP
from . import dtype_rules
from .resolution import resolve
from .table import HANDLERS, declare, declare_by_name, declared

ANY, XLA = -1, -2  # operand kinds of a mapping: anything the core takes; an xla tensor of any rank


class Arg:
    """In a mapping's attrs: the value of the overload's argument `which` (its
    position or its schema name; a keyword-only one is read from kwargs). An
    absent optional argument takes `default`, else its schema default."""

    def __init__(self, which, default=None):
        self.which, self.default = which, default


_CONSTANT, _POSITIONAL, _KEYWORD = 0, 1, 2


def _attr_spec(func, a):
    """(source, arg index, keyword name, has value, value) for _C.Mapping."""
    if not isinstance(a, Arg):
        return (_CONSTANT, -1, None, True, a)
    args = func._schema.arguments
    if isinstance(a.which, int):
        i = a.which
    else:
        names = [x.name for x in args]
        if a.which not in names:
            raise ValueError(f"mapping of {func}: it has no argument {a.which!r} (its arguments: {names})")
        i = names.index(a.which)
    x = args[i]
    default = a.default if a.default is not None else x.default_value
    if x.kwarg_only:
        return (_KEYWORD, -1, x.name, True, default)
    return (_POSITIONAL, i, None, default is not None, default)


def _mapping(func, op, operands, ranks, attrs, view, check, rest):
    positional = [x for x in func._schema.arguments if not x.kwarg_only]
    required = sum(1 for x in positional if not x.has_default_value())
    specs = [_attr_spec(func, a) for a in attrs]
    from_args = {s[1] for s in specs if s[0] == _POSITIONAL}
    operands = tuple(i for i in range(required) if i not in from_args) if operands is None else tuple(operands)
    ranks = (ANY,) * len(operands) if ranks is None else tuple(ranks)
    if len(ranks) != len(operands):
        raise ValueError(f"mapping of {func}: {len(operands)} operands but {len(ranks)} ranks")
    used = set(operands) | {s[1] for s in specs if s[0] == _POSITIONAL}
    for i in range(required):
        if i not in used:
            raise ValueError(f"mapping of {func}: its argument {positional[i].name!r} is neither an operand nor an "
                             f"attribute")
    max_args = max([required] + [s[1] + 1 for s in specs if s[0] == _POSITIONAL])
    return _C.Mapping(getattr(OP, op), str(func), required, max_args, list(zip(operands, ranks)), specs, view,
                      check, rest)


class Rest:
    """The rest handler of a mapping without an @impl one: torch's
    decomposition or the CPU fallback (resolution.resolve), found on first use."""

    def __init__(self, func):
        self.func, self.h = func, None

    def __call__(self, *args, **kwargs):
        if self.h is None:
            self.h = resolve(self.func)
        return self.h(*args, **kwargs)


def mapping(*overloads, op, operands=None, ranks=None, attrs=(), view=False, check=None, refuses=None):
    """Declares aten overloads that are one core op, `op` (csrc/ops: its row):
    the overload's positional args at `operands` (default: every required
    positional arg, in order) are the core operands, `ranks` says per operand
    what it must be (ANY: anything the core takes, the default; XLA: an xla
    tensor; n: an xla tensor of rank n), `attrs` are the core attributes
    (constants, or Arg(name or index) for an argument of the call), `view`
    makes the result a view of operand 0 sharing its storage.

    This one declaration is both the C++ fast path (csrc/py/mapping.cpp: the
    dispatcher runs it without entering Python) and the overload's handler
    (a _C.Mapping is callable: the same code). A call it does not fit (another
    keyword, operand kind or rank) goes to `check(*args, **kwargs)` (raise
    torch's error for calls torch refuses), then to the overload's @impl
    handler if it has one (the real logic, e.g. add's alpha), else torch's
    decomposition or the CPU fallback. When the core refuses a call that
    fits, `check` may word the error; else the core's error is raised.
    `refuses`: the input dtypes torch's own kernels refuse (dtype_rules).
    Returns the first overload's Mapping (callable like a handler)."""
    first = None
    dtype_rules.declare(overloads, refuses)
    for o in _compat.present(overloads):
        h = HANDLERS.get(o)
        explicit = h is not None and not isinstance(h, _C.Mapping)
        m = _mapping(o, op, operands, ranks, attrs, view, check, h if explicit else Rest(o))
        if isinstance(h, _C.Mapping):
            raise ValueError(f"mapping of {o}: it is declared twice (onto core ops '{h.op}' and '{op}'): keep one")
        declare(o, m)
        first = first or m
    _C.dispatch_clear()
    return first


def impl(*overloads, refuses=None):
    """Registers the decorated function as the handler of the given overloads
    (OpOverloads, or OpOverloadPackets meaning all of their overloads). For an
    overload declared with mapping(), it handles the calls the mapping does
    not fit. `refuses`: the input dtypes torch's own kernels refuse
    (dtype_rules: INTEGRAL, INTEGRAL_PROMOTED, BOOL)."""
    def deco(fn):
        dtype_rules.declare(overloads, refuses)
        for o in _compat.present(overloads):
            for f in ([getattr(o, n) for n in o.overloads()] if isinstance(o, torch._ops.OpOverloadPacket) else [o]):
                h = HANDLERS.get(f)
                if isinstance(h, _C.Mapping) and h.rest is not fn and not isinstance(h.rest, Rest):
                    h = h.rest  # (a second handler for the calls its mapping does not fit: refused below)
                if h is not None and h is not fn and not isinstance(h, _C.Mapping) and declared(f):
                    raise ValueError(f"@impl of {f}: it already has a handler, {_name(h)}; a second one, "
                                     f"{_name(fn)}, would win or lose by import order: keep one")
                h = HANDLERS.get(f)
                if isinstance(h, _C.Mapping):
                    h.rest = fn
                else:
                    declare(f, fn)
        _C.dispatch_clear()
        return fn
    return deco


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


DECOMPOSED = []  # what decomposed() declared


def decomposed(*overloads, refuses):
    """Declares the dtype facts of overloads that have no handler of their
    own: torch's decomposition runs them (resolve(); tests/test_coverage.py
    checks that it does). `refuses` as impl's."""
    dtype_rules.declare(overloads, refuses)
    DECOMPOSED.extend(_compat.present(overloads))


def impl_by_name(qualname):
    """Registers the decorated function as the handler of a library's custom
    op by its qualified name (transformers' opaque MoE matmul), resolved when
    the op first reaches the dispatcher: we do not import the library."""
    def deco(fn):
        declare_by_name(qualname, fn)
        return fn
    return deco

