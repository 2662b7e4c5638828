"""Factories whose functional overload torch routes through the out= variant
(linspace, logspace; the signal windows built on them): the result is made on
the out tensor's device, never on the CPU."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core._runtime import torch_compat as _compat


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


ARANGE = [(-0.9, 2.1, 2.0), (0.0, -8.000001, -4.0), (2.1, -2.9, -1.0), (3.1,), (0.5, 5, 1), (0, 3.5, 1.5),
          (0, 64, 0.5), (5, 0, -0.5), (True, True), (-7, 8, 3)]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32], ids=str)
@pytest.mark.parametrize("args", ARANGE, ids=str)
def test_arange_length_and_values_as_this_torchs_kernel(dev, args, dtype):
    """An integer arange steps from its bounds and step truncated; its length
    is ceil((end - start) / step) over the real values, except int64 on torch
    2.11-2.13 (the truncated ones: arange(-0.9, 2.1, 2) is [0] there, [0, 2]
    on torch >= 2.14), where a step that truncates to 0 raises (those
    kernels divide by it: SIGFPE)."""
    if dtype == torch.int64 and _compat.ARANGE_INT64_TRUNCATED_LENGTH and len(args) == 3 and int(args[2]) == 0:
        with pytest.raises(RuntimeError, match=r"arange: step .* truncates to 0 for torch.int64"):
            torch.arange(*args, dtype=dtype, device=dev)
        return
    want = torch.arange(*args, dtype=dtype)
    got = torch.arange(*args, dtype=dtype, device=dev)
    assert got.device.type == "xla" and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want)


@pytest.mark.parametrize("args,match", [
    ((0, 5, -1), "upper bound and lower bound inconsistent with step sign"),
    ((0.5, 0.2, 1), "upper bound and lower bound inconsistent with step sign"),
    ((0, float("inf")), "unsupported range"),
    ((0, 1, 0), "step must be nonzero"),
    ((0, 1e20, 1e19), "cannot be converted to type int64_t without overflow"),
], ids=str)
def test_arange_refuses_what_torch_refuses(dev, args, match):
    kw = {"dtype": torch.int64} if 1e20 in args else {}
    with pytest.raises(RuntimeError, match=match):
        torch.arange(*args, **kw)
    with pytest.raises(RuntimeError, match=match):
        torch.arange(*args, device=dev, **kw)
