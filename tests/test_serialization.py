"""copy.deepcopy, torch.save and torch.load of xla tensors, Parameters,
modules and optimizer state, against the same operations on CPU tensors."""
import copy
import io
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

import torch_xla_core as txc
from torch_xla_core._tracing.tensor import XlaTensor

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
SHAPES = [(), (0,), (5,), (3, 4), (2, 0, 3)]


def _make(dtype, shape):
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, shape)
    return torch.randn(shape).to(dtype)


def _overwrite(t):
    """An in-place write that changes every element."""
    if t.dtype == torch.bool:
        t.logical_not_()
    else:
        t.add_(1)


def _same(x, c):
    """x (xla) holds what c (CPU) holds: values, dtype, shape, requires_grad."""
    assert type(x) is XlaTensor and x.device.type == "xla"
    assert x.dtype == c.dtype and x.shape == c.shape and x.requires_grad == c.requires_grad
    assert torch.equal(x.detach().cpu(), c.detach())


def _saved(obj, **save_kw):
    buf = io.BytesIO()
    torch.save(obj, buf, **save_kw)
    return buf.getvalue()


def _load(data, **kw):
    return torch.load(io.BytesIO(data), **kw)


# ---- deepcopy ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_deepcopy_values_and_independence(dev, dtype, shape):
    cpu = _make(dtype, shape)
    x = cpu.to(dev)
    txc.sync()
    before = txc.metrics.counters()
    y = copy.deepcopy(x)
    assert txc.metrics.counters() == before  # no transfer, no execution: the same device buffer
    _same(y, cpu)
    _overwrite(y)
    _same(x, cpu)  # the original did not see the copy's write
    _overwrite(x)
    expected = cpu.clone()
    _overwrite(expected)
    _same(y, expected)  # nor the copy the original's
    _same(x, expected)


def test_deepcopy_of_pending_value_runs_nothing(dev):
    a = torch.randn(4, 3)
    x = a.to(dev) * 2  # pending, not computed yet
    txc.sync()
    x = x + 1
    before = txc.metrics.counters()
    y = copy.deepcopy(x)
    assert txc.metrics.counters() == before
    x.mul_(0)
    torch.testing.assert_close(y.cpu(), a * 2 + 1)
    torch.testing.assert_close(x.cpu(), torch.zeros(4, 3))


def _views(base):
    return [base, base[1], base[:, 1:3].t(), base.diagonal(), base[::2, ::3], base[2:3].expand(3, 6)]


def test_deepcopy_views_share_their_copied_storage_like_cpu(dev):
    base_c = torch.arange(24.).reshape(4, 6)
    base_x = base_c.to(dev)
    orig_c, orig_x = _views(base_c), _views(base_x)
    cc, cx = copy.deepcopy(orig_c), copy.deepcopy(orig_x)
    cc[0].mul_(-1)
    cx[0].mul_(-1)
    for c, x, o in zip(cc, cx, orig_x):
        torch.testing.assert_close(x.cpu(), c)  # the copies' views follow the copied base
    torch.testing.assert_close(orig_x[0].cpu(), torch.arange(24.).reshape(4, 6))  # the original did not move
    torch.testing.assert_close(orig_x[2].cpu(), torch.arange(24.).reshape(4, 6)[:, 1:3].t())
    cx[1].fill_(7)  # a write through a copied view reaches the copied base, as on CPU
    cc[1].fill_(7)
    torch.testing.assert_close(cx[0].cpu(), cc[0])
    torch.testing.assert_close(base_x.cpu(), torch.arange(24.).reshape(4, 6))


def test_deepcopy_of_a_view_alone_is_independent(dev):
    base = torch.arange(12.).reshape(3, 4).to(dev)
    v = base[:, 1]
    w = copy.deepcopy(v)
    assert w.shape == (3,)
    w.fill_(-1)
    torch.testing.assert_close(base.cpu(), torch.arange(12.).reshape(3, 4))
    torch.testing.assert_close(v.cpu(), torch.tensor([1., 5., 9.]))


