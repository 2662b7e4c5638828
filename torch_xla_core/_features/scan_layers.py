"""scan_layers: a stack of identical modules (a transformer's blocks) run as
one scan loop over their stacked parameters (torch_xla_core.scan.scan;
public as torch_xla_core.scan.scan_layers). The layers must share one
structure; the first difference is named in the error."""
import weakref

import torch
import torch.utils._pytree as pytree

from .._ops import scan_policy as _scan_policy
from .._ops.scan import scan_with_consts
from .._ops.scan_trace import identity_key

def _structure(m):
    mods = tuple((n, type(s)) for n, s in m.named_modules())
    params = tuple((n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in m.named_parameters())
    bufs = tuple((n, tuple(b.shape), b.dtype) for n, b in m.named_buffers())
    return mods, params, bufs


def _first_difference(i, s0, s):
    for (what, a, b) in (("submodules", s0[0], s[0]), ("parameters", s0[1], s[1]), ("buffers", s0[2], s[2])):
        if a == b:
            continue
        names_a = [e[0] for e in a]
        names_b = [e[0] for e in b]
        if names_a != names_b:
            extra = sorted(set(names_a) ^ set(names_b))
            return f"layer {i} has different {what} than layer 0 (names {names_b} vs {names_a}; differing: {extra})"
        for ea, eb in zip(a, b):
            if ea != eb:
                return f"layer {i}'s {what[:-1]} '{ea[0]}' is {_fmt(eb)}, layer 0's is {_fmt(ea)}"
    return f"layer {i} differs from layer 0"


def _fmt(e):
    if isinstance(e[1], type):
        return e[1].__name__
    s = f"{str(e[2]).replace('torch.', '')}{list(e[1])}"
    if len(e) > 3:
        s += f" requires_grad={e[3]}"
    return s


def _as_args(x):
    """A tuple input is the layer's positional arguments (layer(*x)), as
    torch.func.functional_call and torch_xla's scan_layers take it."""
    return tuple(x) if isinstance(x, tuple) else (x,)


_TENSOR = object()  # marks where the tensors go among scan_layers' extra arguments
_LAYER_FNS = weakref.WeakKeyDictionary()  # template module -> {static key: fn}


def scan_layers(layers, x, *args, policy="recompute", **kwargs):
    """x = layer(x, *args, **kwargs) for each layer, as one loop (a tuple x
    is unpacked: x = layer(*x, *args, **kwargs), and each layer returns a
    tuple of the same structure, shapes and dtypes). The layers
    (all of the same structure: submodule types, parameter and buffer names,
    shapes, dtypes) are run through one body, traced once on layer 0 with
    torch.func.functional_call over parameters stacked once per step
    (torch.stack, in the graph). args/kwargs are passed to every layer
    unchanged (attention masks, position ids); their tensors are loop
    invariants, the rest is part of the trace key. Each layer must return
    what it was given: x's structure, shapes and dtypes. Gradients reach every layer's parameters.
    policy: as for scan() ("recompute", "save", "offload"; keyword only, not
    passed to the layers)."""
    _scan_policy.check_policy(policy, "scan_layers")
    layers = list(layers)
    if not layers:
        return x
    t0 = layers[0]
    s0 = _structure(t0)
    for i, layer in enumerate(layers[1:], 1):
        if type(layer) is not type(t0):
            raise TypeError(f"scan_layers: layer {i} is a {type(layer).__name__}, layer 0 is a {type(t0).__name__}; "
                            f"all layers must have the same structure")
        s = _structure(layer)
        if s != s0:
            raise TypeError("scan_layers: " + _first_difference(i, s0, s) + "; all layers must have the same structure")
    pnames = [n for n, _ in t0.named_parameters()]
    bnames = [n for n, _ in t0.named_buffers()]
    stacked = {}
    for n in pnames:
        stacked[n] = torch.stack([layer.get_parameter(n) for layer in layers])
    for n in bnames:
        stacked[n] = torch.stack([layer.get_buffer(n) for layer in layers])
    flat, spec = pytree.tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    static = tuple(_TENSOR if isinstance(t, torch.Tensor) else t for t in flat)
    training = tuple(m.training for m in t0.modules())
    try:
        skey = (spec, static, training, s0)
        hash(skey)
    except TypeError:
        skey = None  # unhashable extra arguments: trace every call
    fns = _LAYER_FNS.setdefault(t0, {})
    fn = fns.get(skey) if skey is not None else None
    if fn is None:
        def fn(c, p, ks, _t0=weakref.ref(t0), _static=static, _spec=spec):
            it = iter(ks)
            vals = [next(it) if s is _TENSOR else s for s in _static]
            a, kw = pytree.tree_unflatten(vals, _spec)
            return torch.func.functional_call(_t0(), p, (*_as_args(c), *a), kw), None
        fn.key = identity_key(fn)
        if skey is not None:
            fns[skey] = fn
    carry, _ = scan_with_consts(fn, x, stacked, tensors, False, fn_key=fn.key, policy=policy)
    return carry
