"""What a sync would compile, without running it: the traced graph as text
(one core op per line, with the aten op that made it) and the StableHLO the
executor would hand to XLA, for given tensors or for everything pending.
Set TXC_DUMP_DIR to also get every compiled graph written to a folder
(torch_xla_core/_execution/executor.py)."""
import torch

from .._execution import executor, recompiles
from .._tracing.tensor import XlaTensor

__all__ = ["graph_text", "stablehlo", "cache_key", "explain_recompiles"]


def _lts(tensors):
    if tensors is None:
        return None
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    out = []
    for t in tensors:
        if not isinstance(t, XlaTensor):
            raise TypeError(f"torch_xla_core.debug: expected xla tensors, got a {type(t).__name__} on "
                            f"{getattr(t, 'device', '?')}; move it with .to('xla') first")
        out.append(t._lt)
    return out


def graph_text(tensors=None) -> str:
    """The graph a sync of `tensors` (default: every pending tensor) would compute."""
    return executor.plan(_lts(tensors)).cut.text()


def stablehlo(tensors=None) -> str:
    """The StableHLO module a sync of `tensors` (default: all pending) would compile."""
    return executor.plan(_lts(tensors)).stablehlo()


def cache_key(tensors=None) -> executor.Key:
    """The compile-cache key of that sync (graph hash, precision, device, platform, donations)."""
    return executor.plan(_lts(tensors)).key


def explain_recompiles(enable: bool = True) -> list:
    """The recompiles explained so far (torch_xla_core.recompiles.Explanation:
    graph hash, call site, nearest earlier graph, what differs). With
    enable=True (the default) also turns explaining on from now on, as
    TXC_DEBUG=recompiles does."""
    if enable:
        recompiles.enable()
    return recompiles.explanations()
