"""aten -> core op mapping. Each module here registers handlers for a family
of aten overloads with @impl; resolve() derives what is not registered:
in-place and out= variants from the functional handler, the long tail from
torch._decomp decompositions, and finally a CPU fallback that is counted in
metrics and warned about once per op. Overloads that are exactly one core
op are declared once with mapping() (a table row; no handler to write)."""
import torch

from .. import _C, _tensor, metrics
from .._dtypes import UnsupportedDtype
from .._tensor import HANDLERS, OP, XlaTensor

aten = torch.ops.aten

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


class _Rest:
    """The rest handler of a mapping without an @impl one: torch's
    decomposition or the CPU fallback (resolve()), found on first use."""

    def __init__(self, func):
        self.func, self.h = func, None

    def __call__(self, *args, **kwargs):
        if self.h is None:
            self.h = resolve(self.func)
        return self.h(*args, **kwargs)


def mapping(*overloads, op, operands=None, ranks=None, attrs=(), view=False, check=None):
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
    Returns the first overload's Mapping (callable like a handler)."""
    first = None
    for o in overloads:
        h = HANDLERS.get(o)
        explicit = h is not None and not isinstance(h, _C.Mapping)
        m = _mapping(o, op, operands, ranks, attrs, view, check, h if explicit else _Rest(o))
        HANDLERS[o] = m
        first = first or m
    _C.dispatch_clear()
    return first


def impl(*overloads):
    """Registers the decorated function as the handler of the given overloads
    (OpOverloads, or OpOverloadPackets meaning all of their overloads). For an
    overload declared with mapping(), it handles the calls the mapping does
    not fit."""
    def deco(fn):
        for o in overloads:
            for f in ([getattr(o, n) for n in o.overloads()] if isinstance(o, torch._ops.OpOverloadPacket) else [o]):
                h = HANDLERS.get(f)
                if isinstance(h, _C.Mapping):
                    h.rest = fn
                else:
                    HANDLERS[f] = fn
        _C.dispatch_clear()
        return fn
    return deco


def call(func, *args, **kwargs):
    """Runs an aten overload on xla tensors without going back through the dispatcher."""
    return _tensor.handler(func)(*args, **kwargs)


def _functional_of(func):
    """For `foo_.X` (in-place) or `foo.out` (out=), the functional overload."""
    name, overload = func._schema.name.split("::")[1], func._overloadname
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    elif overload == "out":
        overload = "default"
    elif overload.endswith("_out"):
        overload = overload[: -len("_out")]
    else:
        return None
    packet = getattr(aten, name, None)
    fn = getattr(packet, overload, None)
    if func._overloadname == "out" and fn is not None and str(fn._schema.arguments[0].type) != "Tensor":
        fn = getattr(packet, "Tensor", None)  # mul.out, div.out: mul.Tensor (mul.default takes numbers)
    return fn


def _mutated_args(func):
    return [i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def resolve(func):
    fn = _functional_of(func)
    if fn is not None and fn is not func and (fn in HANDLERS or fn in _decomps()):
        base = HANDLERS.get(fn) or _decomposed(fn)
        if func._schema.name.endswith("_"):
            return _inplace(base)
        return _out(base, func)
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return _composite(func)
    if func in _decomps():
        return _decomposed(func)
    return _fallback(func)


def _composite(func):
    """Ops with a CompositeImplicitAutograd kernel (e.g. `to.dtype` called from
    inside a decomposition) decompose into the ops they are made of."""
    def h(*args, **kwargs):
        return func.decompose(*args, **kwargs)
    return h


_DECOMPS = None


def _decomps():
    global _DECOMPS
    if _DECOMPS is None:
        from torch._decomp import decomposition_table
        _DECOMPS = decomposition_table
    return _DECOMPS


def _decomposed(func):
    d = _decomps()[func]
    name = "decomposed::" + func._schema.name.split("::")[1]
    fallback = None

    def h(*args, **kwargs):
        nonlocal fallback
        try:
            r = d(*args, **kwargs)
        except UnsupportedDtype as e:  # e.g. torch.complex: name it, not the new_empty inside
            raise e.at(func._schema.name) from None
        if r is NotImplemented:  # the decomposition declined these inputs
            if fallback is None:
                fallback = _fallback(func)
            return fallback(*args, **kwargs)
        metrics.counter_add(name)
        return r
    return h


def _inplace(base):
    def h(self, *args, **kwargs):
        r = base(self, *args, **kwargs)
        assign(self, r)
        return self
    return h


def _out(base, func):
    names = [a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write]
    fn = _functional_of(func)
    # a factory's out= variant (linspace.out, ...) makes its result on out's device
    factory = fn is not None and any(a.name == "device" for a in fn._schema.arguments)

    def h(*args, **kwargs):
        outs = [kwargs.pop(n) for n in names]
        if factory and kwargs.get("device") is None:
            kwargs["device"] = outs[0].device
        r = base(*args, **kwargs)
        rs = r if isinstance(r, (tuple, list)) else (r,)
        for o, x in zip(outs, rs):
            if tuple(o.shape) != tuple(x.shape):
                _tensor.set_meta(o, x.shape)
                lt = x._lt if o.dtype == x.dtype else convert(x, o.dtype)._lt
                # o is contiguous: a view result gets a storage of its own
                o._lt = _tensor._make(OP.alias, (lt,), ()) if lt.is_view else lt.alias()
            else:
                assign(o, x)
        return outs[0] if len(outs) == 1 else tuple(outs)
    return h


def convert(x: XlaTensor, dtype: torch.dtype) -> XlaTensor:
    if x.dtype == dtype:
        return x
    from .._dtypes import code
    return _tensor.op("convert", x, attrs=(code(dtype),))


def assign(self: XlaTensor, r) -> None:
    """In-place write of r (an xla tensor or number) into self, with torch's
    casting and broadcasting rules for in-place ops."""
    if not isinstance(r, XlaTensor):
        r = full_like(self, r)
    if r.dtype != self.dtype:
        if not torch.can_cast(r.dtype, self.dtype):
            raise RuntimeError(f"result type {_tname(r.dtype)} can't be cast to the desired output type "
                               f"{_tname(self.dtype)}")
        r = convert(r, self.dtype)
    if r.shape != self.shape:
        try:
            shape = torch.broadcast_shapes(r.shape, self.shape)
        except RuntimeError:
            shape = None
        if shape != self.shape:
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                               f"{list(shape) if shape is not None else list(r.shape)}")
        r = _tensor.wrap(_tensor._view(_tensor.OP.expand, r._lt, (list(self.shape),)))
        r = _tensor.op("alias", r)
    self._lt.assign(r._lt)


