"""Saves that survive being killed (issue 38): txc.save of a path
(serialization.atomic_write) and dcp.save through
distributed_checkpoint.AtomicFileSystemWriter commit by rename, so a process
SIGKILLed at any moment of a save leaves the path holding the previous
checkpoint or the new one, each loading bit-equal, never a broken one
(tests/scripts/kill_saves.py forks the saving processes and kills them); a
save that fails leaves the old checkpoint and no temporary file."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed.checkpoint as dcp

import torch_xla_core as txc
from torch_xla_core.distributed_checkpoint import AtomicFileSystemWriter, SPMDSavePlanner

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "kill_saves.py")
KILLS = 26


@pytest.mark.parametrize("mode", ["txc", "dcp"])
def test_a_save_killed_at_random_moments_loses_nothing(tmp_path, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, SCRIPT, mode, str(tmp_path / "d"), str(KILLS), str(tmp_path / "r.json")],
                       env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads((tmp_path / "r.json").read_text())
    kills = [k for k in out["kills"] if k["killed"]]
    # (most attempts kill: a delay past the save's end, whose length varies with the machine's load, does not;
    # 19 of 26 on a loaded 2-core host)
    assert len(kills) >= KILLS // 2, out
    assert all(k["result"] in ("old", "new") and k["bit_equal"] for k in out["kills"]), out  # nothing lost
    # killed mid-write: a temporary file or directory left, the old checkpoint at the path (a temporary left
    # with the new one there: killed after the commit, while removing the old directory it exchanged)
    mid_write = [k for k in kills if k["temp_left"] and k["result"] == "old"]
    # the delays are spread over the save: some kills mid-write, and some attempts outside the write (killed
    # before the temporary file or after the commit, or the save done first). Not all among the killed ones: the
    # span homes in on the write, and on a loaded host every kill may land in it (20 of 20 in one CI run)
    assert len(mid_write) >= 0.2 * len(kills), out
    outside = [k for k in out["kills"] if not (k["killed"] and k["temp_left"] and k["result"] == "old")]
    assert outside, out
    assert len(out["temps_at_end"]) <= 1  # each save removed what the killed one before it left


class _Boom:
    def __reduce__(self):
        raise RuntimeError("boom while pickling")


def test_a_failed_txc_save_leaves_the_old_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    old = {"w": torch.arange(6.0).to("xla")}
    txc.save(old, path)
    with pytest.raises(RuntimeError, match="boom while pickling"):
        txc.save({"w": torch.ones(3).to("xla"), "x": _Boom()}, path)
    assert os.listdir(tmp_path) == ["ckpt.pt"]
    assert torch.equal(torch.load(path, map_location="cpu")["w"], torch.arange(6.0))
    txc.save({"w": torch.ones(3).to("xla")}, str(path))  # a str path too; replaced whole
    assert torch.equal(torch.load(path, map_location="cpu")["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def _load(path):
    st = {"w": torch.empty(0)}
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    st["w"] = torch.empty(md["w"].size)
    dcp.load(st, checkpoint_id=path, planner=dcp.DefaultLoadPlanner())
    return st["w"]


class _FailingWriter(AtomicFileSystemWriter):
    def write_data(self, plan, planner):
        raise OSError(28, "No space left on device")


def test_the_dcp_writer_replaces_a_checkpoint_whole(tmp_path):
    path = tmp_path / "ckpt"
    dcp.save({"w": torch.arange(4.0).to("xla")}, storage_writer=AtomicFileSystemWriter(path),
             planner=SPMDSavePlanner())
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp"]
    (path / "stray").write_text("from before")  # a file of the old checkpoint: gone with it
    with pytest.raises(BaseException, match="No space left on device"):
        dcp.save({"w": torch.ones(2).to("xla")}, storage_writer=_FailingWriter(path), planner=SPMDSavePlanner())
    assert torch.equal(_load(path), torch.arange(4.0))
    dcp.save({"w": torch.ones(8).to("xla")}, storage_writer=AtomicFileSystemWriter(path), planner=SPMDSavePlanner())
    assert torch.equal(_load(path), torch.ones(8))
    assert os.listdir(tmp_path) == ["ckpt"]  # the failed save's temporary directory went with the next save
    assert sorted(os.listdir(path)) == [".metadata", "__0_0.distcp"]
    md = dcp.FileSystemReader(path).read_metadata()
    assert str(md.storage_meta.checkpoint_id) == str(path)  # the path, not the temporary name
