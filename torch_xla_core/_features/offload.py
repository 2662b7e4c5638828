"""Host offloading: moving values between device memory and host memory.

    from torch_xla_core.offload import place_to_host, place_to_device, offload_activations
    h = place_to_host(t)          # t's value in pinned host memory
    t2 = place_to_device(h)       # back in device memory
    with offload_activations(threshold_bytes=1 << 16):
        loss = model(x).sum()     # tensors saved for backward go to the host...
    loss.backward()               # ...and come back when the backward uses them

This module owns the Python API; the IR is the core op "place" (attribute:
the target memory kind, so the direction is part of the graph's hash),
lowered to XLA's `annotate_device_placement` custom call
(csrc/ops/placement.cpp). A synced result that was placed on the host stays
in host memory (the compiled program's output memory kind); a later graph
declares it as a host argument and brings it back to the device where it is
used. The executor's cache key carries the graph's input and output memory
kinds (executor.Key.memory). Gradients pass through both ops unchanged.

XLA decides when the copies run (the whole step is one graph): offload pays
off for large activations with enough compute between their forward and
backward use, and within scan loops (scan(..., policy="offload"),
torch_xla_core/scan.py). A round trip within one graph (an activation
offloaded in the forward and brought back for the backward) is lowered with
an optimization barrier between its two placements, which XLA:GPU would
otherwise fold away (csrc/ops/placement.cpp). XLA:CPU keeps host and device in the same memory and
drops the annotations; there the placement shows in the StableHLO
(txc.debug.stablehlo), the output memory kinds and the numerics.
"""
import contextlib

import torch

from .._tracing import tensor as _tensor
from .._runtime import runtime
from .._tracing.tensor import OP, XlaTensor

__all__ = ["place_to_host", "place_to_device", "offload_activations", "memory_kind", "HOST", "DEVICE"]

HOST = "pinned_host"
DEVICE = "device"
_KINDS = (HOST, DEVICE)


def _desc(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _check_kind(kind):
    if kind not in _KINDS:
        raise ValueError(f"torch_xla_core.offload: unknown memory kind {kind!r}; use 'pinned_host' (host memory) "
                         f"or 'device'")
    if kind == HOST:
        runtime.require_memory_kind(HOST, "torch_xla_core.offload")


def _check_tensor(t, what):
    if not isinstance(t, XlaTensor):
        where = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
        raise TypeError(f"torch_xla_core.offload.{what}: expected a tensor on the xla device, got {where}"
                        + (f" ({_desc(t)}); move it with .to('xla') first" if isinstance(t, torch.Tensor) else ""))


class _Place(torch.autograd.Function):
    """The placement op; its gradient is the identity."""

    @staticmethod
    def forward(ctx, t, kind):
        return _tensor.wrap(_tensor.lazy_op(OP.place, (t._lt,), (kind,)))

    @staticmethod
    def backward(ctx, g):
        return g, None


def place(t: torch.Tensor, kind: str) -> torch.Tensor:
    """t's value in memory kind `kind` ('pinned_host' or 'device')."""
    _check_tensor(t, "place")
    _check_kind(kind)
    return _Place.apply(t, kind)


def place_to_host(t: torch.Tensor) -> torch.Tensor:
    """t's value in pinned host memory (differentiable: the gradient passes through)."""
    _check_tensor(t, "place_to_host")
    _check_kind(HOST)
    return _Place.apply(t, HOST)


def place_to_device(t: torch.Tensor) -> torch.Tensor:
    """t's value in device memory (differentiable: the gradient passes through)."""
    _check_tensor(t, "place_to_device")
    return _Place.apply(t, DEVICE)


def memory_kind(t: torch.Tensor) -> str:
    """Where t's value lives (or will, once computed): 'device' or 'pinned_host'."""
    _check_tensor(t, "memory_kind")
    return t._lt.memory_kind


class _Offloaded:
    """What the pack hook keeps: the host copy, and the original's identity."""
    __slots__ = ("host", "requires_grad")

    def __init__(self, host, requires_grad):
        self.host, self.requires_grad = host, requires_grad


@contextlib.contextmanager
def offload_activations(threshold_bytes: int = 1 << 16):
    """Within this context, tensors that autograd saves for the backward pass
    (activations) and that hold at least `threshold_bytes` are placed in host
    memory; the backward brings each back to the device when it uses it.
    Smaller tensors, and tensors not on the xla device, stay where they are.
    Contexts nest: the innermost one's threshold applies (threshold_bytes=None
    inside an outer context turns offload off for that block)."""
    if threshold_bytes is not None:
        if isinstance(threshold_bytes, bool) or not isinstance(threshold_bytes, int) or threshold_bytes < 0:
            raise ValueError(f"offload_activations: threshold_bytes must be an int >= 0 (or None to keep "
                             f"activations on the device), got {threshold_bytes!r}")
        _check_kind(HOST)

    def pack(t):
        if threshold_bytes is None or not isinstance(t, XlaTensor) or t._lt.memory_kind != DEVICE:
            return t
        if t.numel() * t.element_size() < threshold_bytes:
            return t
        with torch.no_grad():
            h = _tensor.wrap(_tensor.lazy_op(OP.place, (t._lt,), (HOST,)))
        return _Offloaded(h, t.requires_grad)

    def unpack(p):
        if not isinstance(p, _Offloaded):
            return p
        with torch.no_grad():
            return _tensor.wrap(_tensor.lazy_op(OP.place, (p.host._lt,), (DEVICE,)))

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
