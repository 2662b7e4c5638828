"""Autocast for the xla device: `torch.autocast("xla", dtype=torch.bfloat16 |
torch.float16)`, in PyTorch's own conventions: which ops run in the lower
precision, which in float32, which promote their inputs.

The public face of torch_xla_core/_features/amp.py (the implementation: read it there)."""
from ._features.amp import (BANNED, FP32, FP32_APPEND_DTYPE, FP32_SET_DTYPE, LOWER, PROMOTE, impl, install, policy,
                            register_handlers)  # noqa: F401

__all__ = ["BANNED", "FP32", "FP32_APPEND_DTYPE", "FP32_SET_DTYPE", "LOWER", "PROMOTE", "impl", "install", "policy",
           "register_handlers"]
