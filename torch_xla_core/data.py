"""DeviceLoader: batches already on the xla device, moved in the background.

The public face of torch_xla_core/_features/data.py (the implementation: read it there)."""
from ._features.data import DeviceLoader  # noqa: F401

__all__ = ["DeviceLoader"]
