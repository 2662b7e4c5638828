"""call_jax: run a JAX function on xla tensors as ONE node of the lazy graph.

    y = call_jax(jax_fn, x1, x2, block=128)   # tensors positional, the rest static

How: the function is lowered by jax from shapes only
(jax.jit(fn).lower(ShapeDtypeStruct...)), never run; its StableHLO module
becomes the text attribute of a core `jax_call` node (csrc/ops/jax_call.cpp),
with every function symbol renamed to carry a hash of the module's text, so
equal lowerings share one copy in our module and different ones never
collide. The node lowers to a func.call; nothing leaves the device and the
node works inside scan bodies like any other op. No Python object is held
by the IR: the graph's hash covers the text itself.

Lowerings are cached per (fn, static args, shapes, dtypes, x64, matmul
precision); the static args must be hashable.

Dtypes: jax runs with 64-bit types off. When an argument is int64 or
float64 the function is lowered under jax.enable_x64(True), so nothing is
truncated; the results keep whatever dtypes the function gives. Pass
x64=True to lower under x64 anyway (then jnp's default dtypes are 64-bit).

Gradients: if an argument requires grad, the call is a torch.autograd.Function
whose backward is another call_jax, of jax.vjp of the same function (the
forward is recomputed inside the backward's graph; XLA may share it).
Integer arguments get no gradient; integer results take no cotangent.

Refused, with an error before anything compiles: functions that lower to
host callbacks or side effects (jax.debug.print, pure_callback, and the
TPU-interpret mode of Pallas, which simulates the TPU through callbacks):
they cannot live inside our graph."""
import collections
import hashlib
import re
import threading

import jax
import numpy as np
import torch

from .._runtime import dtypes as _dtypes, runtime
from .._execution import spmd as _spmd
from .. import metrics
from .._tracing.tensor import OP, XlaTensor, lazy_op, note_op, wrap
from . import per_shard

__all__ = ["call_jax", "lowered_text", "clear_cache"]

_CACHE = collections.OrderedDict()
_CACHE_SIZE = 256
_lock = threading.Lock()

_TORCH_TO_JAX = {
    torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16", torch.int32: "int32",
    torch.int64: "int64", torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
    torch.float64: "float64", torch.complex64: "complex64", torch.complex128: "complex128",
}
_JAX_TO_TORCH = {v: k for k, v in _TORCH_TO_JAX.items()}
_WIDE = (torch.int64, torch.float64, torch.complex128)
_CALLBACK_MARKERS = ("xla_python_cpu_callback", "xla_ffi_python_cpu_callback", "xla_python_gpu_callback",
                     "xla_ffi_python_gpu_callback", "!stablehlo.token", "tpu_interpret", "callback")
_SYMBOL = re.compile(r"^\s*(?:func\.func|sdy\.mesh)\s+(?:public\s+|private\s+|nested\s+)?@([\w$.\-]+)", re.M)


def clear_cache() -> None:
    """Forgets every cached lowering."""
    with _lock:
        _CACHE.clear()


class _Lowered:
    """One lowering: the renamed function text, its entry, in/out specs."""
    __slots__ = ("funcs", "entry", "in_specs", "out_specs", "out_tree", "attrs")

    def __init__(self, funcs, entry, in_specs, out_specs, out_tree):
        self.funcs, self.entry, self.in_specs, self.out_specs, self.out_tree = funcs, entry, in_specs, out_specs, out_tree
        attrs = [funcs, entry, len(in_specs)]
        for dt, shape in in_specs:
            attrs += [_dtypes.code(dt), list(shape)]
        attrs.append(len(out_specs))
        for dt, shape in out_specs:
            attrs += [_dtypes.code(dt), list(shape)]
        self.attrs = tuple(attrs)


def _name(fn):
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _module_functions(text, fname):
    """The module's top-level ops (its func.func ...), symbols renamed with
    the text's hash; returns (funcs text, entry symbol)."""
    for marker in _CALLBACK_MARKERS:
        if marker in text:
            raise RuntimeError(
                f"call_jax({fname}): the lowered function uses host callbacks or side effects ({marker!r} in its "
                f"StableHLO), which cannot be inlined into the xla graph. Remove jax.debug.print/pure_callback/"
                f"io_callback, and for Pallas TPU kernels on CPU use pl.pallas_call(interpret=True) (plain HLO) "
                f"rather than pltpu.force_tpu_interpret_mode (callbacks).")
    lines = text.rstrip().split("\n")
    if not lines[0].startswith("module") or lines[-1].strip() != "}":
        raise RuntimeError(f"call_jax({fname}): unexpected module text from jax (first line {lines[0][:80]!r})")
    body = "\n".join(lines[1:-1]) + "\n"
    tag = "jx" + hashlib.sha1(text.encode()).hexdigest()[:16]
    names = _SYMBOL.findall(body)
    if "main" not in names:
        raise RuntimeError(f"call_jax({fname}): the lowered module has no @main")
    for n in sorted(set(names), key=len, reverse=True):
        body = re.sub(r"@" + re.escape(n) + r"(?![\w$.\-])", f"@{tag}_{n}", body)
    body = body.replace(f"func.func public @{tag}_main", f"func.func private @{tag}_main", 1)
    return body, f"{tag}_main"


