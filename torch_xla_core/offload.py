"""Host offloading: moving values between device memory and host memory.

The public face of torch_xla_core/_features/offload.py (the implementation: read it there)."""
from ._features.offload import place_to_host, place_to_device, offload_activations, memory_kind, HOST, DEVICE  # noqa: F401

__all__ = ["place_to_host", "place_to_device", "offload_activations", "memory_kind", "HOST", "DEVICE"]