def test_deepcopy_memo_shares_a_tensor_seen_twice(dev):
    x = torch.randn(3).to(dev)
    a, b, c = copy.deepcopy([x, x, {"k": x}])
    assert a is b is c["k"] and a is not x


def test_deepcopy_requires_grad_grad_and_attributes_like_cpu(dev):
    c = torch.randn(3, requires_grad=True)
    (c * 3).sum().backward()
    c.note = ["ema"]
    x = c.detach().to(dev).requires_grad_()
    (x * 3).sum().backward()
    x.note = ["ema"]
    cc, cx = copy.deepcopy(c), copy.deepcopy(x)
    assert cx.requires_grad and cx.is_leaf and cx.grad_fn is None
    _same(cx.grad, cc.grad)
    assert cx.note == cc.note and cx.note is not x.note
    cx.grad.zero_()
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 3.))
    (cx * 2).sum().backward()  # the copy is a leaf of its own
    torch.testing.assert_close(cx.grad.cpu(), torch.full((3,), 2.))
    torch.testing.assert_close(x.grad.cpu(), torch.full((3,), 3.))


def test_deepcopy_parameter_like_cpu(dev):
    pc = torch.nn.Parameter(torch.randn(2, 3))
    pc.grad = torch.ones(2, 3)
    pc.tag = "w"
    px = torch.nn.Parameter(pc.detach().to(dev))
    px.grad = torch.ones(2, 3, device=dev)
    px.tag = "w"
    qc, qx = copy.deepcopy(pc), copy.deepcopy(px)
    assert isinstance(qx, torch.nn.Parameter) and isinstance(qc, torch.nn.Parameter)
    assert qx.requires_grad == qc.requires_grad is True
    # as torch.nn.Parameter.__deepcopy__ on CPU: neither .grad nor attributes
    assert (qx.grad is None) == (qc.grad is None) and hasattr(qx, "tag") == hasattr(qc, "tag")
    _same(qx, qc)
    frozen = torch.nn.Parameter(torch.randn(2).to(dev), requires_grad=False)
    assert copy.deepcopy(frozen).requires_grad is False


def test_deepcopy_non_leaf_raises_like_cpu(dev):
    c = torch.randn(2, requires_grad=True) * 2
    x = torch.randn(2, device=dev, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match="graph leaves") as ec:
        copy.deepcopy(c)
    with pytest.raises(RuntimeError, match="graph leaves") as ex:
        copy.deepcopy(x)
    assert str(ec.value) == str(ex.value)


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, i):
        return self.out(self.emb(i))


def test_deepcopy_module_with_tied_weights_for_ema(dev):
    torch.manual_seed(1)
    model = Tied().to(dev)
    assert model.out.weight is model.emb.weight  # Module.to keeps the tie (torch_xla_core/_features/tying.py)
    ema = copy.deepcopy(model)
    assert ema.out.weight is ema.emb.weight and ema.emb.weight is not model.emb.weight
    assert isinstance(ema.emb.weight, torch.nn.Parameter) and type(ema.emb.weight) is XlaTensor
    start = {k: v.cpu() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2, 3], device=dev)).sum().backward()
    opt.step()
    model.steps.add_(1)
    for k, v in ema.state_dict().items():  # untouched by the training step
        assert torch.equal(v.cpu(), start[k])
    with torch.no_grad():
        for pe, pm in zip(ema.parameters(), model.parameters()):
            pe.lerp_(pm, 0.5)
    torch.testing.assert_close(ema.emb.weight.cpu(), (start["emb.weight"] + model.emb.weight.cpu()) / 2)
    assert ema.out.weight is ema.emb.weight and ema.steps.item() == 0


def test_shallow_copy_shares_like_cpu(dev):
    for c in (torch.randn(3, requires_grad=True), torch.nn.Parameter(torch.randn(3))):
        x = c.detach().to(dev).requires_grad_()
        if isinstance(c, torch.nn.Parameter):
            x = torch.nn.Parameter(x.detach())
        c.tag = x.tag = ["t"]
        cc, cx = copy.copy(c), copy.copy(x)
        assert type(cx) is XlaTensor and isinstance(cx, torch.nn.Parameter) == isinstance(cc, torch.nn.Parameter)
        assert cx.requires_grad == cc.requires_grad and cx.is_leaf and cx.tag is x.tag
        with torch.no_grad():
            cx.fill_(2)
        torch.testing.assert_close(x.detach().cpu(), torch.full((3,), 2.))  # one storage, as on CPU


