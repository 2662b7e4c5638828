"""CNN ops -> core ops in csrc/ops/conv.cpp: convolution (any spatial rank,
transposed too) and its gradients, max/avg/adaptive-avg pooling and their
gradients, batch norm (train and eval, running-stat updates in place) and
its gradient; adaptive max pooling. One core op per result."""
import torch

from .._runtime.dtypes import code
from .._tracing.tensor import OP, core_operand, lazy_op, wrap
from . import aten, assign, call, impl

_CONV, _CONV_GI, _CONV_GW = OP.convolution, OP.convolution_backward_input, OP.convolution_backward_weight
_MAXP, _MAXP_I, _MAXP_B = OP.max_pool, OP.max_pool_indices, OP.max_pool_backward
_AVGP, _AVGP_B = OP.avg_pool, OP.avg_pool_backward
_ADP, _ADP_B, _ADMP = OP.adaptive_avg_pool, OP.adaptive_avg_pool_backward, OP.adaptive_max_pool
_BN_STATS, _BN_INVSTD, _BN_APPLY, _BN_UPDATE = OP.batch_norm_stats, OP.batch_norm_invstd, OP.batch_norm_apply, OP.batch_norm_update
_BN_GI, _BN_GW, _SUM, _FULL = OP.batch_norm_backward_input, OP.batch_norm_backward_weight, OP.sum, OP.full


def _exp(val, n, name="convolution", what="stride"):
    """Expands an int or 1-element list to n ints (torch's expand_param_if_needed)."""
    if isinstance(val, int):
        return [val] * n
    val = list(val)
    if len(val) == 1 and n != 1:
        return val * n
    if len(val) != n:
        raise RuntimeError(f"{name}: expected {what} to be a single integer value or a list of {n} values to match "
                           f"the convolution dimensions, but got {what}={val}")
    return val


# ---- convolution ----

def _conv_attrs(ns, stride, padding, dilation, transposed, output_padding, groups):
    return (_exp(stride, ns, what="stride"), _exp(padding, ns, what="padding"), _exp(dilation, ns, what="dilation"),
            int(bool(transposed)), _exp(output_padding, ns, what="output_padding"), int(groups))


