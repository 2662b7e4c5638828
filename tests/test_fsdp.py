"""FSDP2 (torch.distributed.fsdp.fully_shard) on xla tensors: in one
process, FSDP2's own ops against torch's CPU kernels, the device module's
streams and events, and the storage functions skipping xla tensors only;
in two processes (one launch, tests/scripts/fsdp_train.py), fully_shard
per layer and on the root trains equal to DDP over the "xla" backend and
to one process on the whole batch (CPU f32, <= 1e-6), with
reshard_after_forward True and False, one execution per step holding the
all-gathers and reduce-scatters, no CPU fallback; AdamW too; in four
processes (tests/scripts/hsdp_train.py), HSDP on a 2-D mesh equal to one
process; the unsharded parameters freed after use (tests/scripts/fsdp_memory.py:
the bytes held between steps, against the unsharded parameters kept and DDP)."""
import gc
import os
import weakref

import pytest
import torch

import torch_xla_core as txc  # (the xla device, the hooks)
from torch_xla_core import metrics
from torch_xla_core.distributed import _fsdp as fsdp
from launched_ranks import launched_ranks

pytestmark = pytest.mark.xdist_group("processes2")  # one multi-process launch at a time
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_train.py")
HSDP_SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "hsdp_train.py")
MEMORY_SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_memory.py")


def test_fsdp_ops_equal_torchs_cpu_kernels():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # noqa: F401  (defines torch.ops.fsdp)
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(5, 3, generator=g), torch.randn(4, generator=g), torch.randn(7, 2, generator=g)]
    for dim, tensors in ((0, ts), (1, [torch.randn(2, 5, generator=g), torch.randn(2, 3, 2, generator=g)])):
        want = torch._chunk_cat(tensors, dim, 2)
        out = torch.zeros(want.shape, device="xla")
        torch.ops.fsdp.chunk_cat([t.to("xla") for t in tensors], dim, 2, out=out)
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    if hasattr(torch.ops.fsdp, "chunk_cat_mixed_dtype"):  # torch 2.15: gradients of several dtypes, cast to out's
        mixed = [ts[0].to(torch.bfloat16), ts[1], ts[2].to(torch.bfloat16)]
        for dtype in (torch.float32, torch.bfloat16):
            want = torch.empty(torch._chunk_cat(ts, 0, 2).shape, dtype=dtype)
            torch.ops.fsdp.chunk_cat_mixed_dtype(mixed, 0, 2, out=want)  # torch's CPU kernel
            out = torch.zeros(want.shape, dtype=dtype, device="xla")
            torch.ops.fsdp.chunk_cat_mixed_dtype([t.to("xla") for t in mixed], 0, 2, out=out)
            torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    if hasattr(torch.ops.fsdp, "record_grad_output_stream"):  # torch 2.15: ordering a free; nothing to do here
        from torch.distributed.fsdp._fully_shard._fsdp_collectives import record_grad_output_stream
        before = metrics.counter_value("execute") or 0
        record_grad_output_stream(out, torch.xla.current_stream())
        assert (metrics.counter_value("execute") or 0) == before and not metrics.fallbacks()
    flat = [t.reshape(-1) for t in ts]
    sizes = [t.numel() for t in flat]
    buf_cpu, buf = torch.zeros(2 * sum(sizes)), torch.zeros(2 * sum(sizes), device="xla")
    part_cpu, _ = torch.ops.fsdp.all_gather_copy_in(flat, buf_cpu, sizes, sum(sizes), 1)
    part, out = torch.ops.fsdp.all_gather_copy_in([t.to("xla") for t in flat], buf, sizes, sum(sizes), 1)
    assert out is buf
    torch.testing.assert_close(buf.cpu(), buf_cpu, rtol=0, atol=0)
    torch.testing.assert_close(part.cpu(), part_cpu, rtol=0, atol=0)
    outs = [torch.zeros(s, device="xla") for s in sizes]
    torch.ops.fsdp.split_with_sizes_copy(part, sizes, out=outs)
    for o, t in zip(outs, flat):
        torch.testing.assert_close(o.cpu(), t, rtol=0, atol=0)


def test_streams_and_events_of_the_device_module():
    xla = torch.xla
    s = xla.Stream(priority=-1)
    e = xla.Event()
    assert e.record() is None and e.query() and s.query()
    s.wait_stream(xla.current_stream())
    s.wait_event(e)
    with xla.stream(s):
        x = torch.ones(3, device="xla") * 2
    e.synchronize()
    assert x.cpu().tolist() == [2.0] * 3
    assert len({s, xla.Stream()}) == 2  # hashable, as FSDP2 keys events by stream


