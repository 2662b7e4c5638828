"""How an aten overload finds its handler (the resolution of the ops layer):
handler() returns the declared one (registry.py) or resolves one on first
use (resolve(), the answer route() gives): in-place and out= variants
derived from the functional overload's handler (checks.staged), torch's
composite kernel or decomposition, a custom op's impl_by_name handler, and
finally a CPU fallback that is counted in metrics and warned about once per
op. Also what the C++ dispatcher asks (entry, the overlap checks of ops that
write an argument) and the write helpers the handlers share (assign,
convert, full)."""
import torch
from torch._decomp import decomposition_table

from .. import _C, metrics
from .._tracing import checks as _checks, tensor as _tensor
from .._runtime import torch_compat as _compat
from .._runtime.dtypes import UnsupportedDtype, code
from .._tracing.tensor import OP, XlaTensor, wrapped_op
from . import dtype_rules
from .dtype_rules import type_name  # noqa: F401  (re-exported: the handlers name dtypes by it)
from .table import BY_NAME, HANDLERS, aten, declared, resolving


def handler(func):
    """The handler of an aten overload (resolving it on first use)."""
    h = HANDLERS.get(func)
    if h is None:
        h = HANDLERS[func] = resolve(func)
    return h


def entry(func):
    """What the C++ dispatcher caches for func: its handler, and whether it
    checks first that no other argument partly overlaps the tensor an
    in-place op writes (check_each_input)."""
    h = dtype_rules.guard(func, handler(func))  # the dtypes torch's kernels refuse (most ops: h itself)
    return h, func in SELF_CHECKED


def _check_writes(written, inputs):
    """The dispatcher's overlap check of an in-place op, called from C++ once
    its own pass found an input sharing written's storage."""
    check_each_input(written, inputs)


def install_dispatch() -> None:
    """Hands the dispatch table to the C++ dispatcher (at import: _install.py)."""
    _C.configure_dispatch(entry, _check_writes)

def call(func, *args, **kwargs):
    """Runs an aten overload on xla tensors without going back through the dispatcher."""
    return handler(func)(*args, **kwargs)

def functional_of(func):
    """For `foo_.X` (in-place) or `foo.out` (out=, whatever the overload's
    name: linalg_inv_ex.inverse), the functional overload."""
    name, overload = func._schema.name.split("::")[1], func._overloadname
    if name.endswith("_") and not name.endswith("__"):
        name = name[:-1]
    elif overload == "out":
        overload = "default"
    elif overload.endswith("_out"):
        overload = overload[: -len("_out")]
    elif any(a.kwarg_only and _written(a) for a in func._schema.arguments):
        overload = None  # found by its arguments below
    else:
        return None
    packet = getattr(aten, name, None)
    if isinstance(packet, _compat.Absent):  # _fill_mem_eff_dropout_mask_ has no functional op
        packet = None
    fn = getattr(packet, overload, None) if overload else None
    if func._overloadname == "out" and fn is not None and str(fn._schema.arguments[0].type) != "Tensor":
        fn = getattr(packet, "Tensor", fn)  # mul.out, div.out: mul.Tensor (mul.default takes numbers)
    if ((fn is None or not _takes_arguments_of(fn, func)) and packet is not None
            and not name.startswith(("_foreach_", "_fused_"))):
        # sum.IntList_out: sum.dim_IntList; pow_.Tensor: pow.Tensor_Tensor; arange.start_out: arange.start_step
        fn = next((f for f in (getattr(packet, ov) for ov in packet.overloads()) if _takes_arguments_of(f, func)),
                  None)
    return fn


def _written(a) -> bool:
    return a.alias_info is not None and a.alias_info.is_write


def _takes_arguments_of(fn, func) -> bool:
    """Whether fn, not an out= overload itself, takes func's arguments (less
    its out= ones), in order, as func names and types them, plus only
    keyword-only ones (a factory's dtype=, device=): func's functional form."""
    want = [(a.name, str(a.type)) for a in func._schema.arguments if not (a.kwarg_only and _written(a))]
    have = [(a.name, str(a.type)) for a in fn._schema.arguments]
    extra = [a for a in fn._schema.arguments if a.kwarg_only and (a.name, str(a.type)) not in want]
    return (fn is not func and not any(a.kwarg_only and _written(a) for a in fn._schema.arguments)
            and len(have) == len(want) + len(extra) and [h for h in have if h in want] == want)


def _mutated_args(func):
    """The args func writes: (position, None) or, for a keyword-only one (out=), (None, name)."""
    return [(None, a.name) if a.kwarg_only else (i, None) for i, a in enumerate(func._schema.arguments)
            if _written(a)]


