"""Two processes x 2 CPU devices through torch_xla_core.launch (jax's
distributed runtime on 127.0.0.1, gloo collectives): one global mesh, a
data-parallel AdamW step equal to CPU eager in every process; a process
that dies stops the others."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.xdist_group("processes2")  # the two launches one after the other

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "dp_train.py")


def _launch(out, *extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    return subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2",
                           SCRIPT, str(out), *extra], env=env, capture_output=True, text=True, timeout=300)


def _reference():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach() for p in model.parameters()]


def test_two_processes_data_parallel_match_cpu(tmp_path):
    r = _launch(tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    ref_losses, ref_params = _reference()
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (out["rank"], out["world"], out["local"], out["devices"]) == (rank, 2, rank, 4)
        assert out["shards"] == [[2, 16], [2, 16]]  # this process's two devices hold a quarter each
        assert out["losses"] == pytest.approx(ref_losses, rel=1e-5)
        for p, q in zip(out["params"], ref_params):
            torch.testing.assert_close(torch.tensor(p), q, rtol=1e-5, atol=1e-6)


def test_a_dead_process_stops_the_others(tmp_path):
    r = _launch(tmp_path, "die")  # process 1 exits with status 3 before joining
    assert r.returncode == 3
    assert "process 1 of 2 exited with status 3; told the others (PeerLostError)" in r.stderr
    assert not (tmp_path / "rank0.json").exists()


def test_torch_save_of_sharded_tensors_is_a_collective(tmp_path):
    """txc.save in every process writes one checkpoint (process 0) holding
    the whole values; torch.save in every process works; torch.save in one
    process alone raises an error naming the tensor instead of blocking."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    env["TXC_COLLECTIVE_TIMEOUT"] = "3"
    script = os.path.join(os.path.dirname(__file__), "scripts", "save_sharded.py")
    r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2", script,
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    ckpt = torch.load(tmp_path / "ckpt.pt", map_location="cpu")
    assert ckpt["step"] == 3
    torch.testing.assert_close(ckpt["w"], w)
    torch.testing.assert_close(ckpt["p"], w * 2)
    rank0 = json.loads((tmp_path / "save0.json").read_text())
    rank1 = json.loads((tmp_path / "save1.json").read_text())
    for out in (rank0, rank1):
        torch.testing.assert_close(torch.tensor(out["every"]), w)
    assert rank1["errors"] == []
    data_error, pending_error = rank0["errors"]
    assert "torch.save of a sharded xla tensor (a float32[8, 4] tensor sharded ('data', None))" in data_error
    assert "torch.save of a pending xla tensor float32[8, 4]" in pending_error
    for e in (data_error, pending_error):
        assert "every process must take it at the same point, but not all 2 processes did within 3 s" in e
        assert "torch_xla_core.save(obj, path)" in e


def test_flash_attention_per_shard_over_two_processes(tmp_path):
    """Data-parallel flash attention with segment ids, run per shard on a
    mesh spanning both processes: output and gradients equal CPU's in each."""
    from torch_xla_core.kernels import reference
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    script = os.path.join(os.path.dirname(__file__), "scripts", "flash_dp.py")
    r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2", script,
                        str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-4000:]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 2, 16, 8, generator=g).requires_grad_() for _ in range(3))
    seg = torch.randint(0, 3, (8, 16), generator=g).sort(1).values
    o = reference.flash_attention(q, k, v, causal=True, q_segment_ids=seg, kv_segment_ids=seg)
    (o * o * 2).sum().backward()
    for rank in (0, 1):
        out = json.loads((tmp_path / f"flash{rank}.json").read_text())
        assert out["shards"] == [[2, 2, 16, 8], [2, 2, 16, 8]]  # this process's two devices: a quarter each
        torch.testing.assert_close(torch.tensor(out["out"]), o.detach(), rtol=1e-5, atol=1e-5)
        for gr, t in zip(out["grads"], (q, k, v)):
            torch.testing.assert_close(torch.tensor(gr), t.grad, rtol=1e-4, atol=1e-4)