@impl(aten.convolution.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    if isinstance(padding, str):
        raise RuntimeError(f"convolution: string padding '{padding}' must be resolved before aten::convolution")
    unbatched = x.dim() == w.dim() - 1 and w.dim() >= 3
    if unbatched:
        x = call(aten.unsqueeze.default, x, 0)
    ns = max(w.dim() - 2, 0)
    attrs = _conv_attrs(ns, stride, padding, dilation, transposed, output_padding, groups)
    ops = (core_operand(x), core_operand(w)) if bias is None else (core_operand(x), core_operand(w), core_operand(bias))
    r = wrap(lazy_op(_CONV, ops, attrs))
    return call(aten.squeeze.dim, r, 0) if unbatched else r


@impl(aten.convolution_backward.default)
def convolution_backward(g, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                         output_mask):
    ns = w.dim() - 2
    attrs = _conv_attrs(ns, stride, padding, dilation, transposed, output_padding, groups)
    gi = gw = gb = None
    if output_mask[0]:
        gi = wrap(lazy_op(_CONV_GI, (core_operand(g), core_operand(w)), attrs + (list(x.shape),)))
    if output_mask[1]:
        gw = wrap(lazy_op(_CONV_GW, (core_operand(x), core_operand(g)), attrs + (list(w.shape),)))
    if output_mask[2]:
        gb = wrap(lazy_op(_SUM, (core_operand(g),), ([0] + list(range(2, g.dim())), 0, -1)))
    return gi, gw, gb


# ---- pooling ----

def _pool_args(name, ns, kernel_size, stride, padding, dilation=1):
    k = _exp(kernel_size, ns, name, "kernel_size")
    s = _exp(stride, ns, name, "stride") if stride not in (None, [], ()) else k
    return k, s, _exp(padding, ns, name, "padding"), _exp(dilation, ns, name, "dilation")


def _register_pool_pair(aten_name, make):
    """Registers make(ns) -> (forward, backward) for ns = 2 and 3 as the aten
    overloads aten_name.format(ns) and its _backward."""
    for ns in (2, 3):
        fwd, bwd = make(ns)
        impl(getattr(aten, aten_name.format(ns)).default)(fwd)
        impl(getattr(aten, aten_name.format(ns) + "_backward").default)(bwd)


def _max_pool(ns):
    name = f"max_pool{ns}d"

    def fwd(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k, s, p, d = _pool_args(name, ns, kernel_size, stride, padding, dilation)
        attrs = (k, s, p, d, int(bool(ceil_mode)))
        lt = core_operand(x)
        return wrap(lazy_op(_MAXP, (lt,), attrs)), wrap(lazy_op(_MAXP_I, (lt,), attrs))

    def bwd(g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        return wrap(lazy_op(_MAXP_B, (core_operand(g), core_operand(indices)), (list(x.shape), ns)))
    return fwd, bwd


_register_pool_pair("max_pool{}d_with_indices", _max_pool)


def _avg_attrs(name, ns, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k, s, p, _ = _pool_args(name, ns, kernel_size, stride, padding)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError(f"{name}: divisor must be not zero")
    return (k, s, p, int(bool(ceil_mode)), int(bool(count_include_pad)), int(divisor_override or 0))


def _avg_pool(ns):
    name = f"avg_pool{ns}d"

    def fwd(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        attrs = _avg_attrs(name, ns, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        return wrap(lazy_op(_AVGP, (core_operand(x),), attrs))

    def bwd(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        attrs = _avg_attrs(name, ns, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        return wrap(lazy_op(_AVGP_B, (core_operand(g),), attrs + (list(x.shape),)))
    return fwd, bwd


_register_pool_pair("avg_pool{}d", _avg_pool)


def _adaptive(ns):
    def fwd(x, output_size):
        return wrap(lazy_op(_ADP, (core_operand(x),), (_exp(output_size, ns, f"adaptive_avg_pool{ns}d", "output_size"),)))

    def bwd(g, x):
        return wrap(lazy_op(_ADP_B, (core_operand(g),), (list(x.shape), ns)))
    return fwd, bwd


_register_pool_pair("_adaptive_avg_pool{}d", _adaptive)


def _adaptive_max(ns):
    def fwd(x, output_size):
        os = _exp(output_size, ns, f"adaptive_max_pool{ns}d", "output_size")
        lt = core_operand(x)
        return wrap(lazy_op(_ADMP, (lt,), (os, 0))), wrap(lazy_op(_ADMP, (lt,), (os, 1)))

    def bwd(g, x, indices):
        return wrap(lazy_op(_MAXP_B, (core_operand(g), core_operand(indices)), (list(x.shape), ns)))
    return fwd, bwd


_register_pool_pair("adaptive_max_pool{}d", _adaptive_max)

# ---- batch norm ----

def _empty(dtype):
    return wrap(lazy_op(_FULL, (), (0.0, code(dtype), [0])))


def _bn_train(x, w, b, rm, rv, momentum, eps, update):
    """Normalizes with batch statistics. update: write running stats in place
    (True) or return their new values (False)."""
    sdt = code((rm if rm is not None else w if w is not None else x).dtype)
    lt = core_operand(x)
    mean = lazy_op(_BN_STATS, (lt,), (0, float(eps), sdt))
    invstd = lazy_op(_BN_STATS, (lt,), (1, float(eps), sdt))
    ops = [lt, mean, invstd]
    if w is not None:
        ops.append(core_operand(w))
    if b is not None:
        ops.append(core_operand(b))
    out = wrap(lazy_op(_BN_APPLY, tuple(ops), (0, float(eps), int(w is not None), int(b is not None))))
    new_rm = new_rv = None
    if rm is not None:
        new_rm = wrap(lazy_op(_BN_UPDATE, (core_operand(rm), mean), (float(momentum),)))
    if rv is not None:
        var_u = lazy_op(_BN_STATS, (lt,), (2, float(eps), sdt))
        new_rv = wrap(lazy_op(_BN_UPDATE, (core_operand(rv), var_u), (float(momentum),)))
    if update:
        if new_rm is not None:
            assign(rm, new_rm)
        if new_rv is not None:
            assign(rv, new_rv)
    return out, wrap(mean), wrap(invstd), new_rm, new_rv


def _bn_eval(x, w, b, rm, rv, eps):
    if rm is None or rv is None:
        raise RuntimeError("native_batch_norm: running_mean and running_var must be defined in evaluation mode")
    ops = [core_operand(x), core_operand(rm), core_operand(rv)]
    if w is not None:
        ops.append(core_operand(w))
    if b is not None:
        ops.append(core_operand(b))
    return wrap(lazy_op(_BN_APPLY, tuple(ops), (1, float(eps), int(w is not None), int(b is not None))))


@impl(aten.native_batch_norm.default)
def native_batch_norm(x, w, b, rm, rv, training, momentum, eps):
    if training:
        return _bn_train(x, w, b, rm, rv, momentum, eps, True)[:3]
    sdt = (rm if rm is not None else x).dtype
    return _bn_eval(x, w, b, rm, rv, eps), _empty(sdt), _empty(sdt)


@impl(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(x, w, b, rm, rv, training, momentum, eps):
    return native_batch_norm(x, w, b, rm, rv, training, momentum, eps)


@impl(aten._native_batch_norm_legit.no_stats)
def native_batch_norm_legit_no_stats(x, w, b, training, momentum, eps):
    return _bn_train(x, w, b, None, None, momentum, eps, True)[:3]


@impl(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(x, w, b, rm, rv, momentum, eps):
    return native_batch_norm(x, w, b, rm, rv, False, momentum, eps)


@impl(aten._native_batch_norm_legit_functional.default)
def native_batch_norm_legit_functional(x, w, b, rm, rv, training, momentum, eps):
    if training:
        return _bn_train(x, w, b, rm, rv, momentum, eps, False)
    return (_bn_eval(x, w, b, rm, rv, eps), _empty(rm.dtype), _empty(rm.dtype),
            call(aten.clone.default, rm), call(aten.clone.default, rv))


# torch's newer training entry (nn.BatchNorm under torch.compile/export, and
# autograd's batch_norm): saved statistics in the running stats' dtype, as
# CPU (bf16 for a bf16 module; torch's decomposition made them float32),
# and an empty uint8 reserve (CPU's; cuDNN's workspace elsewhere)
@impl(aten._batch_norm_with_update.default)
def batch_norm_with_update(x, w, b, rm, rv, momentum, eps):
    return (*_bn_train(x, w, b, rm, rv, momentum, eps, True)[:3], _empty(torch.uint8))


@impl(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update_functional(x, w, b, rm, rv, momentum, eps):
    out, mean, invstd, new_rm, new_rv = _bn_train(x, w, b, rm, rv, momentum, eps, False)
    return out, mean, invstd, _empty(torch.uint8), new_rm, new_rv


@impl(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(g, x, w, rm, rv, save_mean, save_invstd, train, eps, output_mask):
    if train:
        if save_mean is None or save_invstd is None:
            raise RuntimeError("native_batch_norm_backward: save_mean and save_invstd are required when train=True")
        mean, invstd = core_operand(save_mean), core_operand(save_invstd)
    else:
        if rm is None or rv is None:
            raise RuntimeError("native_batch_norm_backward: running_mean and running_var are required when train=False")
        mean, invstd = core_operand(rm), lazy_op(_BN_INVSTD, (core_operand(rv),), (float(eps),))
    gi = gw = gb = None
    if output_mask[0]:
        ops = (core_operand(g), core_operand(x), mean, invstd) + ((core_operand(w),) if w is not None else ())
        gi = wrap(lazy_op(_BN_GI, ops, (int(bool(train)), int(w is not None))))
    pdt = (w if w is not None else x).dtype
    if output_mask[1]:
        gw = wrap(lazy_op(_BN_GW, (core_operand(g), core_operand(x), mean, invstd), (code(pdt),)))
    if output_mask[2]:
        gb = wrap(lazy_op(_SUM, (core_operand(g),), ([0] + list(range(2, g.dim())), 0, code(pdt))))
    return gi, gw, gb
