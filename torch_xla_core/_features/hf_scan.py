"""scan_decoder_layers: a Hugging Face model's decoder stack run as one scan
loop (torch_xla_core.scan.scan_layers) without rewriting the model.

    model = transformers.LlamaForCausalLM(config).to(txc.device())
    txc.scan.scan_decoder_layers(model)       # in place; returns the model
    loss = model(input_ids=ids, labels=ids).loss   # decoder layers: one stablehlo.while

How it works. The model's decoder (model.model, LlamaModel) loops
`for decoder_layer in self.layers[:n]: hidden_states = decoder_layer(hidden_states, **kw)`.
The layers' ModuleList becomes a ScannedLayers (its class is swapped in
place: the same modules, parameters, state_dict keys and optimizer
references). While the decoder's forward runs, iterating those layers (or a
slice of them) yields ONE callable that runs all of them through
scan_layers, so the loop's body runs once and traces one loop; everywhere
else (state_dict, `for layer in model.model.layers`, indexing) it is the
ordinary ModuleList. undo: scan_decoder_layers(model, enable=False).

What is scanned, and what is not (each checked, never guessed):
  * The decoder's forward must loop over its layers with exactly that one
    statement as the loop body (read from its source with ast), or
    `for i, layer in enumerate(self.layers[:n])` where i only picks
    `self.config.layer_types[i]` (Qwen2, Mistral: all layer types must then
    be equal). A loop that does more per layer is refused when
    scan_decoder_layers is called, naming the loop.
  * The layers must have one structure (as scan_layers requires) and the same
    non-tensor attributes apart from layer_idx: a model whose layers differ
    (Gemma2's alternating sliding-window layers: config.layer_types,
    sliding_window) is refused, naming what differs.
  * A KV cache being filled cannot be scanned (each layer writes its own
    cache slot, by layer_idx). In training with gradients (module.training
    and torch.is_grad_enabled()) on the xla device and no cache passed in,
    use_cache is set to False, the rule transformers itself applies under
    gradient checkpointing (which scan's default recompute policy is): the
    output's past_key_values is then None (a warning says so, once). Any
    call that still has a cache (generation, eval with use_cache, a cache
    passed in), that asks for per-layer outputs (output_hidden_states /
    output_attentions), or whose hidden states are not on the xla device
    runs the unrolled loop, the model's own; metrics counters
    "scan_hf_scanned" / "scan_hf_unrolled" count which ran.
  * Works under txc.compile (the scanned step is recorded and replayed).
    The counter that scan_decoder_layers keeps while the forward runs is per
    model, not per thread: do not run one model's forward in two threads.
"""
import ast
import inspect
import textwrap
import warnings

import torch
import torch.nn as nn

from .scan_layers import scan_layers
from .._ops.scan_policy import check_policy
from .._tracing.tensor import XlaTensor
from .. import metrics

__all__ = ["scan_decoder_layers", "ScannedLayers"]

_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")
_SKIP_ATTRS = {"layer_idx", "training"}


def _collecting():
    """True while transformers' output capture (output_hidden_states /
    output_attentions) is collecting per-layer outputs."""
    try:
        from transformers.utils.output_capturing import _active_collector  # lazy: optional dependency
    except ImportError:  # another transformers layout: be safe only by the flags
        return False
    try:
        return bool(_active_collector.get())
    except LookupError:  # not inside a capturing forward
        return False


class _Stack:
    """What the decoder's loop iterates over while scanned: one callable that
    runs every layer."""

    def __init__(self, layers, policy):
        self.layers, self.policy = layers, policy

    def __iter__(self):
        return iter((self,) if self.layers else ())

    def __len__(self):
        return 1 if self.layers else 0

    def __getattr__(self, name):  # decoder_layer.attention_type and the like: the same on every layer (checked)
        return getattr(self.__dict__["layers"][0], name)

    def __call__(self, hidden_states, *args, **kwargs):
        why = self._unscannable(hidden_states, kwargs)
        if why is not None:
            metrics.counter_add("scan_hf_unrolled")
            for layer in self.layers:
                hidden_states = layer(hidden_states, *args, **kwargs)
            return hidden_states
        metrics.counter_add("scan_hf_scanned")
        return scan_layers(self.layers, hidden_states, *args, policy=self.policy, **kwargs)

    @staticmethod
    def _unscannable(hidden_states, kwargs):
        if not isinstance(hidden_states, XlaTensor):
            return "hidden states not on the xla device"
        for k in _CACHE_KWARGS:
            if kwargs.get(k) is not None:
                return f"a KV cache ({k}) is being filled"
        if kwargs.get("output_attentions") or _collecting():
            return "per-layer outputs requested"
        return None


