"""torch_xla.experimental.scan over txc.scan.scan: fn traced once into one
loop. partition_fn picks what the forward keeps for the backward:
functorch's default_partition (torch_xla's default: keep the activations)
is policy "save", min_cut_rematerialization_partition is "recompute" (the
backward re-runs fn). is_fn_pure is accepted: traces are reused whenever fn
and its inputs' structure, shapes and dtypes are the same (txc.scan says
when fn is traced again)."""
import weakref

import torch.utils._pytree as pytree
from functorch.compile import default_partition, min_cut_rematerialization_partition

from .... import scan as _scan

__all__ = ["scan"]


class _TraceCache(weakref.WeakKeyDictionary):
    """fn -> {(id(partition_fn), leaf shapes and dtypes, tree specs): policy}
    for the fns scanned with is_fn_pure=True (torch_xla's
    _SCAN_COMPUTATION_CACHE); clear() also forgets every traced body."""

    def clear(self):
        super().clear()
        _scan.clear_cache()


_SCAN_COMPUTATION_CACHE = _TraceCache()


def _key(partition_fn, init, xs):
    def meta(tree):
        leaves, spec = pytree.tree_flatten(tree)
        return tuple((tuple(t.shape), t.dtype) for t in leaves if t is not None), spec
    return (id(partition_fn), *meta(init), *meta(xs))


def policy_of(partition_fn, who: str) -> str:
    """txc.scan's policy for a functorch partition function."""
    if partition_fn is None or partition_fn is default_partition:
        return "save"
    if partition_fn is min_cut_rematerialization_partition:
        return "recompute"
    raise ValueError(f"{who}: partition_fn {getattr(partition_fn, '__name__', partition_fn)!r} is not supported; "
                     f"torch_xla_core takes functorch's default_partition (keep activations) or "
                     f"min_cut_rematerialization_partition (recompute them), or txc.scan's "
                     f"policy='offload' (activations in host memory)")


def scan(fn, init, xs, partition_fn=default_partition, is_fn_pure: bool = False):
    """carry, ys = fn applied over the leading dim of xs (pytrees), threading
    the carry: torch_xla's scan(fn, init, xs, partition_fn, is_fn_pure)."""
    if not callable(fn):
        raise ValueError(f"scan: fn must be callable (fn(carry, x) -> (carry, y)), got {type(fn).__name__}")
    policy = policy_of(partition_fn, "scan")
    if is_fn_pure:
        _SCAN_COMPUTATION_CACHE.setdefault(fn, {})[_key(partition_fn, init, xs)] = policy
    return _scan.scan(fn, init, xs, policy=policy, pure=is_fn_pure)
