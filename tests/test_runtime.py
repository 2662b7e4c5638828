"""Runtime behaviour: compile cache, parameters vs constants, dead tensors,
metrics, fallbacks, device API, PJRT_DEVICE errors, state_dict round trips."""
import subprocess
import sys

import pytest
import torch

import torch_xla_core as txc


def _compiles():
    return txc.metrics.counters().get("compile", 0)


def test_device_api():
    assert txc.device() == torch.device("xla", 0)
    assert torch.device("xla").type == "xla"
    assert txc.device_count() >= 1
    assert txc.runtime.platform() in ("cpu", "cuda", "tpu")
    with pytest.raises(ValueError, match="out of range"):
        txc.device(txc.device_count())


def test_same_step_twice_compiles_once(dev):
    w = torch.randn(8, 8).to(dev)
    def step(x):
        return (x @ w).relu().sum()
    step(torch.randn(4, 8).to(dev)).item()
    n = _compiles()
    for _ in range(3):
        step(torch.randn(4, 8).to(dev)).item()     # new input data, same shapes
    w.copy_(torch.randn(8, 8))                      # new weights, same shapes
    step(torch.randn(4, 8).to(dev)).item()
    assert _compiles() == n
    step(torch.randn(5, 8).to(dev)).item()           # a new shape compiles once more
    assert _compiles() == n + 1
    step(torch.randn(5, 8).to(dev)).item()
    assert _compiles() == n + 1


def test_device_data_is_a_parameter_not_a_constant(dev):
    x = torch.arange(4.0).to(dev)
    y = x * 3
    text = txc.debug.stablehlo(y)
    assert "%arg0: tensor<4xf32>" in text
    assert "dense<[0" not in text and "dense<0.0" not in text.replace("dense<0.00000000000000000e+00>", "")


def test_dead_tensors_are_not_computed(dev):
    txc.sync()  # an earlier test on this worker may leave live pending tensors: the cut below counts them too
    a = torch.ones(3).to(dev)
    b = a * 2
    dead = a + 100
    del dead
    cut = txc._C.GraphCut(None)
    assert cut.num_outputs == 1
    txc.sync()
    assert b.cpu().tolist() == [2.0, 2.0, 2.0]


def test_sync_materializes_everything_and_wait(dev):
    a = torch.ones(3).to(dev) * 5
    b = a.sum()
    txc.sync(wait=True)
    assert a._lt.is_data and b._lt.is_data
    assert txc._C.GraphCut(None).num_outputs == 0


def test_metrics_report_and_clear(dev):
    txc.metrics.clear()
    (torch.ones(2).to(dev) + 1).cpu()
    c = txc.metrics.counters()
    assert c["transfer_to_device"] >= 1 and c["transfer_to_host"] == 1 and c["execute"] == 1
    assert set(txc.metrics.timers()) >= {"sync", "execute", "transfer_to_host"}
    r = txc.metrics.report()
    assert "execute" in r and "transfer_to_host" in r
    txc.metrics.clear()
    assert txc.metrics.counters() == {}


def test_fallback_is_counted_and_warned_once(dev, monkeypatch):
    x = torch.tensor([1.0, 1.0, 2.5, 3.0, 3.0, 0.5])
    txc.metrics.clear()
    # once per process: another test in this worker (test_coverage's fallback row) may have warned already
    monkeypatch.setattr(txc._tensor, "_warned", set())
    with pytest.warns(UserWarning, match="no XLA lowering"):
        out = torch.unique_consecutive(x.to(dev))
    torch.testing.assert_close(out.cpu(), torch.unique_consecutive(x))
    assert out.device.type == "xla"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.unique_consecutive(x.to(dev))
    # its output's shape depends on the values: a counted CPU fallback by design
    assert txc.metrics.fallbacks() == {"unique_consecutive": 2}


def test_unsupported_dtype_error_names_it(dev):
    with pytest.raises(TypeError, match="complex32"):
        torch.zeros(2, dtype=torch.complex32).to(dev)


def test_mixed_device_error(dev):
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3).to(dev) + torch.ones(3)


def test_state_dict_round_trip(dev):
    m = torch.nn.Linear(4, 3)
    mx = torch.nn.Linear(4, 3).to(dev)
    mx.load_state_dict(m.state_dict())
    sd = mx.state_dict()
    assert all(v.device.type == "xla" for v in sd.values())
    for k, v in m.state_dict().items():
        torch.testing.assert_close(sd[k].cpu(), v)
    m2 = torch.nn.Linear(4, 3)
    m2.load_state_dict({k: v.cpu() for k, v in sd.items()})
    torch.testing.assert_close(m2.weight, m.weight)


def test_item_and_bool_and_print(dev):
    x = torch.tensor([1.5, -2.0]).to(dev)
    assert x.sum().item() == pytest.approx(-0.5)
    assert bool((x > 0).any())
    assert "device='xla:0'" in repr(x)
    assert x.tolist() == [1.5, -2.0]
    assert x.numpy().tolist() == [1.5, -2.0]


