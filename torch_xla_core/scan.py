"""scan, scan_layers and scan_decoder_layers: run a function over the slices
of stacked inputs as ONE loop in the graph, so that compile time does not
grow with the number of iterations (layers).

    from torch_xla_core.scan import scan, scan_layers
    carry, ys = scan(fn, init, xs)      # fn(carry, x) -> (carry, y); pytrees of xla tensors
    x = scan_layers(model.layers, x)    # instead of: for layer in model.layers: x = layer(x)
    txc.scan.scan_decoder_layers(hf_model)   # a transformers causal LM's decoder layers, in place

The public face of three modules in two layers (ARCHITECTURE.md, "Layers"):
the scan operator, with its rules for when a body is traced again, is an op
(torch_xla_core/_ops/scan.py, its body trace in _ops/scan_trace.py, policies
in _ops/scan_policy.py); scan_layers (_features/scan_layers.py) and
scan_decoder_layers (_features/hf_scan.py) are features built on it."""
from ._ops.scan import clear_cache, scan
from ._features.scan_layers import scan_layers
from ._features.hf_scan import scan_decoder_layers

__all__ = ["scan", "scan_layers", "scan_decoder_layers", "clear_cache"]
