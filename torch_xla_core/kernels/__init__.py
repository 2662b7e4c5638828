"""Kernels on xla tensors: call_jax (any JAX function, Pallas kernels
included, inlined into the lazy graph as one node) and the kernels built on
it. See call_jax.py for the bridge."""
from .call_jax import call_jax, clear_cache, lowered_text

__all__ = ["call_jax", "clear_cache", "lowered_text"]