def _lower(fn, fname, args, static_kwargs, x64):
    """jax.jit(fn).lower on shape-only arguments; `args` has torch tensors
    (as (dtype, shape) specs) or static values; returns a _Lowered."""
    dyn = [i for i, a in enumerate(args) if isinstance(a, _Spec)]

    def flat_fn(*arrays):
        full = list(args)
        for i, a in zip(dyn, arrays):
            full[i] = a
        return fn(*full, **static_kwargs)

    shapes = [jax.ShapeDtypeStruct(args[i].shape, np.dtype(_TORCH_TO_JAX[args[i].dtype])
                                   if args[i].dtype != torch.bfloat16 else jax.numpy.bfloat16) for i in dyn]
    # GSPMD's annotations (mhlo.sharding), not Shardy's: the partitioner our
    # compile runs; only functions that shard (PerShard) emit any.
    with jax.enable_x64(bool(x64)), _spmd.gspmd_lowering():
        # for the runtime's platform, which need not be jax's default backend (PJRT_DEVICE=CPU on a GPU host)
        traced = jax.jit(flat_fn, keep_unused=True).trace(*shapes)
        lowered = traced.lower(lowering_platforms=(runtime.platform(),))
        text = lowered.as_text()
        out_info = lowered.out_info
    leaves, tree = jax.tree_util.tree_flatten(out_info)
    out_specs = []
    for k, leaf in enumerate(leaves):
        name = str(leaf.dtype)
        if name not in _JAX_TO_TORCH:
            raise TypeError(f"call_jax({fname}): result {k} has dtype {name}, which has no torch equivalent here")
        out_specs.append((_JAX_TO_TORCH[name], tuple(leaf.shape)))
    funcs, entry = _module_functions(text, fname)
    in_specs = [(args[i].dtype, tuple(args[i].shape)) for i in dyn]
    metrics.counter_add("call_jax_lower")
    return _Lowered(funcs, entry, in_specs, out_specs, tree)


class _Spec:
    """A tensor argument's shape and dtype (what the lowering sees)."""
    __slots__ = ("dtype", "shape")

    def __init__(self, dtype, shape):
        self.dtype, self.shape = dtype, tuple(shape)

    def key(self):
        return (self.dtype, self.shape)


def _lowering(fn, args, static_kwargs, x64=None, key_extra=()):
    fname = _name(fn)
    specs = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            if a.dtype not in _TORCH_TO_JAX:
                raise TypeError(f"call_jax({fname}): argument {i} has dtype {a.dtype}, which jax cannot take here")
            specs.append(_Spec(a.dtype, a.shape))
        else:
            specs.append(a)
    wide = any(isinstance(s, _Spec) and s.dtype in _WIDE for s in specs)
    use_x64 = bool(x64) or wide
    precision = torch.get_float32_matmul_precision()
    try:
        key = (fn, key_extra, _platform(), tuple(s.key() if isinstance(s, _Spec) else ("static", s) for s in specs),
               tuple(sorted(static_kwargs.items())), use_x64, precision)
        hash(key)
    except TypeError:
        raise TypeError(f"call_jax({fname}): static arguments must be hashable (they key the lowering cache); got "
                        f"{[type(s).__name__ for s in specs if not isinstance(s, _Spec)]} positional and "
                        f"{sorted(static_kwargs)} keyword arguments") from None
    with _lock:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            metrics.counter_add("call_jax_cache_hit")
            return hit
    prec = {"highest": "highest", "high": "tensorfloat32", "medium": "bfloat16"}.get(precision, "highest")
    with jax.default_matmul_precision(prec):
        low = _lower(fn, fname, specs, static_kwargs, use_x64)
    with _lock:
        _CACHE[key] = low
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return low


def _platform():
    return runtime.platform()


def _emit(low, tensors, annotate=None):
    """The jax_call node over `tensors` (xla tensors) and its results;
    annotate: (PerShard, one spec per tensor) to give each operand its full
    layout on the mesh (per_shard.annotate)."""
    lts = tuple(t._lt for t in tensors)
    if annotate is not None:
        lts = per_shard.annotate(annotate[0], lts, annotate[1])
    call = lazy_op(OP.jax_call, lts, low.attrs)
    outs = [wrap(lazy_op(OP.jax_result, (call,), (k,))) for k in range(len(low.out_specs))]
    note_op(tensors, outs)  # a scan body being traced sees what the call reads (captures)
    return outs


def _check_tensors(fname, tensors):
    for i, t in enumerate(tensors):
        if not isinstance(t, XlaTensor):
            raise TypeError(f"call_jax({fname}): tensor argument {i} is on {t.device}, not on the xla device; move it "
                            f"with .to('xla') first")


# ---- gradients ---------------------------------------------------------------------

