"""Kernels on xla tensors: call_jax (any JAX function, Pallas kernels
included, inlined into the lazy graph as one node), and the kernels built on
it: flash_attention and multi_queries_paged_attention (attention.py),
grouped_matmul (gmm.py). Plain-torch definitions of each live in
reference.py."""
from .attention import flash_attention, multi_queries_paged_attention, sdpa_kernel, set_sdpa_kernel
from .call_jax import call_jax, clear_cache, lowered_text
from .gmm import grouped_matmul

__all__ = ["call_jax", "clear_cache", "lowered_text", "flash_attention", "multi_queries_paged_attention",
           "grouped_matmul", "set_sdpa_kernel", "sdpa_kernel"]