class ScannedLayers(nn.ModuleList):
    """A decoder's layers whose iteration, while the decoder's forward runs,
    is one scan_layers call (see the module docstring)."""

    def _scanning(self):
        return self.__dict__.get("_txc_depth", 0) > 0

    def __getitem__(self, idx):
        if isinstance(idx, slice) and self._scanning():
            return _Stack(list(self._modules.values())[idx], self._txc_policy)
        return super().__getitem__(idx)

    def __iter__(self):
        if self._scanning():
            return iter(_Stack(list(self._modules.values()), self._txc_policy))
        return super().__iter__()


def _find_decoder(model):
    """(decoder module, attribute name of its layers) for a model, a causal
    LM wrapping one (model.model), or a decoder itself."""
    cands = [model]
    for name in ("model", "decoder", "transformer"):
        sub = getattr(model, name, None)
        if isinstance(sub, nn.Module):
            cands.append(sub)
    for m in cands:
        layers = getattr(m, "layers", None)
        if isinstance(layers, nn.ModuleList):
            return m, "layers"
    raise TypeError(f"scan_decoder_layers: found no decoder layers in {type(model).__name__} (looked for an "
                    f"nn.ModuleList named 'layers' on the model and on model.model / .decoder / .transformer); "
                    f"call torch_xla_core.scan.scan_layers(layers, hidden_states, ...) in your own loop instead")


def _check_loop(decoder, attr):
    """The decoder's forward must loop `for L in self.<attr>[...]:` with the
    single statement `h = L(h, ...)` as its body."""
    fwd = type(decoder).forward
    fwd = inspect.unwrap(fwd)
    where = f"{type(decoder).__name__}.forward"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fwd)))
    except (OSError, TypeError, SyntaxError) as e:
        raise TypeError(f"scan_decoder_layers: cannot read the source of {where} ({e}) to check its layer loop; "
                        f"call torch_xla_core.scan.scan_layers in your own loop instead") from None

    def over_layers(it):
        if isinstance(it, ast.Subscript) and isinstance(it.slice, ast.Slice):
            it = it.value
        return (isinstance(it, ast.Attribute) and it.attr == attr and isinstance(it.value, ast.Name)
                and it.value.id == "self")

    def layer_iter(loop):
        """(loop target name of the layer, name of its index or None), or None."""
        it, tgt = loop.iter, loop.target
        if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate"
                and len(it.args) == 1 and not it.keywords and isinstance(tgt, ast.Tuple) and len(tgt.elts) == 2
                and all(isinstance(e, ast.Name) for e in tgt.elts)):
            return (tgt.elts[1].id, tgt.elts[0].id) if over_layers(it.args[0]) else None
        if isinstance(tgt, ast.Name) and over_layers(it):
            return tgt.id, None
        return None

    loops = [(n, layer_iter(n)) for n in ast.walk(tree) if isinstance(n, ast.For)]
    loops = [(n, names) for n, names in loops if names is not None]
    if len(loops) != 1:
        raise TypeError(f"scan_decoder_layers: {where} has {len(loops)} loops over self.{attr} (expected one "
                        f"`for layer in self.{attr}[...]:`); call torch_xla_core.scan.scan_layers in your own "
                        f"loop instead")
    loop, (name, index) = loops[0]
    body = loop.body
    ok = (not loop.orelse and len(body) == 1
          and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1
          and isinstance(body[0].targets[0], ast.Name) and isinstance(body[0].value, ast.Call)
          and isinstance(body[0].value.func, ast.Name) and body[0].value.func.id == name
          and body[0].value.args and isinstance(body[0].value.args[0], ast.Name)
          and body[0].value.args[0].id == body[0].targets[0].id)
    uses_types = False
    if ok and index is not None:
        # the index may only pick the layer's type: self.config.layer_types[i] (checked equal for all layers)
        allowed = set()
        for n in ast.walk(body[0]):
            if (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Name) and n.slice.id == index
                    and ast.unparse(n.value) == "self.config.layer_types"):
                allowed.add(id(n.slice))
        uses = [n for n in ast.walk(body[0]) if isinstance(n, ast.Name) and n.id == index]
        ok = all(id(n) in allowed for n in uses)
        uses_types = bool(uses)
    if not ok:
        raise TypeError(f"scan_decoder_layers: the layer loop of {where} (line {loop.lineno} of its source) does "
                        f"more than `hidden_states = layer(hidden_states, ...)` per layer, so running all layers "
                        f"as one call would change what it computes; call torch_xla_core.scan.scan_layers in your "
                        f"own loop instead")
    return uses_types


def _check_layer_types(decoder, n):
    types_ = list(getattr(getattr(decoder, "config", None), "layer_types", None) or [])[:n]
    if len(set(types_)) > 1:
        i = next(j for j, t in enumerate(types_) if t != types_[0])
        raise TypeError(f"scan_decoder_layers: config.layer_types differ (layer {i} is {types_[i]!r}, layer 0 "
                        f"{types_[0]!r}): the loop gives each layer the mask of its type, and the scan runs every "
                        f"layer as layer 0; only models whose layers are all of one type can be scanned")