def _vjp_fn(*arrays, fn, args_layout, static_kwargs, diff, out_float, n_primals):
    """JAX: the cotangents of fn's float arguments (positions `diff` among the
    tensor arguments) given the primals and the float results' cotangents."""
    primals, cts = arrays[:n_primals], arrays[n_primals:]

    def f(*d):
        xs = list(primals)
        for j, v in zip(diff, d):
            xs[j] = v
        full, it = [], iter(xs)
        for a in args_layout:
            full.append(next(it) if a is _DYN else a)
        return jax.tree_util.tree_leaves(fn(*full, **dict(static_kwargs)))

    outs, pullback = jax.vjp(f, *[primals[j] for j in diff])
    it = iter(cts)
    cot = [next(it) if fl else np.zeros(o.shape, dtype=jax.dtypes.float0) for o, fl in zip(outs, out_float)]
    return tuple(pullback(cot))


class _Dyn:
    def __repr__(self):
        return "<tensor>"


_DYN = _Dyn()


class _CallJaxFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, args_layout, static_kwargs, x64, *tensors):
        it = iter(tensors)
        args = [next(it) if a is _DYN else a for a in args_layout]
        low = _lowering(fn, args, dict(static_kwargs), x64)
        outs = _emit(low, tensors, (fn, fn.in_specs) if isinstance(fn, per_shard.PerShard) else None)
        ctx.fn, ctx.layout, ctx.static, ctx.x64 = fn, args_layout, static_kwargs, x64
        ctx.out_float = tuple(dt.is_floating_point for dt, _ in low.out_specs)
        ctx.diff = tuple(j for j, t in enumerate(tensors) if t.is_floating_point() and ctx.needs_input_grad[4 + j])
        ctx.save_for_backward(*tensors)
        for o, fl in zip(outs, ctx.out_float):
            if not fl:
                ctx.mark_non_differentiable(o)
        ctx.out_specs = low.out_specs
        return tuple(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        primals = ctx.saved_tensors
        # cotangents of the float results; zeros where nothing depended on one
        cts = [(g if g is not None else torch.zeros(shape, dtype=dt, device=primals[0].device)).contiguous()
               for g, (dt, shape), fl in zip(grads, ctx.out_specs, ctx.out_float) if fl]
        annotate = None
        if isinstance(ctx.fn, per_shard.PerShard):  # the vjp of the per-shard function: its inputs' layouts
            annotate = (ctx.fn, ctx.fn.in_specs + tuple(ctx.fn.out_spec(k, len(shape)) for k, ((_, shape), fl)
                                                         in enumerate(zip(ctx.out_specs, ctx.out_float)) if fl))
        res = call_jax(_vjp_fn, *primals, *cts, fn=ctx.fn, args_layout=ctx.layout, static_kwargs=ctx.static,
                       diff=ctx.diff, out_float=ctx.out_float, n_primals=len(primals), x64=ctx.x64,
                       _differentiable=False, _annotate=annotate)
        grads_in = [None] * len(primals)
        for j, r in zip(ctx.diff, res):
            grads_in[j] = r
        return (None, None, None, None, *grads_in)


def call_jax(fn, /, *args, x64=None, mesh=None, in_specs=None, out_specs=None, check_vma=True,
             _differentiable=True, _annotate=None, **static):
    """fn(*args, **static) computed by jax inside the xla graph.

    Tensor positional arguments (xla tensors) are the function's arrays; other
    positional arguments and all keyword arguments are static (hashable)
    Python values. Returns what fn returns, with jax arrays replaced by xla
    tensors (a tensor, or a tuple/list/dict pytree of them).

    Per shard (SPMD): with in_specs= (a partition spec per tensor argument)
    and out_specs= (one spec, or a list of one per result), fn runs once per
    device of `mesh` (default sharding.get_global_mesh()) on its blocks, as
    jax.shard_map(fn, mesh, in_specs, out_specs, check_vma) does
    (kernels/per_shard.py). mesh, in_specs, out_specs and check_vma are
    therefore not passed to fn."""
    fname = _name(fn)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    _check_tensors(fname, tensors)
    if mesh is not None or in_specs is not None or out_specs is not None:
        fn = per_shard.wrap(fn, fname, tuple(isinstance(a, torch.Tensor) for a in args), tensors, mesh, in_specs,
                            out_specs, check_vma)
        _annotate = (fn, fn.in_specs)
    layout = tuple(_DYN if isinstance(a, torch.Tensor) else a for a in args)
    static_items = tuple(sorted(static.items()))
    grad = (_differentiable and torch.is_grad_enabled()
            and any(t.requires_grad and t.is_floating_point() for t in tensors))
    if grad:
        outs = _CallJaxFn.apply(fn, layout, static_items, x64, *tensors)
        low = _lowering(fn, list(args), static, x64)
    else:
        low = _lowering(fn, list(args), static, x64)
        outs = _emit(low, tensors, _annotate)
    return jax.tree_util.tree_unflatten(low.out_tree, list(outs))


def lowered_text(fn, /, *args, x64=None, **static) -> str:
    """The function text call_jax inlines for these arguments (for debugging)."""
    return _lowering(fn, list(args), static, x64).funcs
