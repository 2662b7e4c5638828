"""txc.data.DeviceLoader: order and values, pytree batches, non-tensor
leaves, len and re-iteration, exceptions from the wrapped loader, and no
thread left behind when the consumer stops early."""
import collections
import gc
import threading

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import torch_xla_core as txc


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "txc-device-loader"]


def test_order_values_len_and_reiteration():
    xs, ys = torch.randn(20, 3), torch.arange(20)
    dl = DataLoader(TensorDataset(xs, ys), batch_size=4)
    loader = txc.data.DeviceLoader(dl, prefetch=2)
    assert len(loader) == 5
    for _ in range(2):  # two epochs
        got = []
        for x, y in loader:
            assert x.device.type == "xla" and y.device.type == "xla"
            got.append((x.cpu(), y.cpu()))
        assert len(got) == 5
        torch.testing.assert_close(torch.cat([g[0] for g in got]), xs)
        assert torch.equal(torch.cat([g[1] for g in got]), ys)
    assert not _loader_threads()


Pair = collections.namedtuple("Pair", "a b")


def test_pytree_batches_and_non_tensor_leaves():
    batches = [{"x": torch.full((2,), float(i)), "meta": {"id": i, "name": f"b{i}"},
                "pair": Pair(torch.tensor([i]), [torch.ones(1) * i, "s"])} for i in range(3)]
    out = list(txc.data.DeviceLoader(batches, prefetch=1))
    assert len(out) == 3
    for i, b in enumerate(out):
        assert b["x"].device.type == "xla" and b["x"].cpu().tolist() == [float(i)] * 2
        assert b["meta"] == {"id": i, "name": f"b{i}"}
        assert isinstance(b["pair"], Pair) and b["pair"].a.device.type == "xla"
        assert b["pair"].b[0].cpu().item() == i and b["pair"].b[1] == "s"
    assert list(txc.data.DeviceLoader(["a", 3, None])) == ["a", 3, None]


def test_exception_in_loader_reaches_consumer():
    def gen():
        yield torch.ones(2)
        yield torch.ones(2) * 2
        raise ValueError("bad sample 2")

    got = []
    with pytest.raises(ValueError, match="bad sample 2"):
        for b in txc.data.DeviceLoader(gen(), prefetch=4):
            got.append(b.cpu())
    assert [g.tolist() for g in got] == [[1.0, 1.0], [2.0, 2.0]]
    assert not _loader_threads()


def test_early_break_stops_the_thread():
    def endless():
        i = 0
        while True:
            yield torch.tensor([i])
            i += 1

    loader = txc.data.DeviceLoader(endless(), prefetch=2)
    for b in loader:
        if b.item() == 3:
            break
    gc.collect()
    assert not _loader_threads()
    it = iter(txc.data.DeviceLoader(endless(), prefetch=2))
    assert next(it).item() == 0
    it.close()
    assert not _loader_threads()


def test_mark_step_per_batch_and_training_loop():
    """Each batch after the first syncs the previous step (as MpDeviceLoader):
    a loop of steps with no sync of its own matches CPU training."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 1)
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(ref.state_dict())
    model = model.to(txc.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ropt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(4)]
    before = txc.metrics.counters().get("execute", 0)
    for x, y in txc.data.DeviceLoader(data):
        torch.nn.functional.mse_loss(model(x), y).backward()
        txc.optimizer_step(opt)
        opt.zero_grad()
    for x, y in data:
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ropt.step()
        ropt.zero_grad()
    assert txc.metrics.counters().get("execute", 0) - before >= 4
    torch.testing.assert_close(model.weight.cpu(), ref.weight.detach(), atol=1e-5, rtol=1e-5)


def test_dataloader_with_workers():
    ds = TensorDataset(torch.arange(12.0).view(6, 2))
    dl = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="spawn")
    out = [b[0].cpu() for b in txc.data.DeviceLoader(dl)]
    torch.testing.assert_close(torch.cat(out), torch.arange(12.0).view(6, 2))


def test_bad_prefetch():
    with pytest.raises(ValueError, match="prefetch"):
        txc.data.DeviceLoader([], prefetch=0)
