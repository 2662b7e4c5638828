"""torch's multi-tensor ops on xla tensors: every aten::_foreach_* overload,
and the fused optimizer steps (_fused_adam_, _fused_adamw_, _fused_sgd_,
_fused_adagrad_)
that `torch.optim.Adam/AdamW/SGD(fused=True)` call; and torch's default
choice of foreach for xla parameters (torch.optim, clip_grad_norm_).

foreach: one rule for the whole family. `_foreach_<op>.<overload>` applies
aten `<op>` to the i-th element of every list argument (Tensor[] and
Scalar[]) with the other arguments as they are; the in-place variant assigns
each result to its self element. The graph gets the same nodes the
per-tensor loop would (XLA fuses them; nothing is gained by a special node).
For elementwise arithmetic (_TEMPLATED) the handler runs once per dtype,
shape and numbers among the elements, and C++ rebuilds its nodes over the
other elements of that kind (csrc/py/foreach.cpp): an optimizer's step
without a Python handler call per parameter. Every foreach call's loop over
its elements runs in C++ (foreach_loop): the handler is called from there.

fused optimizers: torch's CPU kernels' arithmetic, elementwise on the device.
With `grad_scale` the gradients are divided by it and written back (as the
CPU kernel does); with `found_inf` every write is a select on found_inf, so
GradScaler.step never reads a value on the host: `torch.amp.GradScaler("xla")`
with a fused optimizer is a sync-free step (the non-fused path reads found_inf
with .item() in torch's GradScaler)."""

import torch
from torch.optim import optimizer
from torch.utils import _foreach_utils

from .. import _C
from .._tracing.tensor import XlaTensor
from . import HANDLERS, assign, check_writes, entry, impl

aten = torch.ops.aten
_foreach_loop = _C.foreach_loop

# _foreach_<op> whose per-tensor op has another name
_RENAMED = {"zero": "zeros_like", "norm": "linalg_vector_norm"}


def _list_args(func):
    """Indices of the positional arguments that are lists (per element)."""
    return [i for i, a in enumerate(func._schema.arguments)
            if not a.kwarg_only and isinstance(a.type, torch.ListType)]


def _per_tensor(func, name):
    base = getattr(aten, _RENAMED.get(name, name))
    lists = _list_args(func)
    # addcmul/addcdiv.Tensor: `scalars` is a 1-D tensor, one value per element
    per_value = {i for i, a in enumerate(func._schema.arguments) if a.name == "scalars" and not isinstance(a.type, torch.ListType)}

    per_element = sorted(set(lists) | per_value)

    def element_args(args):
        """args with each per-value tensor made a list of its values (an
        element's argument i is then args[i][j] for i in per_element)."""
        n = len(args[lists[0]])
        for i in lists:
            if len(args[i]) != n:
                raise RuntimeError(f"{func._schema.name}: tensor lists must have the same number of tensors, "
                                   f"got {n} and {len(args[i])}")
        if per_value:
            args = tuple([a[j] for j in range(n)] if i in per_value else a for i, a in enumerate(args))
        return args

    return base, element_args, per_element


def _kinds(func):
    """The kind ("Tensor", "Scalar", other) of each positional argument of one element of func's call."""
    out = []
    for a in func._schema.arguments:
        if a.kwarg_only:
            break
        t = a.type.getElementType() if isinstance(a.type, torch.ListType) else a.type
        out.append(str(t))
    return out


def _overload(packet, func):
    """The overload of the per-tensor packet that one element of func's call takes (its positional
    arguments' kinds match, the rest have defaults): called as an overload, the packet's schema
    matching per call is skipped. None where not exactly one fits."""
    kinds = _kinds(func)
    kw = {a.name for a in func._schema.arguments if a.kwarg_only}
    fits = []
    for ov in packet.overloads():
        o = getattr(packet, ov)
        args = o._schema.arguments
        pos = [a for a in args if not a.kwarg_only]
        if len(pos) < len(kinds) or [str(a.type) for a in pos[:len(kinds)]] != kinds:
            continue
        rest = pos[len(kinds):] + [a for a in args if a.kwarg_only and a.name not in kw]
        if all(a.has_default_value() for a in rest) and kw <= {a.name for a in args if a.kwarg_only}:
            fits.append(o)
    return fits[0] if len(fits) == 1 else None


