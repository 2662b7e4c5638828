"""Autocast for the xla device: `torch.autocast("xla", dtype=torch.bfloat16 |
torch.float16)`, in PyTorch's own conventions. It owns

- a fallthrough on the AutocastPrivateUse1 dispatch key for every op (ops
  with no cast policy run unchanged), and
- per-op Python kernels on that key implementing CUDA autocast's cast
  policies (torch/csrc/autocast_mode.cpp), plus einsum as torch_xla 2.6 has:
  LOWER (floating inputs -> the autocast dtype: matmuls, convs, SDPA),
  FP32 (-> float32: pointwise ops that lose range, norms, losses),
  FP32_SET_DTYPE (dtype=float32 when the caller gave none: softmax,
  log_softmax, sum, prod, cumsum...), FP32_APPEND_DTYPE (norm), PROMOTE
  (the widest floating input dtype: cat, stack, index_put...), and BANNED
  (binary_cross_entropy, as on CUDA).

A kernel casts the eligible inputs (floating, not float64, on xla) and calls
the op again with the autocast key excluded, as torch's C++ wrappers do;
autograd records the casts, so gradients come back in the parameters'
dtypes. Nothing here runs when autocast is off (the key is then excluded
by torch). torch.amp.custom_fwd/custom_bwd(device_type="xla") and
torch.amp.GradScaler("xla") work as torch defines them (the scaler's
_amp_* ops are lowered below, register_handlers).
"""
import torch
from .._ops import impl

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)

# CUDA autocast's lists (torch/csrc/autocast_mode.cpp), as aten overload names.
LOWER = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv1d.padding",
    "conv2d.padding", "conv3d.padding", "conv_tbc", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "convolution", "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm",
    "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot",
    "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
    "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus", "layer_norm",
    "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d",
    "_upsample_bilinear2d_aa", "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    "upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec",
    "_upsample_nearest_exact1d.vec", "_upsample_nearest_exact2d.vec", "_upsample_nearest_exact3d.vec",
    "upsample_linear1d.vec", "upsample_bilinear2d.vec", "_upsample_bilinear2d_aa.vec",
    "upsample_trilinear3d.vec", "upsample_bicubic2d.vec", "_upsample_bicubic2d_aa.vec",
)
FP32_SET_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
FP32_APPEND_DTYPE = {  # overload -> its twin with a dtype argument (appended)
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
}
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "scatter_add", "tensordot", "cat", "stack",
)
BANNED = {
    "binary_cross_entropy": (
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast (on the xla device as on cuda)."),
}

_lib = None  # the torch.library registrations: alive as long as this module


def _eligible(x) -> bool:
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64
            and x.device.type == "xla")


def _cast(x, dtype):
    if _eligible(x):
        return x if x.dtype == dtype else x.to(dtype)
    if isinstance(x, (list, tuple)) and x and any(_eligible(e) for e in x):
        return type(x)(_cast(e, dtype) for e in x)
    return x