def test_deepcopy_optimizer_state_dict(dev):
    model = torch.nn.Linear(3, 2).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3, device=dev)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    snap = copy.deepcopy(sd)
    ref = {i: {k: v.cpu() for k, v in s.items()} for i, s in sd["state"].items()}
    for i, s in snap["state"].items():
        for k, v in s.items():
            assert type(v) is type(sd["state"][i][k]) and torch.equal(v.cpu(), ref[i][k])
    model(torch.randn(4, 3, device=dev)).sum().backward()
    opt.step()  # moves the live state, not the snapshot
    for i, s in snap["state"].items():
        assert torch.equal(s["exp_avg"].cpu(), ref[i]["exp_avg"])
        assert not torch.equal(opt.state_dict()["state"][i]["exp_avg"].cpu(), ref[i]["exp_avg"])


# ---- torch.save / torch.load ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_save_load_values(dev, dtype, shape):
    cpu = _make(dtype, shape).requires_grad_(dtype.is_floating_point)
    data = _saved(cpu.detach().to(dev).requires_grad_(cpu.requires_grad))
    for kw in ({}, {"weights_only": True}, {"map_location": "xla:0"}, {"map_location": torch.device("xla")}):
        _same(_load(data, **kw), cpu)
    on_cpu = _load(data, map_location="cpu", weights_only=True)
    assert type(on_cpu) is torch.Tensor and on_cpu.device.type == "cpu"
    assert on_cpu.dtype == dtype and on_cpu.requires_grad == cpu.requires_grad and torch.equal(on_cpu, cpu)


def test_save_pending_value_and_after_inplace_write(dev):
    a = torch.randn(3, 3)
    x = a.to(dev) * 2  # pending when saved
    first = _saved(x)
    x.add_(1)
    second = _saved([x, x])
    torch.testing.assert_close(_load(first).cpu(), a * 2)
    y, z = _load(second)
    assert y is z  # the same tensor twice is one object, as on CPU
    torch.testing.assert_close(y.cpu(), a * 2 + 1)


def test_views_saved_together_share_like_cpu(dev):
    base_c = torch.arange(24.).reshape(4, 6)
    views_c = _views(base_c)
    views_x = _views(base_c.to(dev))
    data_c, data_x = _saved(views_c), _saved(views_x)
    # what the checkpoint holds is what torch writes for the CPU tensors: storage, offsets, strides
    lc, lxc = _load(data_c), _load(data_x, map_location="cpu")
    for c, x in zip(lc, lxc):
        assert x.device.type == "cpu" and x.shape == c.shape and torch.equal(x, c)
        assert x.stride() == c.stride() and x.storage_offset() == c.storage_offset()
        assert x.untyped_storage().data_ptr() == lxc[0].untyped_storage().data_ptr()
    # loaded on the device, they still share: a write to the base reaches every view
    lx = _load(data_x)
    assert all(type(t) is XlaTensor for t in lx)
    lc[0].mul_(-1)
    lx[0].mul_(-1)
    lc[3].fill_(0.5)  # the diagonal, written through
    lx[3].fill_(0.5)
    for c, x in zip(lc, lx):
        torch.testing.assert_close(x.cpu(), c)


def test_view_saved_alone_keeps_its_values(dev):
    base = torch.arange(24.).reshape(4, 6).to(dev)
    views = _views(base)[1:]
    for i, v in enumerate(views):
        got = _load(_saved(v))
        torch.testing.assert_close(got.cpu(), v.cpu())
        if i < len(views) - 1:  # not the expanded one: CPU refuses writes to that too
            got.fill_(0)
    torch.testing.assert_close(base.cpu(), torch.arange(24.).reshape(4, 6))