def _simple(v):
    return v is None or isinstance(v, (bool, int, float, str, tuple, torch.dtype))


def _check_attrs(layers):
    """Non-tensor attributes every layer's submodules hold must be equal
    (apart from layer_idx): the scan runs layer 0's code for all."""
    ref = {n: m.__dict__ for n, m in layers[0].named_modules()}
    for i, layer in enumerate(layers[1:], 1):
        for n, m in layer.named_modules():
            d0 = ref.get(n)
            if d0 is None:
                continue  # scan_layers names structural differences itself
            for k, v in m.__dict__.items():
                if k.startswith("_") or k in _SKIP_ATTRS or not _simple(v):
                    continue
                if k in d0 and d0[k] != v:
                    path = f"{n}.{k}" if n else k
                    raise TypeError(f"scan_decoder_layers: layer {i}'s {path} is {v!r}, layer 0's is {d0[k]!r}; "
                                    f"the scan runs every layer as layer 0, so layers must differ only in their "
                                    f"weights (and layer_idx). Scan runs of equal layers yourself with "
                                    f"torch_xla_core.scan.scan_layers, or leave this model unrolled")


def _pre_hook(decoder, args, kwargs):
    layers = getattr(decoder, decoder._txc_scan_attr)
    layers.__dict__["_txc_depth"] = layers.__dict__.get("_txc_depth", 0) + 1
    cache_in = any(kwargs.get(k) is not None for k in _CACHE_KWARGS)
    use_cache = kwargs.get("use_cache")
    if use_cache is None:
        use_cache = getattr(getattr(decoder, "config", None), "use_cache", False)
    if use_cache and not cache_in and decoder.training and torch.is_grad_enabled() and _on_xla(decoder):
        if not decoder.__dict__.get("_txc_warned"):
            decoder.__dict__["_txc_warned"] = True
            warnings.warn("scan_decoder_layers: training with gradients, so use_cache=True is set to False (as "
                          "transformers does under gradient checkpointing): a KV cache cannot be filled inside a "
                          "scan. Pass use_cache=False (or set config.use_cache=False) to silence this",
                          stacklevel=3)
        kwargs = dict(kwargs, use_cache=False)
        return args, kwargs
    return None


def _on_xla(module):
    p = next(module.parameters(), None)
    return p is not None and isinstance(p, XlaTensor)


def _post_hook(decoder, args, kwargs, out):
    layers = getattr(decoder, decoder._txc_scan_attr)
    layers.__dict__["_txc_depth"] = max(0, layers.__dict__.get("_txc_depth", 0) - 1)


def scan_decoder_layers(model, policy="recompute", enable=True):
    """Makes `model`'s decoder layers run as one scan loop in every forward
    (in place; returns model). model: a transformers causal LM
    (LlamaForCausalLM, MistralForCausalLM, ...) or its decoder (LlamaModel).
    policy: scan_layers' ("recompute": the backward re-runs each layer's
    forward, like gradient checkpointing; "save": residuals kept stacked,
    no recompute; "offload"). enable=False restores the unrolled loop.
    Raises TypeError, naming why, for a model whose loop or layers cannot be
    scanned; see the module docstring for the calls that run unrolled."""
    check_policy(policy, "scan_decoder_layers")
    decoder, attr = _find_decoder(model)
    layers = getattr(decoder, attr)
    handles = decoder.__dict__.pop("_txc_scan_handles", None)
    if handles:
        for h in handles:
            h.remove()
    if not enable:
        if isinstance(layers, ScannedLayers):
            layers.__class__ = nn.ModuleList
            layers.__dict__.pop("_txc_depth", None)
            layers.__dict__.pop("_txc_policy", None)
        return model
    if type(layers) not in (nn.ModuleList, ScannedLayers):
        raise TypeError(f"scan_decoder_layers: {type(decoder).__name__}.{attr} is a {type(layers).__name__}, "
                        f"not a plain nn.ModuleList; its iteration cannot be replaced safely")
    uses_types = _check_loop(decoder, attr)
    mods = list(layers)
    if uses_types:
        _check_layer_types(decoder, len(mods))
    if mods:
        first = type(mods[0])
        for i, m in enumerate(mods[1:], 1):
            if type(m) is not first:
                raise TypeError(f"scan_decoder_layers: layer {i} is a {type(m).__name__}, layer 0 is a "
                                f"{first.__name__}; all layers must have the same structure")
        _check_attrs(mods)
    layers.__class__ = ScannedLayers
    layers.__dict__["_txc_policy"] = policy
    layers.__dict__["_txc_depth"] = 0
    decoder.__dict__["_txc_scan_attr"] = attr
    decoder.__dict__["_txc_scan_handles"] = [
        decoder.register_forward_pre_hook(_pre_hook, with_kwargs=True),
        decoder.register_forward_hook(_post_hook, with_kwargs=True, always_call=True),
    ]
    return model