def _widest(args, kwargs):
    """The promoted dtype of the eligible floating tensors among the arguments."""
    out = None
    for a in list(args) + list(kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if _eligible(t):
                out = t.dtype if out is None else torch.promote_types(out, t.dtype)
    return out


def _lower_kernel(op):
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("xla")
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args = [_cast(a, dtype) for a in args]
            kwargs = {k: _cast(a, dtype) for k, a in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


def _fp32_kernel(op):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args = [_cast(a, torch.float32) for a in args]
            kwargs = {k: _cast(a, torch.float32) for k, a in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


def _promote_kernel(op):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            dtype = _widest(args, kwargs)
            if dtype is not None:
                args = [_cast(a, dtype) for a in args]
                kwargs = {k: _cast(a, dtype) for k, a in kwargs.items()}
            return op(*args, **kwargs)
    return kernel


def _set_dtype_kernel(op):
    """dtype=float32 where the caller gave no dtype and the first argument is
    eligible (CUDA's fp32_set_opt_dtype); otherwise the op runs unchanged."""
    sch = op._schema.arguments
    idx = next(i for i, a in enumerate(sch) if a.name == "dtype")
    kw_only = sch[idx].kwarg_only

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if args and _eligible(args[0]):
                if kw_only:
                    if kwargs.get("dtype") is None:
                        kwargs["dtype"] = torch.float32
                elif len(args) <= idx or args[idx] is None:
                    args = list(args) + [sch[i].default_value for i in range(len(args), idx + 1)]
                    args[idx] = torch.float32
            return op(*args, **kwargs)
    return kernel


def _append_dtype_kernel(op, twin):
    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if args and _eligible(args[0]):
                full = list(args) + [a.default_value for a in op._schema.arguments[len(args):]]
                return twin(*full, dtype=torch.float32)
            return op(*args, **kwargs)
    return kernel


def _banned_kernel(name, msg):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"aten::{name}: {msg}")
    return kernel


def _overload(name):
    base, _, ov = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    if packet is None:
        return None
    return getattr(packet, ov or "default", None)


def install() -> None:
    """Registers the fallthrough and the policy kernels (once)."""
    global _lib
    if _lib is not None:
        return
    fallback = torch.library.Library("_", "IMPL")
    try:
        fallback.fallback(torch.library.fallthrough_kernel, _KEY)
    except RuntimeError as e:  # a torch that already has one (as for CUDA's key): keep it
        if "already" not in str(e).lower() and "registered" not in str(e).lower():
            raise
    lib = torch.library.Library("aten", "IMPL")
    plans = [(LOWER, _lower_kernel), (FP32, _fp32_kernel), (FP32_SET_DTYPE, _set_dtype_kernel),
             (PROMOTE, _promote_kernel)]
    for names, make in plans:
        for name in names:
            op = _overload(name)
            if op is not None:
                lib.impl(name, make(op), _KEY)
    for name, twin in FP32_APPEND_DTYPE.items():
        op, tw = _overload(name), _overload(twin)
        if op is not None and tw is not None:
            lib.impl(name, _append_dtype_kernel(op, tw), _KEY)
    for name, msg in BANNED.items():
        lib.impl(name, _banned_kernel(name, msg), _KEY)
    _lib = (fallback, lib)


def policy(name: str) -> str:
    """The cast policy of an aten overload name under xla autocast: 'lower',
    'fp32', 'fp32_set_dtype', 'fp32_append_dtype', 'promote', 'banned' or
    'none' (runs in whatever dtypes its inputs have)."""
    for names, p in ((LOWER, "lower"), (FP32, "fp32"), (FP32_SET_DTYPE, "fp32_set_dtype"),
                     (FP32_APPEND_DTYPE, "fp32_append_dtype"), (PROMOTE, "promote"), (BANNED, "banned")):
        if name in names or (name.endswith(".default") and name[:-8] in names):
            return p
    return "none"


# --- GradScaler's ops on xla tensors ------------------------------------------
# torch.amp.GradScaler("xla") calls these two; lowered here from ordinary ops,
# so the inf check and the scale update stay on the device. With a fused
# optimizer (Adam/AdamW/SGD(fused=True), lowered in _ops/foreach.py) the
# scaler hands found_inf to the step and nothing reads it on the host; with
# a non-fused one torch's scaler reads found_inf with .item() once per step.

def _unscale_(grads, found_inf, inv_scale):
    """aten::_amp_foreach_non_finite_check_and_unscale_: found_inf = 1 if any
    gradient has an inf/NaN; every gradient is multiplied by inv_scale."""
    bad = [(~torch.isfinite(g)).any() for g in grads]
    if bad:
        found_inf.copy_(torch.maximum(found_inf, torch.stack(bad).any().to(found_inf.dtype)))
    for g in grads:
        g.mul_(inv_scale)


def _update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    """aten::_amp_update_scale_: back off on inf, grow after growth_interval
    clean steps (torch's CUDA kernel's rule)."""
    inf = found_inf > 0
    grown = growth_tracker + 1
    grow = (~inf) & (grown >= growth_interval)
    new_scale = torch.where(inf, scale * backoff_factor, torch.where(grow, scale * growth_factor, scale))
    growth_tracker.copy_(torch.where(inf | grow, torch.zeros_like(growth_tracker), grown))
    scale.copy_(new_scale)
    return scale


def register_handlers() -> None:
    """Registers the xla handlers of GradScaler's aten ops (unscale, update_scale); the package calls it at import."""
    aten = torch.ops.aten
    impl(aten._amp_foreach_non_finite_check_and_unscale_.default)(_unscale_)
    impl(aten._amp_update_scale_.default)(_update_scale_)