def _direct(ov):
    """ov called as the dispatcher would call its handler, without the trip through torch's dispatcher
    (a foreach element whose self is an xla tensor: the handler, behind its dtype rule, that the C++
    dispatcher caches; re-resolved when the overload's handler changes)."""
    seen = [None, None]

    def call(*args, **kwargs):
        if not isinstance(args[0], XlaTensor):
            return ov(*args, **kwargs)
        h = HANDLERS.get(ov)
        if h is None or h is not seen[0]:
            seen[1] = entry(ov)[0]
            seen[0] = HANDLERS.get(ov)
        return seen[1](*args, **kwargs)
    return call


# The per-tensor ops whose handler builds the same nodes for every element of
# one key (csrc/py/foreach.cpp key_of: dtypes, shapes, numbers): pure
# elementwise arithmetic, no host read, no RNG. A foreach call runs the
# handler on the first element of each key and rebuilds its nodes over the
# others in C++ (an optimizer step's foreach elements: 3-13 us of Python
# each before).
_TEMPLATED = frozenset({"add", "sub", "mul", "div", "lerp", "addcmul", "addcdiv", "sqrt", "rsqrt", "reciprocal",
                        "maximum", "minimum", "neg", "abs", "exp", "sign", "clamp_min", "clamp_max"})


def _write(a, r):
    """An in-place element's write that foreach_loop cannot make in C++ (a cast,
    a broadcast, an argument sharing the written storage)."""
    check_writes(a[0], a[1:])
    assign(a[0], r)


def _register(func):
    name = func._schema.name.split("::")[1][len("_foreach_"):]
    inplace = name.endswith("_")
    if inplace:
        name = name[:-1]
    if name == "powsum" or not hasattr(aten, _RENAMED.get(name, name)):
        return
    base, element_args, per_element = _per_tensor(func, name)
    ov = _overload(base, func) if name not in ("addcmul", "addcdiv", "norm") else None
    if ov is not None:
        base = _direct(ov)
    if name in ("addcmul", "addcdiv"):  # (self, t1, t2, value): value is kwarg-only in the per-tensor op
        op = _direct(base.default)

        def base(x, t1, t2, value=1):
            if isinstance(value, torch.Tensor):  # an element of the .Tensor overload's `scalars`
                if value.device.type == "cpu":
                    value = value.item()
                else:
                    return x + value * (t1 * t2 if name == "addcmul" else t1 / t2)
            return op(x, t1, t2, value=value)
    if name == "norm":  # (self, ord, dtype): dtype is positional here, dim would be there
        def base(x, ord=2, dtype=None):
            return aten.linalg_vector_norm(x, ord, dtype=dtype)
    templated = name in _TEMPLATED

    def h(*args, **kwargs):  # the elements in order, in C++ (csrc/py/foreach.cpp foreach_loop)
        return _foreach_loop(element_args(args), per_element, inplace, base, kwargs, _write, templated)
    impl(func)(h)


def _register_foreach():
    names = sorted({s.name[len("aten::"):] for s in torch._C._jit_get_all_schemas()
                    if s.name.startswith("aten::_foreach_")})
    for n in names:
        packet = getattr(aten, n)
        for ov in packet.overloads():
            if not ov.endswith("out"):
                _register(getattr(packet, ov))


_register_foreach()


# --- fused optimizers -----------------------------------------------------------

def _unscale_and_guard(grads, grad_scale, found_inf):
    """Divides grads by grad_scale (written back, as torch's kernels do, unless
    found_inf is set) and returns (unscaled grads, keep) where keep(old, new)
    selects the old value when found_inf == 1."""
    if found_inf is not None:
        skip = found_inf == 1

        def keep(old, new):
            return torch.where(skip, old, new)
    else:
        def keep(old, new):
            return new
    if grad_scale is not None:
        unscaled = [g / grad_scale for g in grads]
        for g, u in zip(grads, unscaled):
            assign(g, keep(g, u))
        grads = unscaled
    return grads, keep