def test_loaded_strided_layouts_are_views_of_one_upload(dev):
    # torch.load's set_(storage, offset, size, stride): every layout a CPU view
    # can have comes back as core views of the uploaded storage, or (a layout
    # no chain of reshape/slice/permute/expand gives) as a copy of its values.
    from torch_xla_core import serialization
    g = torch.Generator().manual_seed(3)
    n = 60
    flat = torch.arange(float(n))
    root = flat.reshape(6, 10).to(dev)._lt
    made, expected = [], []
    for _ in range(300):
        rank = int(torch.randint(0, 4, (), generator=g))
        size = [int(torch.randint(1, 5, (), generator=g)) for _ in range(rank)]
        stride = [int(torch.randint(0, 13, (), generator=g)) for _ in range(rank)]
        extent = sum((k - 1) * s for k, s in zip(size, stride))
        if extent >= n:
            continue
        offset = int(torch.randint(0, n - extent, (), generator=g))
        lt = serialization._strided_view(root, n, offset, tuple(size), tuple(stride))
        if lt is not None:
            assert lt.storage_id == root.storage_id and lt.shape == tuple(size)
            made.append((txc._tensor.wrap(lt), (size, stride, offset)))
            expected.append(flat.as_strided(size, stride, offset))
    assert len(made) > 150
    got = torch.cat([x.reshape(-1) for x, _ in made]).cpu()  # one graph for all
    if not torch.equal(got, torch.cat([e.reshape(-1) for e in expected])):
        for (x, layout), e in zip(made, expected):
            assert torch.equal(x.cpu(), e), layout
    for size, stride, offset in [((6, 10), (10, 1), 0), ((10, 6), (1, 10), 0), ((3, 4), (10, 1), 21),
                                 ((6,), (11,), 0), ((2, 5), (20, 2), 1), ((3, 10), (0, 1), 30), ((), (), 7)]:
        assert serialization._strided_view(root, n, offset, size, stride) is not None, (size, stride, offset)


def test_parameter_and_its_attributes_survive_like_cpu(dev):
    pc = torch.nn.Parameter(torch.randn(2, 3))
    pc.tag = "w"
    frozen_c = torch.nn.Parameter(torch.randn(2), requires_grad=False)
    px = torch.nn.Parameter(pc.detach().to(dev))
    px.tag = "w"
    frozen_x = torch.nn.Parameter(frozen_c.detach().to(dev), requires_grad=False)
    lc = _load(_saved([pc, frozen_c]))
    for kw in ({}, {"map_location": "cpu"}):
        lx = _load(_saved([px, frozen_x]), **kw)
        for c, x in zip(lc, lx):
            assert isinstance(x, torch.nn.Parameter) and x.requires_grad == c.requires_grad
            assert torch.equal(x.detach().cpu(), c.detach())
        assert lx[0].tag == "w"
        if kw:
            assert type(lx[0]) is torch.nn.Parameter
        else:
            assert type(lx[0]) is XlaTensor


def _train_step(model, opt, x):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def test_model_and_optimizer_state_dicts_round_trip_exactly(dev):
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    x = torch.randn(5, 4, device=dev)
    _train_step(model, opt, x)
    before = txc.metrics.counters().get("execute", 0)
    data = _saved({"model": model.state_dict(), "opt": opt.state_dict()})
    assert txc.metrics.counters().get("execute", 0) == before + 1  # the pending step, computed in one graph
    ck = _load(data)  # weights_only=True, torch's default
    for k, v in model.state_dict().items():
        _same(ck["model"][k], v.cpu())
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            got = ck["opt"]["state"][i][k]
            assert got.device == v.device and torch.equal(got.cpu(), v.cpu())
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to(dev)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.01)
    model2.load_state_dict(ck["model"])
    opt2.load_state_dict(ck["opt"])
    _train_step(model, opt, x)
    _train_step(model2, opt2, x)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    on_cpu = _load(data, map_location="cpu")
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    cpu_model.load_state_dict(on_cpu["model"])
    assert all(p.device.type == "cpu" for p in on_cpu["model"].values())


