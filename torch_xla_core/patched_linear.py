"""An einsum-based nn.Linear, as torch_xla's XLAPatchedLinear (and the patch
that puts it in place of nn.Linear's forward).

The public face of torch_xla_core/_features/patched_linear.py (the implementation: read it there)."""
from ._features.patched_linear import XLAPatchedLinear, xla_patched_nn_linear_forward, apply_xla_patch_to_nn_linear  # noqa: F401

__all__ = ["XLAPatchedLinear", "xla_patched_nn_linear_forward", "apply_xla_patch_to_nn_linear"]