def _adam(adamw):
    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2,
             weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):
        grads, keep = _unscale_and_guard(grads, grad_scale, found_inf)
        for i, (p, g, m, v, t) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
            g = -g if maximize else g
            p_new = p
            if weight_decay != 0:
                if adamw:
                    p_new = p - p * (lr * weight_decay)
                else:
                    g = g + p * weight_decay
            m_new = m + (g - m) * (1 - beta1)
            v_new = v * beta2 + (g * g) * (1 - beta2)
            step_size = lr / (1 - torch.pow(beta1, t))
            bc2_sqrt = torch.sqrt(1 - torch.pow(beta2, t))
            if amsgrad:
                vmax = torch.maximum(max_exp_avg_sqs[i], v_new)
                assign(max_exp_avg_sqs[i], keep(max_exp_avg_sqs[i], vmax))
                denom = torch.sqrt(vmax) / bc2_sqrt + eps
            else:
                denom = torch.sqrt(v_new) / bc2_sqrt + eps
            p_new = p_new - step_size * m_new / denom
            assign(m, keep(m, m_new))
            assign(v, keep(v, v_new))
            assign(p, keep(p, p_new))
    return step


def _sgd(params, grads, momentum_buffer_list, *, weight_decay, momentum, lr, dampening, nesterov, maximize,
         is_first_step, grad_scale=None, found_inf=None):
    grads, keep = _unscale_and_guard(grads, grad_scale, found_inf)
    for i, (p, g) in enumerate(zip(params, grads)):
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + p * weight_decay
        if momentum != 0:
            buf = momentum_buffer_list[i]
            b_new = g if is_first_step else buf * momentum + g * (1 - dampening)
            assign(buf, keep(buf, b_new))
            g = g + b_new * momentum if nesterov else b_new
        assign(p, keep(p, p - g * lr))


@impl(aten._fused_adagrad_.default)
def _adagrad(params, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps, maximize,
             grad_scale=None, found_inf=None):
    """torch's fused Adagrad kernel: clr = lr / (1 + (step - 1) * lr_decay)
    (the optimizer has already counted this step), state_sum += g^2,
    param -= clr * g / (sqrt(state_sum) + eps)."""
    grads, keep = _unscale_and_guard(grads, grad_scale, found_inf)
    for p, g, s, t in zip(params, grads, state_sums, state_steps):
        g = -g if maximize else g
        if weight_decay != 0:
            g = g + p * weight_decay
        s_new = s + g * g
        clr = lr / (1 + (t - 1) * lr_decay)
        assign(s, keep(s, s_new))
        assign(p, keep(p, p - clr * g / (torch.sqrt(s_new) + eps)))


for _ov in ("default", "tensor_lr"):
    impl(getattr(aten._fused_adam_, _ov))(_adam(adamw=False))
    impl(getattr(aten._fused_adamw_, _ov))(_adam(adamw=True))
    impl(getattr(aten._fused_sgd_, _ov))(_sgd)


# --- torch's default on xla: foreach ----------------------------------------------
# torch.optim (_default_to_fused_or_foreach) and clip_grad_norm_ (_has_foreach_support)
# take the foreach path by default for a device in their list ('xla', the renamed
# PrivateUse1, is there) only when each tensor's exact type is in their type lists,
# which hold torch.Tensor and Parameter, not XlaTensor: so xla parameters got
# torch's per-tensor loop. The device graph is the same either way (each foreach
# element is the per-tensor op; XLA fuses them): foreach only makes the update a
# few list ops on the host, as on CUDA. capturable=True (replay lifts Adam to it)
# takes the same path.
def _foreach_by_default():
    for types in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if XlaTensor not in types:
            types.append(XlaTensor)


_foreach_by_default()