# In-place overloads whose handler resolve() derived and that get torch's
# overlap check of self against their other args: the C++ dispatcher runs it
# (csrc/py/dispatch.cpp; one pass over the args, no Python frame per op).
SELF_CHECKED = set()

def resolve(func):
    """The handler of an overload that has none registered (see the module doc)."""
    resolving(func)
    return _overlap_checked(func, _derive(func))


# How resolve() runs an overload without a declared handler (route()); the
# coverage table (coverage.py) reads the same answer.
DERIVED, COMPOSITE, DECOMPOSITION, BY_NAME_HANDLER, FALLBACK = (
    "derived", "composite", "decomposition", "by name", "fallback")


def route(func):
    """(how, functional): DERIVED with the functional overload whose handler
    an in-place or out= variant writes through, else (how, None): COMPOSITE
    (torch's CompositeImplicitAutograd kernel), DECOMPOSITION (torch._decomp),
    BY_NAME_HANDLER (impl_by_name), FALLBACK (the CPU)."""
    fn = functional_of(func)
    if fn is not None and fn is not func and (declared(fn) or fn in decomposition_table or not _is_view(fn)):
        # in-place and out= variants: the functional overload's handler (whichever way it resolves), then
        # the write; a view's (detach_) only where it has a handler of its own
        return DERIVED, fn
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"):
        return COMPOSITE, None
    if func in decomposition_table:
        return DECOMPOSITION, None
    if func._schema.name in BY_NAME and func._overloadname == "default":
        return BY_NAME_HANDLER, None
    return FALLBACK, None


def _derive(func):
    how, fn = route(func)
    if how == DERIVED:
        base = handler(fn)
        # staged: the functional op's deferred checks are dropped when writing its result fails
        return _checks.staged(_inplace(base) if func._schema.name.endswith("_") else out_variant(base, func))
    if how == COMPOSITE:
        return _composite(func)
    if how == DECOMPOSITION:
        return _decomposed(func)
    if how == BY_NAME_HANDLER:
        return BY_NAME[func._schema.name]
    return fallback(func)


def _is_view(fn) -> bool:
    return bool(fn._schema.returns) and fn._schema.returns[0].alias_info is not None


def _composite(func):
    """Ops with a CompositeImplicitAutograd kernel (e.g. `to.dtype` called from
    inside a decomposition) decompose into the ops they are made of."""
    def h(*args, **kwargs):
        return func.decompose(*args, **kwargs)
    return h


def _decomposed(func):
    d = decomposition_table[func]
    name = "decomposed::" + func._schema.name.split("::")[1]
    on_cpu = None

    def h(*args, **kwargs):
        nonlocal on_cpu
        try:
            r = d(*args, **kwargs)
        except UnsupportedDtype as e:  # e.g. torch.complex: name it, not the new_empty inside
            raise e.at(func._schema.name) from None
        if r is NotImplemented:  # the decomposition declined these inputs
            if on_cpu is None:
                on_cpu = fallback(func)
            return on_cpu(*args, **kwargs)
        metrics.counter_add(name)
        return r
    return h


def _inplace(base):
    def h(self, *args, **kwargs):
        r = base(self, *args, **kwargs)
        assign(self, r)
        return self
    return h


_OUT_DTYPE = frozenset({"aten::sum", "aten::prod", "aten::cumsum", "aten::cumprod"})


def out_variant(base, func):
    names = [n for _, n in _mutated_args(func) if n is not None]
    fn = functional_of(func)
    # a factory's out= variant (linspace.out, ...) makes its result on out's device
    factory = fn is not None and any(a.name == "device" for a in fn._schema.arguments)
    # sum/prod/cumsum/cumprod(x, out=o) compute in o's dtype, as CPU does (it casts x first: a float x into an
    # int64 o sums truncated values), unless dtype= says otherwise
    in_out_dtype = fn is not None and fn._schema.name in _OUT_DTYPE

    returns = bool(func._schema.returns)

    def h(*args, **kwargs):
        given = [kwargs.pop(n) for n in names]
        # one Tensor[] out= (unbind_copy.out, split_with_sizes_copy.out): its tensors, one per result
        outs = list(given[0]) if len(given) == 1 and isinstance(given[0], (list, tuple)) else given
        if factory and kwargs.get("device") is None:
            kwargs["device"] = outs[0].device
        if factory and kwargs.get("dtype") is None:  # (eye(3, out=int64): an int64 eye, not a float one cast)
            kwargs["dtype"] = outs[0].dtype
        if in_out_dtype and kwargs.get("dtype") is None:
            kwargs["dtype"] = outs[0].dtype
        r = base(*args, **kwargs)
        rs = r if isinstance(r, (tuple, list)) else (r,)
        if len(rs) != len(outs):
            raise RuntimeError(f"{func._schema.name}: expected {len(rs)} tensors in out=, got {len(outs)}")
        for o, x in zip(outs, rs):
            if tuple(o.shape) != tuple(x.shape):
                _check_cast(x.dtype, o.dtype)
                _tensor.set_meta(o, x.shape)
                lt = x._lt if o.dtype == x.dtype else convert(x, o.dtype)._lt
                # o is contiguous: a view result gets a storage of its own
                o._lt = _tensor.lazy_op(OP.alias, (lt,), ()) if lt.is_view else lt.alias()
            else:
                assign(o, x)
        if not returns:
            return None
        return given[0] if len(given) == 1 else tuple(given)
    return h


