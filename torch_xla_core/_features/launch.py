"""Starts a training script in several processes on this machine: a thin
front over torchrun (torch.distributed.run, run in this process: its agent
starts the workers, watches them, stops or restarts the group when one
fails), with everything bound to the loopback address:

    python -m torch_xla_core.launch --nproc 2 [--devices 2] [--max-restarts 1] train.py [args...]

is `torchrun --nproc-per-node 2 --max-restarts 1 train.py [args...]` (which
works as well, with no TXC_* variable: torch_xla_core/_runtime/cluster.py) plus:
- --devices N: TXC_NUM_CPU_DEVICES=N in every process (CPU devices each);
- torch.distributed's store (MASTER_ADDR:MASTER_PORT, which torchrun's
  agent would bind to every interface) is hosted here on 127.0.0.1 (the
  agent's store reuses it: multi-tenant), torch's gloo process group uses
  the loopback interface (GLOO_SOCKET_IFNAME=lo);
- without restarts, jax's coordination service is hosted here on
  127.0.0.1 (TXC_COORDINATOR, TXC_COORDINATOR_HOSTED) rather than in
  process 0, so that the death of process 0 aborts no other (peers.py);
  with restarts each round's process 0 hosts it (127.0.0.1 still) and
  publishes its address through the store, as under plain torchrun.
Nothing listens on another interface (SECURITY.md; several machines:
torchrun, srun, a PyTorchJob: _runtime/cluster.py). In the script,
txc.world_size(), txc.global_ordinal() and txc.local_ordinal() say where
it runs; xs.Mesh(range(world devices), ...) spans every process;
torch.distributed.init_process_group("gloo") joins the same processes.

When a process fails, the others' waiting calls raise peers.PeerLostError
naming it (peers.py), torchrun's agent stops the group (or restarts it,
--max-restarts), and this launcher names the first failure ("process 1 of 2
exited with status 3") and exits with its status."""
import argparse
import inspect
import os
import signal
import socket
import sys
from datetime import timedelta

import torch.distributed as dist
from jax._src import distributed
from jax._src.lib import _jax
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from .. import config
from .._runtime import cluster, peers


def _store(timeout: float):
    """torch.distributed's TCPStore hosted here on 127.0.0.1, multi-tenant so
    that torchrun's agent, asked for a store at the same port in this
    process, uses this one (its own would bind every interface): (store, port)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=timeout), wait_for_workers=False,
                          master_listen_fd=s.detach(), multi_tenant=True)
    return store, port


def _coordination_service(nproc: int, heartbeat: int):
    """jax's coordination service, hosted here on 127.0.0.1 rather than in
    process 0 (peers.join): a worker that dies takes nothing down with it,
    so the others learn of it and can raise, where jax's runtime in process
    0's place would abort them all at once. (service, its address), or
    (None, None) where this jax cannot (process 0 then hosts it)."""
    if nproc == 1 or not _can_host():
        return None, None
    with cluster.reserve_port() as s:  # held until the service listens (a launch beside ours could take it)
        address = f"127.0.0.1:{s.getsockname()[1]}"
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


def launch(script_argv, nproc: int, devices: int = 1, max_restarts: int = 0) -> int:
    """Runs `python script_argv...` in nproc processes through torchrun;
    returns the exit status (0 when all succeed, else the first failure's:
    128 + N for a signal N)."""
    if nproc < 1 or devices < 1 or max_restarts < 0:
        raise ValueError(f"launch: --nproc ({nproc}) and --devices ({devices}) must be at least 1, --max-restarts "
                         f"({max_restarts}) at least 0")
    store, port = _store(max(config.get("TXC_DISTRIBUTED_TIMEOUT"), 300))
    service, coordinator = (None, None) if max_restarts else _coordination_service(
        nproc, int(config.get("TXC_DISTRIBUTED_TIMEOUT")))
    env = dict(TXC_NUM_CPU_DEVICES=str(devices), TXC_COORDINATOR_HOSTED="1" if service else "0")
    if coordinator:
        env["TXC_COORDINATOR"] = coordinator
    if os.path.exists("/sys/class/net/lo") and not config.is_set("GLOO_SOCKET_IFNAME"):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        with config.exported(env):  # torchrun's agent passes its environment on to the workers
            args = torchrun.parse_args(["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                                        "--master-port", str(port), "--max-restarts", str(max_restarts),
                                        "--monitor-interval", "0.05", *script_argv])
            torchrun.run(args)
        return 0
    except ChildFailedError as e:
        rank, failure = peers.root_failure(e.failures)
        status = failure.exitcode if failure.exitcode >= 0 else 128 - failure.exitcode
        how = (f"was killed by {signal.Signals(-failure.exitcode).name}" if failure.exitcode < 0
               else f"exited with status {status}")
        print(f"torch_xla_core.launch: process {rank} of {nproc} {how}", file=sys.stderr, flush=True)
        return status or 1
    finally:
        if service is not None:
            service.shutdown()
        del store


def main(argv=None) -> int:
    """`python -m torch_xla_core.launch`'s command line; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m torch_xla_core.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, required=True, help="number of processes")
    ap.add_argument("--devices", type=int, default=1, help="CPU devices per process (TXC_NUM_CPU_DEVICES)")
    ap.add_argument("--max-restarts", type=int, default=0, help="restarts of the group after a failure (torchrun's)")
    ap.add_argument("script", help="the training script")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    return launch([a.script] + a.args, a.nproc, a.devices, a.max_restarts)


if __name__ == "__main__":
    sys.exit(main())
