"""Errors users meet first: each names the op/tensor/setting at fault, is
the error torch raises (CPU eager as the oracle), and leaves the process
working. Mixed devices, negative sizes, formatting, complex32, device
indices."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_xla_core as txc

SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, xla:0 and cpu!"


def _mixed_cases(dev):
    x = torch.randn(2, 3, device=dev)
    c, w = torch.randn(2, 3), torch.randn(4, 3)
    return {
        "linear": lambda: torch.nn.Linear(3, 4)(x),           # CPU weight and bias (addmm)
        "linear_no_bias": lambda: F.linear(x, w),             # mm of a transposed CPU weight
        "matmul": lambda: x @ w.t(),
        "bmm": lambda: torch.bmm(x[None], w.t()[None]),
        "addmm": lambda: torch.addmm(torch.zeros(4), x, w.t()),
        "add": lambda: x + c,
        "rsub": lambda: c - x,
        "where": lambda: torch.where(x > 0, c, x),
        "cat": lambda: torch.cat([x, c]),
        "conv2d": lambda: F.conv2d(torch.randn(1, 3, 5, 5, device=dev), torch.randn(2, 3, 3, 3)),
        "layer_norm": lambda: F.layer_norm(x, (3,), torch.ones(3), torch.zeros(3)),
        "embedding": lambda: F.embedding(torch.tensor([0, 1], device=dev), w),
        "mse_loss": lambda: F.mse_loss(x, c),
        "cross_entropy": lambda: F.cross_entropy(x, torch.tensor([0, 1])),
        "einsum": lambda: torch.einsum("ij,kj->ik", x, w),
        "lerp": lambda: torch.lerp(x, c, 0.5),
        "equal": lambda: torch.equal(x, c),
        "equal_cpu_first": lambda: torch.equal(c, x),
        "equal_0d_cpu": lambda: torch.equal(x[0, 0], torch.tensor(1.0)),
    }


@pytest.mark.parametrize("name", list(_mixed_cases("cpu")))
def test_mixed_devices_raise_torchs_error(name, dev):
    with pytest.raises(RuntimeError) as e:
        _mixed_cases(dev)[name]()
    assert str(e.value).startswith(SAME_DEVICE), str(e.value)
    assert (torch.ones(2, device=dev) + 1).cpu().tolist() == [2.0, 2.0]  # still working


def test_linear_works_once_moved(dev):
    lin = torch.nn.Linear(3, 4)
    x = torch.randn(2, 3)
    torch.testing.assert_close(lin.to(dev)(x.to(dev)).cpu(), lin.cpu()(x))


def test_equal_on_device_matches_cpu(dev):
    nan = float("nan")
    pairs = [(torch.ones(3), torch.ones(3)), (torch.ones(3), torch.zeros(3)), (torch.ones(3), torch.ones(4)),
             (torch.ones(2, 3), torch.ones(3)), (torch.tensor([nan]), torch.tensor([nan])),
             (torch.ones(3), torch.ones(3, dtype=torch.int64)), (torch.ones(0), torch.ones(0))]
    for a, b in pairs:
        assert torch.equal(a.to(dev), b.to(dev)) is torch.equal(a, b)


NEGATIVE = {
    "empty": lambda d: torch.empty(-1, 3, device=d),
    "zeros": lambda d: torch.zeros(-1, 3, device=d),
    "ones": lambda d: torch.ones(2, -3, device=d),
    "full": lambda d: torch.full((-1, 3), 2.0, device=d),
    "rand": lambda d: torch.rand(-1, 3, device=d),
    "randn": lambda d: torch.randn(-1, device=d),
    "randint": lambda d: torch.randint(0, 5, (-2,), device=d),
    "empty_strided": lambda d: torch.empty_strided((-1, 3), (3, 1), device=d),
    "new_zeros": lambda d: torch.ones(2, device=d).new_zeros((-1,)),
    "new_full": lambda d: torch.ones(2, device=d).new_full((-1,), 1.0),
    "new_empty": lambda d: torch.ones(2, device=d).new_empty((3, -1)),
}


@pytest.mark.parametrize("name", list(NEGATIVE))
def test_negative_sizes_raise_torchs_error(name, dev):
    with pytest.raises(RuntimeError) as want:
        NEGATIVE[name]("cpu")
    with pytest.raises(RuntimeError) as got:
        NEGATIVE[name](dev)
    assert str(got.value) == str(want.value)  # "Trying to create tensor with negative dimension -1: [-1, 3]"


@pytest.mark.parametrize("numel,shape", [(0, (-1, 0)), (0, (3, 0, -1, 0)), (4, (-1, 0)), (4, (-1, 3))])
def test_reshape_that_cannot_infer_its_size_raises_with_torchs_words(numel, shape, dev):
    with pytest.raises(RuntimeError) as want:
        torch.ones(numel).view(*shape)
    with pytest.raises(RuntimeError) as got:
        torch.ones(numel, device=dev).view(*shape)
    words = "can be any value and is ambiguous" if numel == 0 else "is invalid for input of size"
    assert words in str(want.value) and words in str(got.value)


@pytest.mark.parametrize("value,spec", [(1.23456, ".3f"), (1.5, "8.2e"), (7, ">4d"), (7, "x"), (True, ""),
                                        (-0.5, "+.1%"), (3.0, "")])
def test_format_of_0d_tensor_matches_cpu(value, spec, dev):
    t = torch.tensor(value)
    assert format(t.to(dev), spec) == format(t, spec)


def test_format_of_tensor_with_dims(dev):
    t = torch.ones(2, device=dev)
    assert f"{t}" == str(t)
    with pytest.raises(TypeError):
        f"{t:.2f}"


# Every way a device index reaches us, as source (also run in a subprocess).
DEVICE_PATHS = {
    "factory": 'lambda d: torch.ones(3, device=d)',
    "full": 'lambda d: torch.full((2,), 1.0, device=d)',
    "arange": 'lambda d: torch.arange(3, device=d)',
    "rand": 'lambda d: torch.rand(3, device=d)',
    "randint": 'lambda d: torch.randint(0, 3, (2,), device=d)',
    "tensor": 'lambda d: torch.tensor([1.0, 2.0], device=d)',
    "cpu.to": 'lambda d: torch.ones(3).to(d)',
    "xla.to": 'lambda d: torch.ones(3, device="xla").to(d)',
    "module.to": 'lambda d: torch.nn.Linear(2, 2).to(d)',
    "zeros_like": 'lambda d: torch.zeros_like(torch.ones(2, device="xla"), device=d)',
    "empty_like_of_cpu": 'lambda d: torch.empty_like(torch.ones(2), device=d)',
    "new_ones": 'lambda d: torch.ones(2, device="xla").new_ones(3, device=d)',
}


@pytest.mark.parametrize("path", list(DEVICE_PATHS))
def test_device_index_that_is_no_device_is_refused(path, dev):
    n = txc.device_count()
    with pytest.raises(RuntimeError, match=rf"xla:{n + 4} is not a device: this process has {n} xla device"):
        eval(DEVICE_PATHS[path])(f"xla:{n + 4}")
    assert eval(DEVICE_PATHS[path])("xla:0") is not None  # still working
    assert torch.ones(1, device="xla").device == torch.device("xla", 0)


def test_second_real_device_holds_tensors_and_third_is_refused():
    # two CPU devices in a fresh process (XLA's own flag): every path puts its
    # tensor on xla:1 for real (its buffer lies there); xla:2 is no device
    code = textwrap.dedent("""
        import torch, torch_xla_core as txc
        from torch_xla_core import _tensor, runtime
        assert txc.device_count() == 2, txc.device_count()
        paths = {PATHS}
        for name, f in paths.items():
            t = f("xla:1")
            if isinstance(t, torch.nn.Module):
                t = next(t.parameters())
            assert t.device == torch.device("xla", 1), (name, t.device)
            assert runtime.device_index(_tensor.materialize(t)) == 1, name
            try:
                f("xla:2")
            except RuntimeError as e:
                assert "xla:2 is not a device: this process has 2 xla devices" in str(e), (name, str(e))
            else:
                raise AssertionError(f"{name}: xla:2 accepted")
        assert (torch.ones(2, device="xla:0") * 2).cpu().tolist() == [2.0, 2.0]
        print("ok")
    """).replace("{PATHS}", "{" + ", ".join(f"{k!r}: {v}" for k, v in DEVICE_PATHS.items()) + "}")
    env = dict(os.environ, PJRT_DEVICE="CPU", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr[-3000:]



# Where a complex32 tensor can enter (XLA has no complex type with 16-bit
# parts), and the op the error must name. complex64/complex128 are supported:
# tests/test_complex.py.
CHALF_PATHS = {
    "ones": ('lambda x: torch.ones(2, dtype=torch.complex32, device="xla")', "aten::empty"),
    "arange": ('lambda x: torch.zeros(3, dtype=torch.complex32, device="xla") + 1', "aten::empty"),
    "cpu_to_xla": ('lambda x: torch.ones(2, dtype=torch.complex32).to("xla")', "aten::empty_strided"),
    "to_dtype": ("lambda x: x.to(torch.complex32)", "aten::_to_copy"),
    "zeros_like": ("lambda x: torch.zeros_like(x, dtype=torch.complex32)", "_like"),
    "new_ones": ("lambda x: x.new_ones(2, dtype=torch.complex32)", "aten::new_ones"),
    "complex_half": ("lambda x: torch.complex(x.half(), x.half())", "aten::complex"),
    "view_as_complex_half": ("lambda x: torch.view_as_complex(torch.stack([x, x], -1).half())",
                             "aten::view_as_complex"),
    "chalf_0d_cpu": ("lambda x: x + torch.tensor(1j, dtype=torch.complex32)", "a 0-d CPU tensor"),
}


@pytest.mark.parametrize("path", list(CHALF_PATHS))
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_complex32_is_refused_at_trace_time_naming_the_op(path, dev):
    src, op = CHALF_PATHS[path]
    x = torch.arange(4.0, device=dev)
    with pytest.raises((TypeError, RuntimeError)) as e:
        eval(src)(x)
    msg = str(e.value)
    assert "complex32" in msg and "not supported on the xla device" in msg and op in msg, msg
    # nothing broken is left pending: the next sync and later work are fine
    txc.sync(wait=True)
    assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
