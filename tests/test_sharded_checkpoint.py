"""Sharded checkpoints (torch_xla_core/_features/distributed_checkpoint.py): dcp.save
with SPMDSavePlanner and dcp.load with SPMDLoadPlanner of a sharded model
and its AdamW state, loaded back in the same layout and in other ones
(resharding), on 4 CPU devices in one process (a child process:
tests/multidevice.py) and on 2 processes x 2 devices through
torch_xla_core.launch; torch.save of sharded tensors gathers them."""
import io
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import torch_xla_core as txc
import torch_xla_core.sharding as xs
from torch_xla_core import metrics
from torch_xla_core.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
from multidevice import on_devices

pytestmark = pytest.mark.xdist_group("checkpoint")  # one child process, then the launch

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "dcp_ckpt.py")


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))


def _steps(model, opt, n, shard_batch=None):
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
        if shard_batch is not None:
            x, y = x.to("xla"), y.to("xla")
            shard_batch(x, y)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if shard_batch is not None:
            txc.sync()


def _sharded_model(mesh, specs, steps):
    """An MLP on xla with specs {param name: partition spec} and `steps` AdamW steps."""
    model = _mlp().to("xla")
    for name, spec in specs.items():
        xs.mark_sharding(model.get_parameter(name), mesh, spec)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def shard(x, y):
        xs.mark_sharding(x, mesh, (mesh.axis_names[0], None))
        xs.mark_sharding(y, mesh, (mesh.axis_names[0], None))
    _steps(model, opt, steps, shard)
    return model, opt


def _state(model, opt):
    return {"model": model.state_dict(), "optim": opt.state_dict()}


_SAVED = {"0.weight": ("model", None), "0.bias": ("model",), "2.weight": (None, "model")}


@on_devices(4)
def test_save_writes_each_piece_once_and_loads_back_in_the_same_layout(tmp_path):
    mesh = xs.Mesh(range(4), (2, 2), ("data", "model"))
    model, opt = _sharded_model(mesh, _SAVED, 2)
    ref = _mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    _steps(ref, ref_opt, 2)
    metrics.clear()
    dcp.save(_state(model, opt), checkpoint_id=tmp_path, planner=SPMDSavePlanner())
    md = dcp.FileSystemReader(tmp_path).read_metadata().state_dict_metadata
    # fc1.weight [32, 16] split over "model" (2): two chunks, each written once (replicas over "data" are not)
    assert sorted(tuple(c.offsets) for c in md["model.0.weight"].chunks) == [(0, 0), (16, 0)]
    assert [tuple(c.sizes) for c in md["model.0.weight"].chunks] == [(16, 16)] * 2
    assert [tuple(c.sizes) for c in md["model.2.bias"].chunks] == [(8,)]  # replicated: one chunk
    n_chunks = sum(len(m.chunks) for k, m in md.items() if hasattr(m, "chunks") and "step" not in k)
    assert metrics.counters()["checkpoint_write_piece"] == n_chunks

    model2, opt2 = _sharded_model(mesh, _SAVED, 1)  # other values, same layout
    before = [xs.local_shards(p) for p in model2.parameters()]
    params = list(model2.parameters())
    state = _state(model2, opt2)
    metrics.clear()
    dcp.load(state, checkpoint_id=tmp_path, planner=SPMDLoadPlanner())
    opt2.load_state_dict(state["optim"])
    # one read per distinct piece on the devices; nothing gathered onto one device
    assert metrics.counters()["checkpoint_read_piece"] == sum(
        len({tuple((s.start, s.stop) for s in sh.index) for sh in xs.local_shards(t)})
        for t in list(model2.parameters()) + [v for st in opt2.state.values() for k, v in st.items()
                                              if k != "step"])
    assert list(model2.parameters()) == params  # loaded in place
    for p, q, b in zip(model2.parameters(), ref.parameters(), before):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
        assert xs.local_shards(p) == b  # the same layout as before the load
    for p, q in zip(model2.parameters(), ref.parameters()):
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt2.state[p][k].cpu(), ref_opt.state[q][k], rtol=1e-5, atol=1e-7)
        assert float(opt2.state[p]["step"]) == 2.0  # was 1
    # training goes on from the checkpoint as it would have without one
    _steps(model2, opt2, 1, lambda x, y: None)
    _steps(ref, ref_opt, 1)
    for p, q in zip(model2.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["1d_reversed", "replicated", "one_device"])
