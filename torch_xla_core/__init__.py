"""torch_xla_core: PyTorch on XLA through a C++ lazy-tensor core."""
__version__ = "0.1.0"
