"""grouped_matmul: the MoE expert matmul on xla tensors, through call_jax.

    y = grouped_matmul(x, w, group_sizes)   # x [M, K], w [E, K, N], sizes int [E] -> [M, N]

Convention: group_sizes are PER-GROUP SIZES (rows of x sorted by group,
group e takes the next group_sizes[e] rows), summing to M. torch's
F.grouped_mm takes CUMULATIVE end offsets instead (offs = cumsum(sizes)).
Computed by jax.lax.ragged_dot (differentiable; its gradient goes through
jax.vjp): XLA's ragged dot on TPU/GPU; on CPU jax lowers it densely (each
row against every expert, masked: E times the work), fine for correctness.
Sizes that do not sum to M raise at the sync (a deferred check); negative
sizes too."""
import torch

from .. import _checks
from .call_jax import call_jax

__all__ = ["grouped_matmul"]


def _ragged(x, w, group_sizes):
    import jax
    return jax.lax.ragged_dot(x, w, group_sizes)


def grouped_matmul(x, w, group_sizes):
    op = "grouped_matmul"
    if x.dim() != 2 or w.dim() != 3:
        raise ValueError(f"{op}: x must be [M, K] and w [E, K, N], got {list(x.shape)} and {list(w.shape)}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"{op}: x has K={x.shape[1]}, w has K={w.shape[1]} ({list(x.shape)} vs {list(w.shape)})")
    if x.dtype != w.dtype or not x.is_floating_point():
        raise ValueError(f"{op}: x and w must share one float dtype, got {x.dtype} and {w.dtype}")
    if group_sizes.dim() != 1 or group_sizes.shape[0] != w.shape[0] or group_sizes.is_floating_point():
        raise ValueError(f"{op}: group_sizes must be an integer tensor [{w.shape[0]}] (one size per group), got "
                         f"{group_sizes.dtype} {list(group_sizes.shape)}")
    if not hasattr(group_sizes, "_lt"):  # a host tensor: check now
        if int(group_sizes.sum()) != x.shape[0] or bool((group_sizes < 0).any()):
            raise ValueError(f"{op}: group_sizes {group_sizes.tolist()} must be non-negative and sum to the row "
                             f"count {x.shape[0]} (they are sizes, not cumulative offsets)")
        group_sizes = group_sizes.to(x.device)
    else:
        _checks.require(((group_sizes.sum() != x.shape[0]) | (group_sizes < 0).any())._lt,
                        f"{op}: group_sizes must be non-negative and sum to the row count {x.shape[0]} (they are "
                        f"sizes, not cumulative offsets)", ValueError)
    return call_jax(_ragged, x, w, group_sizes.to(torch.int32))