# Ops whose in-place and out= variants torch computes as if every input were
# read before the write, with no overlap check (as CPU does,
# tests/test_overlap.py): products and solvers written through a separate
# result, and ops that read a tensor arg as a number (masked_fill's and
# index_fill's value). Reductions (torch.Tag.reduction) and composite
# overloads (torch runs the ops they are made of, checked or not each) too.
_COPY_FIRST = frozenset({"mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "mv", "dot", "vdot", "ormqr", "ldexp",
                         "linalg_lu_solve", "linalg_householder_product", "slice_scatter", "masked_scatter",
                         "masked_fill", "index_fill"})


def _overlap_checked(func, h):
    """h, with torch's overlap check first where func writes an argument
    (in-place, out=) that it also reads others for: a written tensor that
    partly overlaps another tensor argument raises, as on CPU, instead of a
    result computed as if the inputs were copied first. An op that writes
    only its self (add_) keeps h: the dispatcher checks it (SELF_CHECKED)."""
    writes = _mutated_args(func)
    name = func._schema.name.split("::")[1]
    if (not writes or name.rstrip("_") in _COPY_FIRST or name.startswith("_foreach_")
            or torch.Tag.reduction in func.tags
            or torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")):
        return h

    if writes == [(0, None)]:
        SELF_CHECKED.add(func)
        return h

    def checked(*args, **kwargs):
        inputs = args + tuple(kwargs.values()) if kwargs else args
        for i, n in writes:
            w = args[i] if i is not None and i < len(args) else kwargs.get(n)
            if isinstance(w, XlaTensor):
                check_writes(w, inputs)
        return h(*args, **kwargs)
    return checked


def _dense(t) -> bool:
    """t's elements fill a block of its storage, each once (torch's
    is_non_overlapping_and_dense): strides, smallest first, are the running
    product of the sizes (dims of size 1 aside)."""
    expect = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expect:
            return False
        expect *= size
    return True


def check_no_partial_overlap(dst, src) -> None:
    """torch's check before writing into dst from src (at::assert_no_partial_overlap):
    two views of one storage whose memory blocks overlap without being the
    same elements raise, as on CPU and CUDA, instead of a result that
    depends on the order of the element writes. Views that are not dense
    blocks are torch's "too hard" case: allowed, as there."""
    if dst._lt.storage_id != src._lt.storage_id or dst.numel() == 0 or src.numel() == 0:
        return
    if not (_dense(dst) and _dense(src)):
        return
    a0, b0 = dst.storage_offset() * dst.element_size(), src.storage_offset() * src.element_size()
    a1, b1 = a0 + dst.numel() * dst.element_size(), b0 + src.numel() * src.element_size()
    if (a0, a1) == (b0, b1) and dst.stride() == src.stride():
        return
    if a0 < b1 and b0 < a1:
        raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                           "refer to a single memory location. Please clone() the tensor before performing the "
                           "operation.")


def check_writes(written, inputs) -> None:
    """The overlap check of an op that writes `written` after reading
    `inputs` (its other args: tensors, numbers, lists of tensors): one C++
    pass finds whether any input shares written's storage at all."""
    if _C.shares_storage(written, inputs):
        check_each_input(written, inputs)


def check_each_input(written, inputs) -> None:
    """check_no_partial_overlap of `written` against each xla tensor in
    inputs (the C++ dispatcher calls it once its own pass found a shared
    storage)."""
    for a in inputs:
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, XlaTensor) and t is not written:
                check_no_partial_overlap(written, t)


def convert(x: XlaTensor, dtype: torch.dtype) -> XlaTensor:
    if x.dtype == dtype:
        return x
    return _tensor.op("convert", x, attrs=(code(dtype),))