def test_cpu_checkpoint_maps_onto_the_device(dev):
    cpu = {"w": torch.randn(3, 2), "n": torch.tensor(7), "p": torch.nn.Parameter(torch.randn(2))}
    data = _saved(cpu)
    for loc in ("xla:0", "xla", torch.device("xla", 0), {"cpu": "xla:0"}):
        got = _load(data, map_location=loc)
        for k, v in cpu.items():
            _same(got[k], v)
        assert isinstance(got["p"], torch.nn.Parameter)
    assert _load(data)["w"].device.type == "cpu"  # without map_location a CPU checkpoint stays on CPU


def test_map_location_to_a_missing_device_says_so(dev):
    data = _saved(torch.randn(2).to(dev))
    with pytest.raises(RuntimeError, match="xla device 99 .*map_location"):
        _load(data, map_location="xla:99")


def test_legacy_format(dev):
    # torch fills a legacy checkpoint's storages only after rebuilding its tensors
    base_c = torch.arange(24.).reshape(4, 6)
    data = _saved(_views(base_c.to(dev)), _use_new_zipfile_serialization=False)
    ref = _views(base_c)
    on_cpu = _load(data, map_location="cpu")
    for c, x in zip(ref, on_cpu):
        assert torch.equal(x, c) and x.stride() == c.stride() and x.storage_offset() == c.storage_offset()
    lx = _load(data)
    for c, x in zip(ref, lx):
        _same(x, c)
    lx[0].neg_()
    for c, x in zip(ref, lx):
        torch.testing.assert_close(x.cpu(), -c)


def test_pickle_round_trip_in_process(dev):
    x = torch.randn(3, 2).to(dev)
    y = pickle.loads(pickle.dumps([x, x[1]]))
    assert type(y[0]) is XlaTensor
    torch.testing.assert_close(y[0].cpu(), x.cpu())
    torch.testing.assert_close(y[1].cpu(), x[1].cpu())


def test_setting_an_xla_tensor_to_a_cpu_storage_is_refused(dev):
    x = torch.empty(0, device=dev)
    with pytest.raises(RuntimeError, match="storage on xla"):
        x.set_(torch.arange(3.).untyped_storage())


_NO_IMPORT = r"""
import io, json, sys, torch
data = open(sys.argv[1], "rb").read()
ck = torch.load(io.BytesIO(data), map_location="cpu")  # weights_only=True: torch's default
ref = torch.load(sys.argv[2])
out = {"imported": "torch_xla_core" in sys.modules}
out["types"] = sorted({type(v).__name__ for v in ck["model"].values()} | {type(ck["t"]).__name__, type(ck["p"]).__name__})
out["devices"] = sorted({str(v.device) for v in list(ck["model"].values()) + [ck["t"], ck["view"]]})
out["equal"] = all(torch.equal(ck["model"][k], ref["model"][k]) for k in ref["model"]) and torch.equal(ck["t"], ref["t"])
out["dtypes"] = [str(ck["t"].dtype), str(ck["i"].dtype), str(ck["b"].dtype)]
out["param"] = isinstance(ck["p"], torch.nn.Parameter) and ck["p"].requires_grad
out["shared"] = ck["view"].untyped_storage().data_ptr() == ck["t"].untyped_storage().data_ptr()
out["opt_step"] = float(ck["opt"]["state"][0]["step"])
try:
    torch.load(io.BytesIO(data))
    out["error"] = None
except RuntimeError as e:
    out["error"] = str(e)
out["imported_after"] = "torch_xla_core" in sys.modules
print(json.dumps(out))
"""


