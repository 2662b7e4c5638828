"""torch_xla.experimental.scan_layers over txc.scan.scan_layers: layers of
one structure run as one loop; a tuple input is unpacked (layer(*x))."""
from functorch.compile import default_partition

from .... import scan as _scan
from .scan import policy_of

__all__ = ["scan_layers"]


class _LayerCache(dict):
    """(id(partition_fn), id(first layer)) of the stacks run with
    is_layer_pure=True (torch_xla's _ONE_LAYER_CACHE); clear() also forgets
    every traced body."""

    def clear(self):
        super().clear()
        _scan.clear_cache()


_ONE_LAYER_CACHE = _LayerCache()


def scan_layers(layers, input_data, partition_fn=default_partition, is_layer_pure: bool = False):
    """The output of the last layer, each layer fed the previous one's output
    (torch_xla's scan_layers(layers, input_data, partition_fn, is_layer_pure))."""
    policy = policy_of(partition_fn, "scan_layers")
    layers = list(layers)
    _check_same_structure(layers)
    if is_layer_pure and layers:
        _ONE_LAYER_CACHE[(id(partition_fn), id(layers[0]))] = policy
    return _scan.scan_layers(layers, input_data, policy=policy)


def _check_same_structure(layers) -> None:
    """torch_xla's checks, with its ValueErrors: every layer has layer 0's
    parameter and buffer names ("mismatched keys") and shapes ("Shape mismatch")."""
    if not layers:
        return
    for get in (lambda m: dict(m.named_parameters()), lambda m: dict(m.named_buffers())):
        ref = get(layers[0])
        for i, layer in enumerate(layers[1:], 1):
            cur = get(layer)
            if set(cur) != set(ref):
                raise ValueError(f"scan_layers: Layer {i} has mismatched keys: missing {sorted(set(ref) - set(cur))}, "
                                 f"extra {sorted(set(cur) - set(ref))}")
            for k, v in ref.items():
                if cur[k].shape != v.shape:
                    raise ValueError(f"scan_layers: Shape mismatch for '{k}' in layer {i}: expected "
                                     f"{tuple(v.shape)}, got {tuple(cur[k].shape)}")