def test_storage_functions_free_and_reallocate_xla_storages():
    """free_storage: the storage holds no value (no buffer, no sync computes
    it; a read raises naming FSDP2); alloc_storage: it holds one again, which
    a whole write replaces; alloc of a storage that was not freed changes
    nothing. CPU tensors get torch's own functions."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    assert _fsdp_param.free_storage.txc_on_xla and _fsdp_param_group.alloc_storage.txc_on_xla
    x = torch.ones(64, 64).to("xla")
    _fsdp_param.alloc_storage(x)  # not freed: unchanged
    txc.sync()
    buffer = weakref.ref(x._lt.data)
    _fsdp_param.free_storage(x)
    _fsdp_param.free_storage(x)  # twice: as once
    gc.collect()
    assert buffer() is None  # its device buffer is released
    executed = metrics.counter_value("execute") or 0
    txc.sync()
    assert (metrics.counter_value("execute") or 0) == executed  # nothing to compute for it
    with pytest.raises(RuntimeError, match="FSDP2 freed this unsharded parameter"):
        x.cpu()
    _fsdp_param_group.alloc_storage(x)
    with torch.no_grad():
        x.view(2, -1).copy_(torch.arange(4096.0).reshape(2, -1).to("xla"))  # FSDP2's copy-out: through a view
    assert torch.equal(x.cpu(), torch.arange(4096.0).reshape(64, 64))
    c = torch.ones(4)
    _fsdp_param.free_storage(c)
    assert c.untyped_storage().size() == 0  # torch's own, on a CPU tensor
    _fsdp_param.alloc_storage(c)
    assert c.untyped_storage().size() == 16
    fsdp.install()  # again: not wrapped twice
    assert not hasattr(_fsdp_param.free_storage.__wrapped__, "txc_on_xla")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launched_ranks(SCRIPT, 2, tmp_path_factory.mktemp("fsdp"))


def _whole_batch(opt_cls, **kw):
    """One process on the concatenated batches (CPU eager): params after each step."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt, g, out = opt_cls(net.parameters(), **kw), torch.Generator().manual_seed(2), []
    for _ in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        ((net(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        out.append([p.detach().clone() for p in net.parameters()])
    return out


def _close(got, want):
    for p, q in zip(got, want):
        torch.testing.assert_close(torch.tensor(p), q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("key", ["fsdp", "fsdp_keep"])
def test_fully_shard_trains_equal_to_ddp_and_one_process(ranks, key):
    want = _whole_batch(torch.optim.SGD, lr=0.1)
    for res in ranks:
        f = res[key]
        assert f["shard"] == [8, 8]  # Linear(8, 16).weight: 16 rows over 2 processes
        for step, params in enumerate(f["params"]):
            _close(params, want[step])
            _close(params, [torch.tensor(p) for p in res["ddp"][step]])
        assert f["executions"] == [1, 1, 1]  # forward, backward and step: one graph
        # per layer: an all-gather in forward (and again in backward when resharded), a reduce-scatter in backward;
        # but the first layer's backward needs no weight (its input needs no gradient) and the freed unsharded
        # parameter keeps nothing: that all-gather is computed by no graph
        assert f["collectives"] == {"all_gather": 3 if key == "fsdp" else 2, "reduce_scatter": 2, "all_reduce": 0}
        assert res["fallbacks"] == {}


def test_fully_shard_with_adamw(ranks):
    want = _whole_batch(torch.optim.AdamW, lr=0.01)[-1]
    for res in ranks:
        _close(res["fsdp_adam"], want)


def test_fully_shard_frees_the_unsharded_parameters_after_use(tmp_path):
    """Between steps each process holds the sharded state only: freeing the
    unsharded parameters releases exactly their bytes (what the process
    holds with the storage functions doing nothing, less what it holds with
    them), and FSDP2 then holds at least a whole model copy less than DDP
    (its replica and gradients). With a sync between forward and backward,
    it holds less too. All numbers from txc.memory.live_bytes()."""
    for res in launched_ranks(MEMORY_SCRIPT, 2, tmp_path):
        between, after_forward = res["between_steps"], res["after_forward"]
        assert between["kept"][-1] - between["freed"][-1] == res["unsharded"], res
        assert between["freed"][-1] + res["unsharded"] <= between["ddp"][-1], res
        assert after_forward["freed"][-1] < after_forward["kept"][-1], res


def test_hsdp_on_a_2d_mesh_trains_equal_to_one_process(tmp_path):
    """fully_shard on init_device_mesh("xla", (2, 2)): sharded over dim 1
    (all-gather, reduce-scatter over its sub-groups), replicated over dim 0
    (all-reduce of the reduced shards), each of 4 ranks on a quarter."""
    want = _whole_batch(torch.optim.SGD, lr=0.1)[-1]
    for res in launched_ranks(HSDP_SCRIPT, 4, tmp_path):
        assert res["shard"] == [8, 8]
        _close(res["params"], want)
        assert res["executions"] == [1, 1, 1]
        assert res["collectives"] == {"all_gather": 3, "reduce_scatter": 2, "all_reduce": 2}  # (as FSDP's: 3)
