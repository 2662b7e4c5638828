"""Two processes x 2 CPU devices through torch_xla_core.launch (torchrun
underneath; jax's distributed runtime on 127.0.0.1, gloo collectives): one
global mesh, a data-parallel AdamW step equal to CPU eager in every
process; every socket the job listens on is loopback; a process that dies
is named, and the survivor's waiting call raises PeerLostError naming it
(mid-step, process 0 or 1). Plain torchrun, several "nodes", srun's and a
PyTorchJob's environments, restarts: tests/test_launchers.py."""
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
    assert "torch_xla_core.launch: process 1 of 2 exited with status 3" in r.stderr
    assert not (tmp_path / "rank0.json").exists()  # process 0 was stopped (torchrun's agent), not left waiting


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


def _listening(pids):
    """{pid: [(address, port)]}: the TCP sockets each process listens on,
    from /proc/net/tcp{,6} (state 0A) and the socket inodes of its fds."""
    import ipaddress
    inodes = {}
    for name, v6 in (("tcp", False), ("tcp6", True)):
        with open(f"/proc/net/{name}") as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A":
                    continue
                addr, port = cols[1].split(":")
                raw = bytes.fromhex(addr)
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # per 32-bit word, host order
                ip = ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)
                inodes[cols[9]] = (ip, int(port, 16))
    out = {}
    for pid in pids:
        socks = []
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                socks.append(inodes[link[8:-1]])
        out[pid] = socks
    return out


def _descendants(pid):
    kids = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [pid]
    while todo:
        q = todo.pop()
        out.append(q)
        todo.extend(kids.get(q, []))
    return out


def test_a_launched_job_listens_on_loopback_only(tmp_path):
    """Every socket the launcher and its processes listen on (jax's
    coordination service, gloo collectives, torch.distributed's store and
    gloo process group) is bound to a loopback address, never every
    interface (jax's default, and torch's store's, is [::] / 0.0.0.0)."""
    import ipaddress
    import time
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    script = os.path.join(os.path.dirname(__file__), "scripts", "listeners.py")
    p = subprocess.Popen([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", "2", script,
                          str(tmp_path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not all((tmp_path / f"ready{r}").exists() for r in (0, 1)):
            assert p.poll() is None, p.communicate()[1][-4000:]
            assert time.monotonic() - t0 < 120, "the job did not start"
            time.sleep(0.2)
        procs = _descendants(p.pid)
        socks = _listening(procs)
        with open(f"/proc/{procs[-1]}/environ", "rb") as f:  # a worker's environment
            wenv = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    finally:
        (tmp_path / "release").touch()
        out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-4000:]
    everything = [s for ss in socks.values() for s in ss]
    coordinator_port = int(wenv[b"TXC_COORDINATOR"].rsplit(b":", 1)[1])
    store_port = int(wenv[b"MASTER_PORT"])
    ports = {port for _, port in everything}
    assert coordinator_port in ports and store_port in ports, (socks, coordinator_port, store_port)
    assert store_port in {port for _, port in socks[p.pid]}  # the launcher hosts torch.distributed's store
    assert len(everything) >= 2 + 4, socks  # and each process listens for gloo (jax's and torch's)

    def loopback(ip):
        return ip.is_loopback or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None
                                  and ip.ipv4_mapped.is_loopback)
    assert [(str(ip), port) for ip, port in everything if not loopback(ip)] == []


@pytest.mark.parametrize("dead,devices", [(1, 2), (0, 2), (1, 1)])
def test_a_dead_peer_raises_in_the_waiting_call(tmp_path, dead, devices):
    """One process ends (os._exit(3)) while the other waits on a collective
    step: the survivor's .item() raises PeerLostError naming the dead one
    (the ring link between them closed) well within TXC_COLLECTIVE_TIMEOUT,
    it saves and exits by itself (status 5, through peers.exit: torchrun's
    SIGTERM, which follows, leaves it be), and the launcher exits with the
    dead one's status. Process 0 too: jax's coordination service lives in
    the launcher, so its death aborts no one. With one device a process,
    gloo's error comes out at the launch, not the wait: PeerLostError too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TXC_NUM_CPU") and k != "XLA_FLAGS"}
    env["TXC_COLLECTIVE_TIMEOUT"] = "20"
    script = os.path.join(os.path.dirname(__file__), "scripts", "dead_peer.py")
    r = subprocess.run([sys.executable, "-m", "torch_xla_core.launch", "--nproc", "2", "--devices", str(devices),
                        script, str(tmp_path), str(dead)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr[-4000:]
    assert f"torch_xla_core.launch: process {dead} of 2 exited with status 3" in r.stderr
    assert "ends now (os._exit) with status 5" in r.stderr  # the survivor ended by itself
    assert "Terminating process" not in r.stderr  # no abort of jax's coordination client
    out = json.loads((tmp_path / "survivor.json").read_text())
    assert (out["type"], out["peer"], out["status"]) == ("PeerLostError", dead, None)  # its status: unknown yet
    assert f"process {dead} of 2 died (its link to process {1 - dead} closed without a goodbye" in out["error"]
    assert out["waited"] < 20  # TXC_COLLECTIVE_TIMEOUT
    assert out["losses"] == [pytest.approx(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).sum()
                                           .item() * 2, rel=1e-5)]


def test_the_launcher_names_the_dead_process_not_the_survivor(tmp_path):
    """torchrun orders failures by a timestamp in whole seconds: a survivor
    that ended for a lost peer (its error file marked by peers) in the same
    second, or seemingly earlier, is not the failure the launcher names."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from torch_xla_core import peers
    marked = tmp_path / "error.json"
    marked.write_text(json.dumps({"message": {"message": "PeerLostError: process 1 of 2 died",
                                              "extraInfo": {"py_callstack": "", "timestamp": "100"}},
                                  peers.LOST_PEER_KEY: 1}))
    survivor = ProcessFailure(local_rank=0, pid=10, exitcode=5, error_file=str(marked))
    dead = ProcessFailure(local_rank=1, pid=11, exitcode=3, error_file=str(tmp_path / "none.json"))
    assert survivor.timestamp < dead.timestamp  # torchrun's own pick would be the survivor
    assert peers.root_failure({0: survivor, 1: dead}) == (1, dead)
    assert peers.root_failure({0: survivor}) == (0, survivor)  # only consequences: the earliest
