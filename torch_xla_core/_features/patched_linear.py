"""An einsum-based nn.Linear, as torch_xla's XLAPatchedLinear:

    from torch_xla_core.patched_linear import apply_xla_patch_to_nn_linear
    model = apply_xla_patch_to_nn_linear(model)   # every nn.Linear's forward

torch's F.linear reaches the device as t + addmm over a flattened input
(`view` to 2-D, then back), and its backward as mm's of transposes. Here the
forward is one einsum over the input's own dims ('...n,mn->...m') and the
backward is einsums too, so the graph holds no reshapes or transposes of the
weight: XLA's SPMD partitioner sees the annotated dims of weight and input
unchanged (sharding annotations survive), and nothing is copied for the
transposes. Under torch.autocast("xla") einsum is a lower-precision op, and
the backward runs in the forward's autocast state (custom_fwd/custom_bwd)."""
import types

import torch

__all__ = ["XLAPatchedLinear", "xla_patched_nn_linear_forward", "apply_xla_patch_to_nn_linear"]


class XLAPatchedLinear(torch.autograd.Function):
    """y = input @ weight.T + bias, as einsums (forward and backward)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="xla")
    def forward(ctx, input, weight, bias=None):
        ctx.save_for_backward(input, weight)
        ctx.has_bias = bias is not None
        y = torch.einsum("...n,mn->...m", input, weight)
        return y if bias is None else y + bias

    @staticmethod
    @torch.amp.custom_bwd(device_type="xla")
    def backward(ctx, grad):
        input, weight = ctx.saved_tensors
        gi = gw = gb = None
        if ctx.needs_input_grad[0]:
            gi = torch.einsum("...m,mn->...n", grad, weight)
        if ctx.needs_input_grad[1]:
            gw = torch.einsum("...m,...n->mn", grad, input)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = torch.einsum("...m->m", grad)
        return gi, gw, gb


def xla_patched_nn_linear_forward(module: torch.nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """nn.Linear's forward through XLAPatchedLinear (apply_xla_patch_to_nn_linear installs it)."""
    return XLAPatchedLinear.apply(input, module.weight, module.bias)


def apply_xla_patch_to_nn_linear(module: torch.nn.Module, patched_function=xla_patched_nn_linear_forward):
    """Replaces the forward of `module` and every nn.Linear inside it (not
    subclasses with a forward of their own) by `patched_function`; returns
    the module."""
    for m in module.modules():
        if type(m).forward is torch.nn.Linear.forward and isinstance(m, torch.nn.Linear):
            m.forward = types.MethodType(patched_function, m)
    return module
