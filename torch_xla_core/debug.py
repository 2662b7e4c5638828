"""What a sync would compile, without running it: the traced graph as text
(one core op per line, with the aten op that made it) and the StableHLO the
executor would hand to XLA, for given tensors or for everything pending.
Set TXC_DUMP_DIR to also get every compiled graph written to a folder
(torch_xla_core/_execution/executor.py).

The public face of torch_xla_core/_features/debug.py (the implementation: read it there)."""
from ._features.debug import graph_text, stablehlo, cache_key, explain_recompiles  # noqa: F401

__all__ = ["graph_text", "stablehlo", "cache_key", "explain_recompiles"]