def test_missing_plugin_error():
    code = "import torch_xla_core as t; t.device()"
    r = subprocess.run([sys.executable, "-c", code], env={"PJRT_DEVICE": "TPU", "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "PJRT_DEVICE=TPU" in r.stderr and "pip install" in r.stderr


def test_unknown_pjrt_device_error():
    r = subprocess.run([sys.executable, "-c", "import torch_xla_core as t; t.device()"],
                       env={"PJRT_DEVICE": "FPGA", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert r.returncode != 0 and "FPGA" in r.stderr and "CPU, CUDA, TPU" in r.stderr


def test_tensor_constructor_on_device(dev):
    t = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev)
    assert t.device.type == "xla" and t.cpu().tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert torch.arange(5, device=dev).cpu().tolist() == list(range(5))
    assert torch.full((2,), 7, device=dev).dtype == torch.int64


def test_matmul_precision_follows_torch(dev):
    """Float32 products lower with torch's float32 matmul precision (eager
    PyTorch's full fp32 by default; TF32 on GPUs only when asked), and the
    setting is part of the compile-cache key."""
    a, b = torch.randn(8, 8), torch.randn(8, 8)

    def hlo_and_compiles():
        y = a.to(dev) @ b.to(dev)
        before = txc.metrics.counters().get("cache_miss", 0)
        text = txc.debug.stablehlo(y)
        exact = torch.get_float32_matmul_precision() == "highest"   # else TF32 on GPUs
        torch.testing.assert_close(y.cpu(), a @ b, **({} if exact else dict(atol=2e-2, rtol=2e-2)))
        return text, txc.metrics.counters().get("cache_miss", 0) - before

    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        text, _ = hlo_and_compiles()
        assert "precision HIGHEST" in text
        _, compiles = hlo_and_compiles()
        assert compiles == 0
        torch.set_float32_matmul_precision("high")
        text, compiles = hlo_and_compiles()
        assert "precision HIGH>" in text and compiles == 1
    finally:
        torch.set_float32_matmul_precision(prev)
    y = a.to(dev).bfloat16() @ b.to(dev).bfloat16()     # not float32: the default
    assert "precision DEFAULT" in txc.debug.stablehlo(y)


    assert "precision DEFAULT" in txc.debug.stablehlo(y)


def test_scalar_buffers_keep_signed_zero_and_nan_payloads(dev):
    # Python numbers are graph parameters whose device buffers are cached:
    # equal-comparing numbers with other bits must not share one.
    x = torch.ones(3, device=dev)
    assert not torch.signbit((x * 0.0).cpu()).any()
    assert torch.signbit((x * -0.0).cpu()).all()
    assert not torch.signbit((x * 0.0).cpu()).any()
    assert torch.signbit(torch.where(x > 0, -0.0, x).cpu()).all()
    # NaNs with different payloads (float64 x * NaN keeps the NaN's payload)
    import struct
    nan1, nan2 = (struct.unpack("<d", struct.pack("<Q", b))[0] for b in (0x7FF8000000000001, 0x7FF8000000000002))
    y = torch.ones(2, dtype=torch.float64, device=dev)
    bits = [(y * n).cpu().view(torch.int64).tolist() for n in (nan1, nan2, nan1)][:2]
    assert bits == [[0x7FF8000000000001] * 2, [0x7FF8000000000002] * 2]


def test_scalar_wraps_into_narrow_integer_dtypes_like_torch(dev):
    x = torch.tensor([0, 1, 250], dtype=torch.uint8)
    for fn in (lambda t: t + -1, lambda t: t * 300, lambda t: t - 7):
        assert torch.equal(fn(x.to(dev)).cpu(), fn(x))


@pytest.mark.parametrize("make", [
    lambda: torch.arange(12.).reshape(3, 4),                          # contiguous: copied once, privately
    lambda: torch.arange(12.).reshape(3, 4).t(),                      # non-contiguous: contiguous() copies
    lambda: torch.arange(20.)[4:16].reshape(3, 4),                    # a view with an offset
    lambda: torch.arange(12).reshape(3, 4),                           # int64 (x64 transfer)
    lambda: torch.arange(12.).reshape(3, 4).bfloat16(),
    lambda: (torch.arange(6.) + 1j).reshape(2, 3).conj(),             # a lazily conjugated view
], ids=["contiguous", "transposed", "offset_view", "int64", "bf16", "conj"])
def test_transfer_is_a_copy(dev, make):
    """The CPU device shares torch-owned host memory instead of copying it; the transfer hands it a private
    copy, so writes to the source after .to() never reach the device tensor."""
    src = make()
    want = src.clone().resolve_conj()
    x = src.to(dev)
    (src.real if src.is_complex() else src).fill_(7)
    torch.testing.assert_close(x.cpu(), want)
