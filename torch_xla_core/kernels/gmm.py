"""grouped_matmul: the MoE expert matmul on xla tensors, through call_jax.

    y = grouped_matmul(x, w, group_sizes)   # x [M, K], w [E, K, N], sizes int [E] -> [M, N]

Convention: group_sizes are PER-GROUP SIZES (rows of x sorted by group,
group e takes the next group_sizes[e] rows), summing to M. torch's
F.grouped_mm takes CUMULATIVE end offsets instead (offs = cumsum(sizes)).
Two implementations, chosen by impl= or TXC_GROUPED_MATMUL_IMPL:
  "megablox": jax's Pallas TPU kernels (pallas/ops/tpu/megablox): gmm
    forward, and a custom vjp here whose input gradient is gmm against the
    transposed weights and whose weight gradient is tgmm (the per-group
    x_g^T @ dy_g). TPU: compiled by Mosaic (the default there). Elsewhere:
    the same kernels through Pallas' interpreter (plain HLO inside our
    graph; slow: correctness only). M is padded to the row tile (rows in no
    group) and cut back.
  "ragged_dot": jax.lax.ragged_dot (gradient through jax.vjp): XLA's ragged
    dot on GPU, and the default off TPU; on CPU jax lowers it densely (each
    row against every expert, masked: E times the work).
Sizes that do not sum to M raise at the sync (a deferred check); negative
sizes too."""
import functools
import importlib

import jax
import jax.numpy as jnp
import torch

from .._tracing import checks as _checks
from .. import config
from .._runtime import runtime
from .call_jax import call_jax

__all__ = ["grouped_matmul"]


_IMPLS = config.SETTINGS["TXC_GROUPED_MATMUL_IMPL"].choices  # ("megablox", "ragged_dot")


def _megablox():
    # the package's __init__ exports the function gmm under the module's name
    return importlib.import_module("jax.experimental.pallas.ops.tpu.megablox.gmm")


def _tiling(m, k, n):
    """(tm, tk, tn): 128-tiles, or the whole dim when smaller (Mosaic takes
    full dims); tm is a multiple of 16 (bf16 sublane packing) and M gets
    padded to it. k and n need not divide: megablox masks the last tile."""
    tm = 128 if m >= 128 else max(16, -(-m // 16) * 16)
    return tm, min(128, k), min(128, n)


def _pad_rows(a, rows):
    return a if a.shape[0] == rows else jnp.pad(a, ((0, rows - a.shape[0]), (0, 0)))


def _gmm_fwd_only(x, w, group_sizes, interpret):
    m = x.shape[0]
    tiling = _tiling(m, x.shape[1], w.shape[2])
    m_pad = -(-m // tiling[0]) * tiling[0]
    y = _megablox().gmm(_pad_rows(x, m_pad), w, group_sizes, x.dtype, tiling, interpret=interpret)
    return y[:m]


def _gmm_vjp_fwd(x, w, group_sizes, interpret):
    return _gmm_fwd_only(x, w, group_sizes, interpret), (x, w, group_sizes)


def _gmm_vjp_bwd(interpret, res, dy):
    x, w, group_sizes = res
    mb = _megablox()
    m, k = x.shape
    n = w.shape[2]
    tm, tk, tn = _tiling(m, k, n)
    m_pad = -(-m // tm) * tm
    dy_p = _pad_rows(dy, m_pad)
    dx = mb.gmm(dy_p, w, group_sizes, x.dtype, (tm, tn, tk), transpose_rhs=True, interpret=interpret)[:m]
    dw = mb.tgmm(_pad_rows(x, m_pad).swapaxes(0, 1), dy_p, group_sizes, w.dtype, (tm, tk, tn),
                 num_actual_groups=w.shape[0], interpret=interpret)
    return dx, dw, None


@functools.lru_cache(maxsize=None)
def _gmm_with_vjp():
    f = jax.custom_vjp(_gmm_fwd_only, nondiff_argnums=(3,))
    f.defvjp(_gmm_vjp_fwd, _gmm_vjp_bwd)
    return f


def _grouped_entry(x, w, group_sizes, *, impl):
    if impl == "ragged_dot":
        return jax.lax.ragged_dot(x, w, group_sizes)
    return _gmm_with_vjp()(x, w, group_sizes, impl == "megablox_interpret")


def grouped_matmul_impl(platform=None) -> str:
    """Which implementation grouped_matmul uses when impl is None:
    TXC_GROUPED_MATMUL_IMPL ("megablox" or "ragged_dot") if set, else
    "megablox" on TPU and "ragged_dot" elsewhere."""
    env = config.get("TXC_GROUPED_MATMUL_IMPL")
    if env is not None:
        return env
    return "megablox" if (platform or runtime.platform()) == "tpu" else "ragged_dot"


def grouped_matmul(x, w, group_sizes, *, impl=None):
    """See the module comment. impl: None (grouped_matmul_impl()),
    "megablox" or "ragged_dot"."""
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
    platform = runtime.platform()
    impl = impl or grouped_matmul_impl(platform)
    if impl not in _IMPLS:
        raise ValueError(f"{op}: impl must be None, 'megablox' or 'ragged_dot', got {impl!r}")
    if impl == "megablox":
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"{op}: the megablox kernel takes float32 or bfloat16, got {x.dtype} "
                             f"(use impl='ragged_dot')")
        if platform != "tpu":
            impl = "megablox_interpret"
    return call_jax(_grouped_entry, x, w, group_sizes.to(torch.int32), impl=impl)
