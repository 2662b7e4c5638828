"""aten -> core op mapping. Each module here registers handlers for a family
of aten overloads with @impl; resolve() derives what is not registered:
in-place and out= variants from the functional handler, the long tail from
torch._decomp decompositions, and finally a CPU fallback that is counted in
metrics and warned about once per op."""
import torch

from .. import _C, _tensor, metrics
from .._dtypes import UnsupportedDtype
from .._tensor import DIRECT, HANDLERS, OP, XlaTensor

aten = torch.ops.aten

ANY, XLA = -1, -2  # operand codes of a direct recipe: anything the core takes; an xla tensor of any rank


class Arg:
    """In a direct recipe's attrs: the value of positional arg `i`."""

    def __init__(self, i):
        self.i = i


def direct(op, nargs, *, operands=None, ranks=None, attrs=(), view=False):
    """A direct recipe: a call with exactly `nargs` positional args and no
    kwargs is core op `op` over the args at `operands` (default: all, in order)
    with attributes `attrs` (constants, or Arg(i) for positional arg i);
    `ranks` gives per operand ANY, XLA or the rank it must have; `view` makes
    it a view of operand 0. The C++ dispatcher runs it without entering
    Python; calls that do not fit (or that the core refuses) go to the
    handler, so a recipe must build exactly what its handler builds for the
    calls it fits (tests/test_dispatch.py checks that for every recipe)."""
    operands = tuple(range(nargs)) if operands is None else tuple(operands)
    ranks = (ANY,) * len(operands) if ranks is None else tuple(ranks)
    layout = tuple(a.i if isinstance(a, Arg) else -1 for a in attrs)
    constants = tuple(a for a in attrs if not isinstance(a, Arg))
    return (getattr(OP, op), nargs, operands, ranks, layout, constants, view)


def impl(*overloads, direct=None):
    """Registers the decorated function as the handler of the given overloads
    (OpOverloads, or OpOverloadPackets meaning all of their overloads), and
    `direct` (see direct()) as their recipe."""
    def deco(fn):
        for o in overloads:
            if isinstance(o, torch._ops.OpOverloadPacket):
                assert direct is None, "a direct recipe needs single overloads"
                for name in o.overloads():
                    HANDLERS[getattr(o, name)] = fn
            else:
                HANDLERS[o] = fn
                if direct is not None:
                    DIRECT[o] = direct
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
    from . import complex, fft  # noqa: F401
