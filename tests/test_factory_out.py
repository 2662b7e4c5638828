"""Factories whose functional overload torch routes through the out= variant
(linspace, logspace; the signal windows built on them): the result is made on
the out tensor's device, never on the CPU."""
import pytest
import torch

import torch_xla_core as txc


@pytest.mark.parametrize("make", [
    lambda device: torch.linspace(-1.5, 2.0, 7, device=device),
    lambda device: torch.logspace(0.0, 2.0, 5, base=3.0, device=device),
    lambda device: torch.signal.windows.hann(6, device=device),
    lambda device: torch.signal.windows.gaussian(5, std=0.7, device=device),
], ids=["linspace", "logspace", "hann", "gaussian"])
def test_factory_on_xla(make, dev):
    x = make(dev)
    assert x.device.type == "xla"
    torch.testing.assert_close(x.cpu(), make("cpu"))
    assert not txc.metrics.fallbacks()


def test_linspace_out(dev):
    out = torch.empty(4, device=dev)
    r = torch.linspace(0.0, 3.0, 4, out=out)
    assert r is out
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), torch.tensor([0.0, 1.0, 2.0, 3.0]))


@pytest.mark.parametrize("args", [(-3.5, 10, 6), (0.7, 9.9, 5), (-2.2, -9.9, 4), (0.5, 7.5, 8)])
def test_integer_linspace_and_arange_truncate_float_bounds_as_aten(dev, args):
    """An integer linspace / arange takes float bounds as integers first, as
    ATen's kernels do (linspace(-3.5, 10, 6, dtype=int64) steps from -3)."""
    want = torch.linspace(*args, dtype=torch.int64)
    torch.testing.assert_close(torch.linspace(*args, dtype=torch.int64, device=dev).cpu(), want)
    out = torch.empty(args[2], dtype=torch.int64, device=dev)
    torch.testing.assert_close(torch.linspace(*args, out=out).cpu(), want)
    step = 2.0 if args[1] > args[0] else -2.0
    torch.testing.assert_close(torch.arange(args[0], args[1], step, dtype=torch.int64, device=dev).cpu(),
                               torch.arange(args[0], args[1], step, dtype=torch.int64))