@on_devices(4)
def test_load_reshards_into_another_mesh(tmp_path, layout):
    mesh = xs.Mesh(range(4), (2, 2), ("data", "model"))
    model, opt = _sharded_model(mesh, _SAVED, 2)
    dcp.save(_state(model, opt), checkpoint_id=tmp_path, planner=SPMDSavePlanner())
    saved = {k: v.cpu() for k, v in model.state_dict().items()}
    saved_avg = [opt.state[p]["exp_avg"].cpu() for p in model.parameters()]

    model2 = _mlp().to("xla")
    if layout == "1d_reversed":
        mesh2 = xs.Mesh([3, 2, 1, 0], (4,), ("x",))
        specs = {"0.weight": (None, "x"), "2.weight": ("x", None), "2.bias": ("x",)}
    elif layout == "replicated":
        mesh2 = xs.Mesh([1, 3], (2,), ("x",))  # a subset of the devices
        specs = {name: (None,) * p.dim() for name, p in model2.named_parameters()}
    else:
        mesh2, specs = None, {}
    for name, spec in specs.items():
        xs.mark_sharding(model2.get_parameter(name), mesh2, spec)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    _steps(model2, opt2, 1, lambda x, y: None)
    layouts = [xs.local_shards(p) for p in model2.parameters()]
    state = _state(model2, opt2)
    dcp.load(state, checkpoint_id=tmp_path, planner=SPMDLoadPlanner())
    opt2.load_state_dict(state["optim"])
    for (k, v), lay in zip(model2.state_dict().items(), layouts):
        assert torch.equal(v.cpu(), saved[k]), k
        assert xs.local_shards(v) == lay, k  # the layout it had, the values it was saved with
    for p, a in zip(model2.parameters(), saved_avg):
        assert torch.equal(opt2.state[p]["exp_avg"].cpu(), a)
    if layout == "1d_reversed":
        assert xs.get_sharding(model2[0].weight).partition_spec == (None, "x")
        assert [s.shape for s in xs.local_shards(model2[0].weight)] == [(32, 4)] * 4


@on_devices(4)
def test_load_refuses_a_wrong_shape_or_missing_entry(tmp_path, monkeypatch):
    mesh = xs.Mesh(range(4), (4,), ("x",))
    t = torch.randn(8, 4).to("xla")
    xs.mark_sharding(t, mesh, ("x", None))
    dcp.save({"t": t}, checkpoint_id=tmp_path, planner=SPMDSavePlanner())
    with pytest.raises(CheckpointException,
                       match=r"'t' was saved with shape \[8, 4\] but the tensor to load into has shape \[4, 8\]"):
        dcp.load({"t": torch.zeros(4, 8).to("xla")}, checkpoint_id=tmp_path, planner=SPMDLoadPlanner())
    with pytest.raises(CheckpointException, match=r"the checkpoint has no entry 'u'"):
        dcp.load({"u": torch.zeros(8, 4).to("xla")}, checkpoint_id=tmp_path, planner=SPMDLoadPlanner())
    import jax
    with monkeypatch.context() as m:  # one of several processes, without a torch.distributed process group
        m.setattr(jax, "process_count", lambda: 2)
        with pytest.raises(CheckpointException, match=r"one of 2 processes, but torch.distributed has no process "
                                                      r"group.*init_process_group\('gloo'\)"):
            dcp.save({"t": t}, checkpoint_id=tmp_path / "x", planner=SPMDSavePlanner())
    assert not (tmp_path / "x" / ".metadata").exists()
    # bfloat16, a plain (unsharded) xla tensor on another device and a 0-dim one round-trip
    b = torch.randn(4, 8).to(torch.bfloat16)
    tb, td, ts = b.to("xla"), torch.arange(6.0).to("xla:2"), torch.tensor(3.5).to("xla")
    xs.mark_sharding(tb, mesh, (None, "x"))
    xs.mark_sharding(ts, mesh, ())  # a 0-dim tensor replicated over the mesh
    dcp.save({"b": tb, "d": td, "s": ts}, checkpoint_id=tmp_path / "b", planner=SPMDSavePlanner())
    lb, ld = torch.zeros(4, 8, dtype=torch.bfloat16).to("xla"), torch.zeros(6).to("xla:2")
    ls = torch.zeros(()).to("xla")
    dcp.load({"b": lb, "d": ld, "s": ls}, checkpoint_id=tmp_path / "b", planner=SPMDLoadPlanner())
    assert ls.item() == 3.5
    assert torch.equal(lb.cpu(), b) and xs.get_sharding(lb) is None
    assert torch.equal(ld.cpu(), torch.arange(6.0)) and ld.device == torch.device("xla:2")