def assign(self: XlaTensor, r) -> None:
    """In-place write of r (an xla tensor or number) into self, with torch's
    casting and broadcasting rules for in-place ops."""
    if not isinstance(r, XlaTensor):
        r = full_like(self, r)
    if r.dtype != self.dtype:
        _check_cast(r.dtype, self.dtype)
        r = convert(r, self.dtype)
    if r.shape != self.shape:
        try:
            shape = torch.broadcast_shapes(r.shape, self.shape)
        except RuntimeError:
            shape = None
        if shape != self.shape:
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape "
                               f"{list(shape) if shape is not None else list(r.shape)}")
        r = _tensor.wrap(_tensor.lazy_view(_tensor.OP.expand, r._lt, (list(self.shape),)))
        r = _tensor.op("alias", r)
    self._lt.assign(r._lt)


def _check_cast(result, out) -> None:
    """torch's rule for writing a result of dtype `result` into a tensor of dtype `out`."""
    if result != out and not torch.can_cast(result, out):
        raise RuntimeError(f"result type {type_name(result)} can't be cast to the desired output type "
                           f"{type_name(out)}")


def sizes(shape):
    """A factory's size argument as a list of ints, refused as torch does when negative."""
    shape = [int(s) for s in shape]
    for s in shape:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {shape}")
    return shape


# The numbers torch fills an integer dtype with (c10's checked_convert): in
# range, or for uint8 an integer down to -255 (wrapped: -2 fills 254; a
# negative float overflows); NaN never.
_INT_FILL = {torch.uint8: (-255, 255, "uint8_t"), torch.int8: (-2**7, 2**7 - 1, "int8_t"),
             torch.int16: (-2**15, 2**15 - 1, "int16_t"), torch.int32: (-2**31, 2**31 - 1, "int"),
             torch.int64: (-2**63, 2**63 - 1, "int64_t")}


def check_fill(value, dtype):
    """Refuses a number that dtype cannot hold, as torch's fills do (full, fill_, masked_fill, scatter)."""
    lim = _INT_FILL.get(dtype)
    if lim is None or not isinstance(value, (int, float)):
        return
    lo, hi = lim[:2]
    if isinstance(value, float):
        lo, hi = (0.0 if dtype == torch.uint8 else float(lo)), float(hi)
    if not lo <= value <= hi:
        raise RuntimeError(f"value cannot be converted to type {lim[2]} without overflow")


def full(shape, value, dtype):
    """A new value of `shape` filled with `value` (a factory's core), refused
    as torch refuses a number the dtype cannot hold."""
    check_fill(value, dtype)
    if isinstance(value, complex) or dtype.is_complex:  # the imaginary part rides as a 4th attribute
        value = complex(value)
        if not dtype.is_complex:
            raise RuntimeError(f"value cannot be converted to type {dtype} without overflow: a complex fill value "
                               f"{value} for a real tensor")
        return wrapped_op(OP.full, (), (value.real, code(dtype), sizes(shape), value.imag))
    return wrapped_op(OP.full, (), (float(value), code(dtype), sizes(shape)))


def full_like(x, value, dtype=None):
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


def fallback(func):
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
        cargs, written = list(cargs), []  # written: (xla arg, its host copy), a Tensor or a Tensor[] each
        for i, n in mutated:  # host copies the CPU kernel may write and resize (device memory's view may not)
            if i is not None and i < len(args):
                x, c = args[i], cargs[i]
            elif n in kwargs:
                x, c = kwargs[n], ckwargs[n]
            else:
                continue
            if isinstance(c, torch.Tensor):
                c = c.clone()
            elif isinstance(c, (list, tuple)):
                c = [t.clone() if isinstance(t, torch.Tensor) else t for t in c]
            if i is not None and i < len(args):
                cargs[i] = c
            else:
                ckwargs[n] = c
            written.append((x, c))
        try:
            with _cpu_view_keys():
                r = func(*cargs, **ckwargs)
        except NotImplementedError as e:
            raise NotImplementedError(f"{func._schema.name} is not supported on the xla device: it has no XLA lowering "
                                      f"and no CPU fallback ({e})") from None
        try:
            mine = {}  # id(host copy) -> the xla tensor it is written back to (and returned as)
            for x, c in written:  # (foreach and fused optimizers write Tensor[]s)
                for xt, ct in (zip(x, c) if isinstance(x, (list, tuple)) else ((x, c),)):
                    if not isinstance(xt, XlaTensor):
                        continue
                    if xt.shape != ct.shape:  # resized by the kernel
                        _tensor.set_meta(xt, ct.shape)
                        xt._lt = _tensor.from_cpu(ct)._lt
                    else:
                        assign(xt, _tensor.from_cpu(ct))
                    mine[id(ct)] = xt
            return torch.utils._pytree.tree_map(
                lambda t: mine[id(t)] if id(t) in mine else to_xla(t), r)
        except UnsupportedDtype as e:  # a complex result (torch.complex, fft, view_as_complex)
            raise e.at(func._schema.name) from None
    return h