def test_load_to_cpu_in_a_process_without_torch_xla_core(dev, tmp_path):
    model = torch.nn.Linear(3, 2).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 3, device=dev)).sum().backward()
    opt.step()
    t = torch.randn(4, 4, dtype=torch.bfloat16)
    ck = {"model": model.state_dict(), "opt": opt.state_dict(), "t": t.to(dev),
          "i": torch.arange(3).to(dev), "b": torch.tensor([True, False]).to(dev),
          "p": torch.nn.Parameter(torch.randn(2).to(dev))}
    ck["view"] = ck["t"][1:, 2]
    (tmp_path / "xla.pt").write_bytes(_saved(ck))
    torch.save({"model": {k: v.cpu() for k, v in model.state_dict().items()}, "t": t}, tmp_path / "ref.pt")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, "-c", _NO_IMPORT, str(tmp_path / "xla.pt"), str(tmp_path / "ref.pt")],
                       capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["imported"] is False and out["imported_after"] is False
    assert out["types"] == ["Parameter", "Tensor"] and out["devices"] == ["cpu"]
    assert out["equal"] and out["param"] and out["shared"] and out["opt_step"] == 1.0
    assert out["dtypes"] == ["torch.bfloat16", "torch.int64", "torch.bool"]
    # without map_location torch says where the data were and how to map them
    assert "xla:0" in out["error"] and "restore data location" in out["error"]


# ---- damaged checkpoints ------------------------------------------------------------

def _rezipped(data, member_suffix, edit):
    """A torch.save zip checkpoint with one member's bytes edited."""
    import zipfile
    zin, out = zipfile.ZipFile(io.BytesIO(data)), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zout:
        for name in zin.namelist():
            b = zin.read(name)
            zout.writestr(name, edit(b) if name.endswith(member_suffix) else b)
    return out.getvalue()


def _replace_once(old, new):
    def edit(b):
        assert b.count(old) == 1, b
        return b.replace(old, new)
    return edit


@pytest.mark.parametrize("damage, error, match", [
    ("truncated to half", RuntimeError, "checkpoint file is corrupted"),
    ("truncated to 100 bytes", RuntimeError, "checkpoint file is corrupted"),
    ("empty", EOFError, None),
    ("storage record cut short", RuntimeError, "does not match expected size"),
    ("location not xla:N", RuntimeError, r"storage location 'xla:x', which is not 'xla' or 'xla:N': the file is "
                                         r"corrupt"),
    ("view past its storage", RuntimeError, r"a float32 tensor of the checkpoint \(size \[3\], stride \[1\], offset "
                                            r"11\) does not lie inside its storage of 12 elements"),
    ("negative stride", RuntimeError, r"stride \[-1\], offset 2\) does not lie inside its storage"),
    ("legacy format truncated", RuntimeError, "unexpected EOF"),
])
def test_a_damaged_checkpoint_raises_clearly_and_loses_nothing(dev, damage, error, match):
    """torch.load of a truncated or corrupt xla checkpoint raises an error
    that says so (torch's own for the container; ours, naming the tensor's
    layout or the location, for what our loader reads); the tensors and
    pending values this process already has are untouched, and the intact
    checkpoint still loads."""
    x = torch.arange(12.).to(dev)
    data = _saved({"x": x, "v": x[2:5]})
    damaged = {
        "truncated to half": lambda: data[:len(data) // 2],
        "truncated to 100 bytes": lambda: data[:100],
        "empty": lambda: b"",
        "storage record cut short": lambda: _rezipped(data, "data/0", lambda b: b[:20]),
        "location not xla:N": lambda: _rezipped(data, "data.pkl", _replace_once(b"xla:0", b"xla:x")),
        "view past its storage": lambda: _rezipped(data, "data.pkl",
                                                   _replace_once(b"K\x02K\x03\x85", b"K\x0bK\x03\x85")),
        "negative stride": lambda: _rezipped(data, "data.pkl", _replace_once(b"K\x03\x85q\x10K\x01\x85",
                                                                              b"K\x03\x85q\x10J\xff\xff\xff\xff\x85")),
        "legacy format truncated": lambda: _saved({"x": x}, _use_new_zipfile_serialization=False)[:-20],
    }[damage]()
    held = torch.randn(4, 3).to(dev)
    pending = held * 2 + 1  # not computed yet
    with pytest.raises(error, match=match):
        _load(damaged)
    torch.testing.assert_close(pending.cpu(), held.cpu() * 2 + 1)
    assert torch.equal(x.cpu(), torch.arange(12.))
    ok = _load(data)
    assert torch.equal(ok["v"].cpu(), torch.arange(2., 5.))
