"""scaled_tanh(x) = alpha * tanh(beta * x) on the xla device, as ONE core op
(forward and backward) added to torch_xla_core by this C++ extension.

Importing it raises ImportError when the installed torch_xla_core is not the
C++ ABI flavor the extension was built against; the message names both
flavors and the wheel to install.
"""

from __future__ import annotations

import torch

import torch_xla_core  # noqa: F401  the core first: it publishes the C++ API
from torch_xla_core import _C as _core

from . import _C  # checks the core's flavor, registers the ops

SCALED_TANH = _C.ops["scaled_tanh"]
SCALED_TANH_BACKWARD = _C.ops["scaled_tanh_backward"]
_op = _core.op


class _ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, alpha, beta):
        ctx.save_for_backward(x)
        ctx.attrs = (alpha, beta)
        return _op(SCALED_TANH, (x,), ctx.attrs)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _op(SCALED_TANH_BACKWARD, (grad, x), ctx.attrs), None, None


def scaled_tanh(x: torch.Tensor, alpha: float = 1.7159, beta: float = 2.0 / 3.0) -> torch.Tensor:
    """alpha * tanh(beta * x); one fused core op on the xla device (with its
    gradient), plain torch elsewhere."""
    if x.device.type != "xla":
        return alpha * torch.tanh(beta * x)
    return _ScaledTanh.apply(x, float(alpha), float(beta))


__all__ = ["scaled_tanh", "SCALED_TANH", "SCALED_TANH_BACKWARD"]