def _tname(dt):
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
            torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char",
            torch.uint8: "Byte", torch.bool: "Bool", torch.complex64: "ComplexFloat",
            torch.complex128: "ComplexDouble"}.get(dt, str(dt))


def full_like(x, value, dtype=None):
    from .factory import full
    return full(list(x.shape), value, dtype or x.dtype)


_VIEW_KEYS = [torch._C.DispatchKey.Conjugate, torch._C.DispatchKey.Negative, torch._C.DispatchKey.ZeroTensor]


class _cpu_view_keys:
    """Inside __torch_dispatch__ torch excludes the dispatch keys above Python,
    among them Conjugate/Negative/ZeroTensor: a CPU kernel that makes conj
    views internally (linalg.pinv's mH) would then ignore the conjugate bit
    and return wrong values. The fallback's CPU call re-enables them."""

    def __enter__(self):
        self.saved = [torch._C._dispatch_tls_is_dispatch_key_excluded(k) for k in _VIEW_KEYS]
        for k in _VIEW_KEYS:
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, False)

    def __exit__(self, *exc):
        for k, was in zip(_VIEW_KEYS, self.saved):
            torch._C._dispatch_tls_set_dispatch_key_excluded(k, was)


def _fallback(func):
    ns, base = func._schema.name.split("::")
    name = (base if ns == "aten" else f"{ns}::{base}") + (
        "." + func._overloadname if func._overloadname != "default" else "")
    mutated = _mutated_args(func)

    def to_cpu(x):
        return _tensor.to_cpu(x) if isinstance(x, XlaTensor) else x

    def to_xla(x):
        return _tensor.from_cpu(x) if isinstance(x, torch.Tensor) else x

    def h(*args, **kwargs):
        metrics.counter_add("fallback::" + name)
        _tensor.warn_once(name, f"torch_xla_core: {func._schema.name} has no XLA lowering; it runs on the CPU "
                                f"(slow: device->host->device). Counted in metrics.fallbacks().")
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        cpu_flat = [to_cpu(x) for x in flat]
        cargs, ckwargs = torch.utils._pytree.tree_unflatten(cpu_flat, spec)
        if mutated:  # host copies the CPU kernel may write and resize (a view of device memory may not be resized)
            cargs = list(cargs)
            for i in mutated:
                if i < len(cargs) and isinstance(cargs[i], torch.Tensor):
                    cargs[i] = cargs[i].clone()
                elif i < len(cargs) and isinstance(cargs[i], (list, tuple)):
                    cargs[i] = [c.clone() if isinstance(c, torch.Tensor) else c for c in cargs[i]]
        try:
            with _cpu_view_keys():
                r = func(*cargs, **ckwargs)
        except NotImplementedError as e:
            raise NotImplementedError(f"{func._schema.name} is not supported on the xla device: it has no XLA lowering "
                                      f"and no CPU fallback ({e})") from None
        try:
            # Write back mutated arguments.
            for i in mutated:  # a Tensor or a Tensor[] (foreach, fused optimizers)
                if i < len(args) and isinstance(args[i], XlaTensor):
                    if args[i].shape != cargs[i].shape:  # resized by the kernel
                        _tensor.set_meta(args[i], cargs[i].shape)
                        args[i]._lt = _tensor.from_cpu(cargs[i])._lt
                    else:
                        assign(args[i], _tensor.from_cpu(cargs[i]))
                elif i < len(args) and isinstance(args[i], (list, tuple)):
                    for x, c in zip(args[i], cargs[i]):
                        if isinstance(x, XlaTensor):
                            assign(x, _tensor.from_cpu(c))
            if mutated and isinstance(r, torch.Tensor) and r is cargs[mutated[0]]:
                return args[mutated[0]]
            return torch.utils._pytree.tree_map(to_xla, r)
        except UnsupportedDtype as e:  # a complex result (torch.complex, fft, view_as_complex)
            raise e.at(func._schema.name) from None
    return h


def load_all():
    """Imports every op family (each registers its handlers). An import error
    surfaces: a missing module would otherwise turn its ops into CPU fallbacks."""
    from . import elementwise, reduce, shape, factory, linalg, nn, index, random, conv, rnn, upsample, moe  # noqa: F401
    from . import foreach, einsum  # noqa: F401
    from . import linalg_lapack  # noqa: F401
    from . import special  # noqa: F401
    from . import order, misc, nn_extra, nn_grads, transformer  # noqa: F401
    from . import complex, fft, quantize  # noqa: F401
