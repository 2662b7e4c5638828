"""torch_xla's names over torch_xla_core (torch_xla_core/compat/torch_xla,
docs/porting.md): each behaviour pytorch/xla's own tests check of them, in
our own tests, numerics against CPU eager; and the differences issue 44
found (a scan body's exception leaves no trace, uneven sharding, tuple
carries in scan_layers, torch_xla's metric names and units)."""
import pytest
import torch
import torch.nn as nn

import torch_xla_core as txc
from torch_xla_core.scan import scan, scan_layers


# --- a failed scan/scan_layers trace leaves nothing pending ---------------------

class _Raises(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x) * 2  # body values the traceback's frame holds
        raise RuntimeError(f"layer failed on {tuple(h.shape)}")


def test_exception_in_a_scan_body_leaves_no_pending_body_value(dev):
    def fn(c, x):
        y = (c + x).sin()  # noqa: F841  (held by the frame in the traceback)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom") as info:
        scan(fn, torch.zeros(3, device=dev), torch.ones(4, 3, device=dev))
    held = info.value  # a user's `except` that keeps the exception
    assert held.__traceback__ is not None
    a = torch.arange(4.0, device=dev) * 3
    txc.sync()  # used to raise "a value computed inside a scan body was used outside of it"
    torch.testing.assert_close(a.cpu(), torch.arange(4.0) * 3)
    # the body's tensors the traceback holds say what happened when used
    frame_locals = [tb.tb_frame.f_locals for tb in _tracebacks(held)]
    y = next(v["y"] for v in frame_locals if "y" in v and isinstance(v["y"], torch.Tensor))
    with pytest.raises(RuntimeError, match="inside a scan body whose trace raised ValueError: boom"):
        y.cpu()


def test_exception_in_a_scan_layers_layer_leaves_no_pending_body_value(dev):
    layers = nn.ModuleList([_Raises(), _Raises()]).to(dev)
    x = torch.randn(2, 3).to(dev)
    with pytest.raises(RuntimeError, match=r"layer failed on \(2, 3\)") as info:
        scan_layers(layers, x)
    kept = info.value  # noqa: F841
    w = layers[0].lin.weight * 1  # the layers' own tensors are untouched
    txc.sync()
    torch.testing.assert_close(w.cpu(), layers[0].lin.weight.detach().cpu())
    torch.testing.assert_close(x.cpu() + 1, (x + 1).cpu())


def _tracebacks(exc):
    tb = exc.__traceback__
    while tb is not None:
        yield tb
        tb = tb.tb_next


# --- scan_layers with a tuple carry: layer(*x) ---------------------------------

class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Linear(3, 3)

    def forward(self, x, y):
        return self.a(x) + y, self.b(y) * x


def test_scan_layers_unpacks_a_tuple_carry_into_the_layer_arguments(dev):
    layers = nn.ModuleList([_Two() for _ in range(3)])
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    ref = (x, y)
    for layer in layers:
        ref = layer(*ref)
    out = scan_layers(layers.to(dev), (x.to(dev), y.to(dev)))
    assert isinstance(out, tuple) and len(out) == 2
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.cpu(), r.detach(), atol=1e-5, rtol=1e-5)
