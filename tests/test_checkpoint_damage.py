"""A damaged sharded checkpoint (torch_xla_core/_features/distributed_checkpoint.py):
dcp.load with SPMDLoadPlanner of a truncated, missing or unreadable file
raises DCP's CheckpointException naming the error, and leaves every value
of the state dict as it was (xla tensors sharded or not, CPU tensors,
Python values): the load is all or nothing."""
import os
import shutil

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import torch_xla_core.sharding as xs
from torch_xla_core._runtime.torch_compat import version_tuple
from torch_xla_core.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
from multidevice import on_devices


def _truncate(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])


@on_devices(4)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_damaged_checkpoint_loads_nothing(tmp_path):
    mesh = xs.Mesh(range(4), (4,), ("x",))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, 4, generator=g), torch.randn(16, generator=g)
    xa = a.to("xla")
    xs.mark_sharding(xa, mesh, ("x", None))
    saved = tmp_path / "saved"
    dcp.save({"a": xa, "b": b.to("xla"), "c": torch.arange(5.0), "n": {"k": 3}, "z": torch.ones(3).to("xla")},
             checkpoint_id=saved, planner=SPMDSavePlanner())
    (data_file,) = saved.glob("*.distcp")

    def fresh():
        la = torch.zeros(8, 4).to("xla")
        xs.mark_sharding(la, mesh, ("x", None))
        return {"a": la, "b": torch.full((16,), 7.0).to("xla"), "c": torch.zeros(5), "n": {"k": 0},
                "z": torch.zeros(3).to("xla")}

    def values(st):
        return (st["a"].cpu(), st["b"].cpu(), st["c"].clone(), dict(st["n"]), st["z"].cpu())
    before = values(fresh())
    damages = {  # the file holds one record per piece, read one after another: the last ones cut off
        "the data file's last record cut off": (lambda d: _truncate(d / data_file.name, lambda n: n - 100),
                                                "checkpoint file is corrupted"),
        "the data file cut in half": (lambda d: _truncate(d / data_file.name, lambda n: n // 2), "corrupted"),
        "the data file missing": (lambda d: os.unlink(d / data_file.name), "No such file or directory"),
        # torch 2.11's loader drops the reader's error and says only "metadata is None"; 2.13 adds the error
        # (2.12: either, both match "metadata is None")
        "the metadata truncated": (lambda d: _truncate(d / ".metadata", lambda n: n // 2),
                                   "truncated" if version_tuple(torch.__version__) >= (2, 13) else "metadata is None"),
    }
    for name, (damage, says) in damages.items():
        d = tmp_path / name.replace(" ", "_").replace("'", "")
        shutil.copytree(saved, d)
        damage(d)
        st = fresh()
        with pytest.raises(CheckpointException, match=says):
            dcp.load(st, checkpoint_id=d, planner=SPMDLoadPlanner())
        for got, want in zip(values(st), before):  # nothing of it loaded
            assert (got == want) if isinstance(want, dict) else torch.equal(got, want), name
    st = fresh()
    dcp.load(st, checkpoint_id=saved, planner=SPMDLoadPlanner())  # the intact checkpoint: everything
    assert torch.equal(st["a"].cpu(), a) and torch.equal(st["b"].cpu(), b)
    assert torch.equal(st["c"], torch.arange(5.0)) and st["n"] == {"k": 3} and torch.equal(st["z"].cpu(), torch.ones(3))
    assert xs.get_sharding(st["a"]).partition_spec == ("x", None)