@on_devices(4)
def test_pending_state_is_computed_in_one_graph(tmp_path):
    mesh = xs.Mesh(range(4), (2, 2), ("data", "model"))
    model, opt = _sharded_model(mesh, _SAVED, 1)
    x = torch.randn(8, 16).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    model(x).sum().backward()
    opt.step()  # parameters and optimizer state pending
    metrics.clear()
    dcp.save(_state(model, opt), checkpoint_id=tmp_path, planner=SPMDSavePlanner())
    assert metrics.counters()["execute"] == 1  # one sync for the whole state dict, not one per tensor
    saved = {k: v.cpu() for k, v in model.state_dict().items()}
    model2 = _mlp().to("xla")
    for name, spec in _SAVED.items():
        xs.mark_sharding(model2.get_parameter(name), mesh, spec)
    with torch.no_grad():
        for p in model2.parameters():
            p.mul_(2)  # pending values to load into
    metrics.clear()
    dcp.load({"model": model2.state_dict()}, checkpoint_id=tmp_path, planner=SPMDLoadPlanner())
    assert metrics.counters()["execute"] == 1
    for k, v in model2.state_dict().items():
        assert torch.equal(v.cpu(), saved[k]), k


@on_devices(4)
def test_torch_save_of_sharded_tensors_gathers_them():
    mesh = xs.Mesh(range(4), (2, 2), ("data", "model"))
    model, _ = _sharded_model(mesh, _SAVED, 1)
    full = {k: v.cpu() for k, v in model.state_dict().items()}
    y = model[0].weight * 2  # a pending value of a sharded graph
    buf = io.BytesIO()
    torch.save({"sd": model.state_dict(), "y": y}, buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu", weights_only=True)
    for k, v in full.items():
        assert torch.equal(loaded["sd"][k], v), k
    assert torch.equal(loaded["y"], full["0.weight"] * 2)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)  # onto xla:0, on one device
    assert back["sd"]["0.weight"].device == torch.device("xla:0")
    assert xs.get_sharding(back["sd"]["0.weight"]) is None
    assert torch.equal(back["sd"]["0.weight"].cpu(), full["0.weight"])


def _reference(steps):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _steps(model, opt, steps)
    return model, opt


def test_two_processes_write_their_own_pieces_and_reshard_on_load(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2", SCRIPT,
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    outs = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in (0, 1)]
    md = dcp.FileSystemReader(tmp_path / "ckpt").read_metadata().state_dict_metadata
    n_chunks = sum(len(m.chunks) for k, m in md.items() if hasattr(m, "chunks") and "step" not in k)
    assert all(o["written"] > 0 for o in outs) and sum(o["written"] for o in outs) == n_chunks
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    for rank, o in enumerate(outs):
        assert o["model_equal"] and o["avg_equal"] and o["step"] == [2.0] * 4, o
        assert o["spec"] == [None, "x"]
        # the reversed 1-D mesh: this process's devices hold a quarter of the columns each
        assert o["local"] == [[2 * rank, [32, 4]], [2 * rank + 1, [32, 4]]]
    # the checkpoint read back on the CPU, without torch_xla_core's planners, equals CPU eager training
    ref, ref_opt = _reference(2)
    model = _mlp()
    avg = {i: {"exp_avg": torch.zeros_like(p)} for i, p in enumerate(model.parameters())}
    state = {"model": model.state_dict(), "optim": {"state": avg}}
    dcp.load(state, checkpoint_id=tmp_path / "ckpt", planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    for (k, v), q in zip(model.state_dict().items(), ref.parameters()):
        torch.testing.assert_close(v, q.detach(), rtol=1e-5, atol=1e-6, msg=k)
    for i, q in enumerate(ref.parameters()):
        torch.testing.assert_close(avg[i]["exp_avg"], ref_opt.state[q]["exp_avg"], rtol=1e-5, atol=1e-7)
    for rank in (0, 1):  # torch.save in each process: the whole tensors, gathered across the processes
        full = torch.load(tmp_path / f"full{rank}.pt", map_location="cpu", weights_only=True)
        for (k, v), q in zip(full.items(), ref.parameters()):
            torch.testing.assert_close(v, q.detach(), rtol=1e-5, atol=1e-6, msg=k)
