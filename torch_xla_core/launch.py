"""Starts a training script in several processes on this machine, joined by
jax's distributed runtime (coordinator on 127.0.0.1, CPU collectives
through gloo), each process owning its local devices, one global device
list for the sharding mesh:

    python -m torch_xla_core.launch --nproc 2 [--devices 2] train.py [args...]

Each process gets TXC_COORDINATOR, TXC_NUM_PROCESSES, TXC_PROCESS_ID (its
rank), TXC_LOCAL_RANK and, on CPU, TXC_NUM_CPU_DEVICES (--devices); the
runtime joins at its first device use (runtime._distributed). It also gets
torchrun's MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE, so torch.distributed.init_process_group("gloo") joins a
process group of the same processes (sharded checkpoints coordinate
through it: torch_xla_core/distributed_checkpoint.py). In the
script, txc.world_size(), txc.global_ordinal() and txc.local_ordinal() say
where it runs; xs.Mesh(range(world devices), ...) spans every process.

Listeners: jax's coordination service, hosted by the launcher (not by
process 0: a worker's death does not take it down), binds 127.0.0.1 only,
jax's gloo collectives 127.0.0.1, torch.distributed's store is hosted by
the launcher on 127.0.0.1 (workers join it as clients:
TORCHELASTIC_USE_AGENT_STORE), torch's gloo process group uses the
loopback interface (GLOO_SOCKET_IFNAME=lo). Nothing listens on another
interface (SECURITY.md; several machines: torch_xla_core/peers.py).

When a process fails, the launcher names it ("process 1 of 2 exited with
status 3") and tells the others at once (a pipe, TXC_LAUNCH_FD): a call of
theirs waiting on a value that needs the dead process raises
peers.PeerLostError naming it, so a script can save and exit. Those still
running TXC_COLLECTIVE_TIMEOUT s (default 60) later are stopped with a
message, before jax's heartbeat (TXC_DISTRIBUTED_TIMEOUT, set past that
bound here) would abort them; the launcher exits with the failed process's
status."""
import argparse
import inspect
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist
from jax._src import distributed
from jax._src.lib import _jax

from . import config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _store(timeout: float):
    """torch.distributed's TCPStore, hosted here on 127.0.0.1 (torch's own
    store in rank 0 would bind every interface): (store, port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=timeout), wait_for_workers=False,
                          master_listen_fd=s.detach())
    return store, port


def _coordination_service(nproc: int, heartbeat: int):
    """jax's coordination service, hosted here on 127.0.0.1 rather than in
    process 0 (peers.join): a worker that dies takes nothing down with it,
    so the others learn of it from this launcher and can raise, where jax's
    runtime in process 0's place would abort them all at once. (service,
    its address)."""
    address = f"127.0.0.1:{_free_port()}"
    if nproc == 1 or not _can_host():
        return None, address
    return _jax.get_distributed_runtime_service(address, nproc, heartbeat_timeout=heartbeat), address


def _can_host() -> bool:
    """Whether this jax's initialize starts process 0's service through
    jax._src.distributed._jax, which peers.join can hide (else process 0
    hosts it, as jax does, and its death aborts the others)."""
    try:
        src = inspect.getsource(distributed.State.initialize)
    except (OSError, TypeError, AttributeError):
        return False
    return hasattr(distributed, "_jax") and "_jax.get_distributed_runtime_service(" in src


def launch(script_argv, nproc: int, devices: int = 1, env=None, poll: float = 0.05) -> int:
    """Runs `python script_argv...` in nproc processes; returns the exit
    status (0 when all succeed, else the first failure's)."""
    if nproc < 1 or devices < 1:
        raise ValueError(f"launch: --nproc ({nproc}) and --devices ({devices}) must be at least 1")
    base = dict(os.environ if env is None else env)
    grace = config.get("TXC_COLLECTIVE_TIMEOUT", base)  # default: TXC_DISTRIBUTED_TIMEOUT, 60
    base.setdefault("TXC_DISTRIBUTED_TIMEOUT", str(int(2 * grace + 30)))  # jax's abort after our own end
    store, store_port = _store(max(grace, 300))
    service, coordinator = _coordination_service(nproc, int(config.get("TXC_DISTRIBUTED_TIMEOUT", base)))
    base.update(TXC_COORDINATOR=coordinator, TXC_COORDINATOR_HOSTED="0" if service is None else "1",
                TXC_NUM_PROCESSES=str(nproc),
                TXC_NUM_CPU_DEVICES=str(devices), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store_port),
                WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc), TORCHELASTIC_USE_AGENT_STORE="True",
                TXC_COLLECTIVE_TIMEOUT=f"{grace:g}")
    if os.path.exists("/sys/class/net/lo"):
        base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs, notices = [], []
    for rank in range(nproc):
        r, w = os.pipe()
        e = dict(base, TXC_PROCESS_ID=str(rank), TXC_LOCAL_RANK=str(rank), RANK=str(rank), LOCAL_RANK=str(rank),
                 TXC_LAUNCH_FD=str(r))
        procs.append(subprocess.Popen([sys.executable] + list(script_argv), env=e, pass_fds=(r,)))
        os.close(r)
        notices.append(w)
    running = dict(enumerate(procs))
    status, deadline, stopping = 0, None, False
    try:
        while running:
            for rank, p in list(running.items()):
                rc = p.poll()
                if rc is None:
                    continue
                del running[rank]
                if rc != 0 and status == 0:
                    status, deadline = rc, time.monotonic() + grace
                    print(f"torch_xla_core.launch: process {rank} of {nproc} exited with status {rc}; told the "
                          f"others (PeerLostError), stopping any still running in {grace:g} s "
                          f"(TXC_COLLECTIVE_TIMEOUT)",
                          file=sys.stderr, flush=True)
                    note = f"lost {rank} {rc} process {rank} of {nproc} exited with status {rc}\n".encode()
                    for other in running:
                        try:
                            os.write(notices[other], note)
                        except OSError:
                            pass
            if deadline is not None and running and time.monotonic() >= deadline:
                for rank, p in running.items():
                    if not stopping:
                        print(f"torch_xla_core.launch: process {rank} of {nproc} still runs {grace:g} s after "
                              f"its peer failed; stopping it", file=sys.stderr, flush=True)
                        p.terminate()
                    else:
                        p.kill()
                stopping, deadline = True, time.monotonic() + 5
            time.sleep(poll)
    finally:
        for p in running.values():
            p.kill()
            p.wait()
        for w in notices:
            os.close(w)
        if service is not None:
            service.shutdown()
        del store
    return status


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m torch_xla_core.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True, help="number of processes")
    ap.add_argument("--devices", type=int, default=1, help="CPU devices per process (TXC_NUM_CPU_DEVICES)")
    ap.add_argument("script", help="the training script")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    return launch([a.script] + a.args, a.nproc, a.devices)


if __name__ == "__main__":
    sys.exit(main())
