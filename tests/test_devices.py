"""Several real xla devices (xla:0 .. xla:3 on 4 CPU devices, in a child
process: tests/multidevice.py): transfers, ops, syncs and results stay on
their device; mixing devices raises torch's error; .to moves data; each
device compiles its own executable."""
import pytest
import torch

import torch_xla_core as txc
from torch_xla_core._tracing import tensor as _tensor
from torch_xla_core import executor, metrics, runtime
from multidevice import on_devices

pytestmark = pytest.mark.xdist_group("devices4")  # one child process per module

MISMATCH = "Expected all tensors to be on the same device, but found at least two devices"


def _dev(t) -> int:
    """The device index the tensor's buffer lies on (computing it first)."""
    return runtime.device_index(_tensor.materialize(t))


@on_devices(4)
def test_every_index_is_a_device():
    assert txc.device_count() == 4 and torch.xla.device_count() == 4
    assert [txc.device(i) for i in range(4)] == [torch.device("xla", i) for i in range(4)]
    with pytest.raises(RuntimeError, match="xla:4 is not a device: this process has 4 xla devices"):
        torch.ones(2, device="xla:4")
    with pytest.raises(RuntimeError, match="xla:9 is not a device"):
        torch.ones(2).to("xla:9")


@on_devices(4)
def test_ops_and_results_stay_on_their_device():
    a = torch.randn(5, 3)
    for i in range(4):
        x = a.to(f"xla:{i}")
        assert _dev(x) == i
        y = (torch.relu(x) * 2 + 1).sum(0)
        assert y.device == torch.device("xla", i)
        assert _dev(y) == i
        torch.testing.assert_close(y.cpu(), (torch.relu(a) * 2 + 1).sum(0))


@on_devices(4)
def test_factories_on_a_device():
    x = torch.ones(2, 3, device="xla:2")
    for t in (x, torch.zeros_like(x), torch.randn(4, device="xla:2"), torch.arange(3, device="xla:2"),
              torch.tensor([1.0, 2.0], device="xla:2"), x.new_full((2,), 7.0), torch.rand_like(x),
              torch.full((2,), 3.0, device="xla:2")):
        assert t.device == torch.device("xla", 2)
        assert _dev(t) == 2
    torch.testing.assert_close((x + torch.zeros_like(x)).cpu(), torch.ones(2, 3))


@on_devices(4)
def test_mixing_devices_raises_torch_error():
    a = torch.ones(3).to("xla:0")
    b = torch.ones(3).to("xla:1")
    with pytest.raises(RuntimeError, match=MISMATCH):
        a + b
    with pytest.raises(RuntimeError, match=MISMATCH):
        torch.ones(3, device="xla") * b       # a factory's "xla" is xla:0
    with pytest.raises(RuntimeError, match=MISMATCH):
        torch.matmul(torch.ones(2, 3, device="xla:3"), torch.ones(3, 2, device="xla:2"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)                     # cpu and xla, as before
    assert (b * 2 + 1).cpu().tolist() == [3.0, 3.0, 3.0]  # nothing left broken


@on_devices(4)
def test_to_and_copy_move_data_between_devices():
    a = torch.randn(4, 4)
    x0 = a.to("xla:0") * 3
    metrics.clear()
    x1 = x0.to("xla:1")
    assert x1.device == torch.device("xla", 1) and _dev(x1) == 1 and _dev(x0) == 0
    assert metrics.counters().get("transfer_between_devices") == 1
    torch.testing.assert_close((x1 + 1).cpu(), a * 3 + 1)
    dst = torch.zeros(4, 4, device="xla:3")
    dst.copy_(x1)
    assert _dev(dst) == 3
    torch.testing.assert_close(dst.cpu(), a * 3)


@on_devices(4)
def test_each_device_compiles_its_own_executable():
    executor.clear_cache()
    metrics.clear()
    a = torch.randn(6)

    def run(i):
        y = a.to(f"xla:{i}").exp().sum()
        key = txc.debug.cache_key([y])
        return y.item(), key

    r1, k1 = run(1)
    r2, k2 = run(2)
    assert (k1.device, k2.device) == (1, 2) and k1.graph == k2.graph
    assert metrics.counters()["compile"] == 2
    run(1)
    run(2)
    assert metrics.counters()["compile"] == 2  # cached per device
    assert r1 == pytest.approx(a.exp().sum().item()) and r1 == r2


@on_devices(4)
def test_one_sync_runs_every_device():
    xs = [torch.full((3,), float(i)).to(f"xla:{i}") * 2 for i in range(4)]
    txc.sync()
    assert all(x._lt.is_data for x in xs)
    assert [_dev(x) for x in xs] == [0, 1, 2, 3]
    assert [x.cpu().tolist() for x in xs] == [[2.0 * i] * 3 for i in range(4)]


@on_devices(4)
def test_training_step_on_xla_3_matches_cpu():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    model.load_state_dict(ref.state_dict())
    model.to("xla:3")
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    ropt = torch.optim.AdamW(ref.parameters(), lr=0.01)
    for _ in range(3):
        x, y = torch.randn(4, 8), torch.randn(4, 2)
        loss = torch.nn.functional.mse_loss(model(x.to("xla:3")), y.to("xla:3"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        txc.sync()
        rloss = torch.nn.functional.mse_loss(ref(x), y)
        rloss.backward()
        ropt.step()
        ropt.zero_grad()
        assert loss.item() == pytest.approx(rloss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device == torch.device("xla", 3) and _dev(p) == 3
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_a_factory_tensor_made_before_a_second_device_is_in_use_keeps_its_device():
    """torch.ones(2, device="xla") is empty + fill_; the fill's constant used to take the tensor off xla:0
    while one device was in use, so once xla:1 came into use `a + b` ran on xla:1 silently."""
    import os
    import subprocess
    import sys
    code = ("import torch, torch_xla_core\n"
            "a = torch.ones(2, device='xla'); z = torch.empty(2, device='xla'); z.zero_()\n"
            "b = torch.ones(2, device='xla:1')\n"
            "for x in (a, z):\n"
            "    try:\n"
            "        x + b\n"
            "    except RuntimeError as e:\n"
            "        print('raised' if 'same device' in str(e) else e)\n"
            "print((a + z).cpu().tolist())\n")
    env = {**os.environ, "TXC_NUM_CPU_DEVICES": "2", "PJRT_DEVICE": "CPU"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.stdout.split("\n")[:3] == ["raised", "raised", "[1.0, 1.0]"], out.stdout + out.stderr[-2000:]
