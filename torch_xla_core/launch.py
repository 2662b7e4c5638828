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

When a process fails, the launcher stops the others and exits with that
process's status (naming it), so nothing waits forever on a dead peer; the
distributed runtime's own heartbeat (TXC_DISTRIBUTED_TIMEOUT, 60 s) covers
peers lost without the launcher."""
import argparse
import os
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script_argv, nproc: int, devices: int = 1, env=None, poll: float = 0.2) -> int:
    """Runs `python script_argv...` in nproc processes; returns the exit
    status (0 when all succeed, else the first failure's)."""
    if nproc < 1 or devices < 1:
        raise ValueError(f"launch: --nproc ({nproc}) and --devices ({devices}) must be at least 1")
    base = dict(os.environ if env is None else env)
    base.update(TXC_COORDINATOR=f"127.0.0.1:{_free_port()}", TXC_NUM_PROCESSES=str(nproc),
                TXC_NUM_CPU_DEVICES=str(devices), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc))
    procs = []
    for rank in range(nproc):
        e = dict(base, TXC_PROCESS_ID=str(rank), TXC_LOCAL_RANK=str(rank), RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable] + list(script_argv), env=e))
    status = 0
    try:
        while procs:
            for rank, p in enumerate(list(procs)):
                rc = p.poll()
                if rc is None:
                    continue
                procs.remove(p)
                if rc != 0 and status == 0:
                    status = rc
                    print(f"torch_xla_core.launch: process {rank} of {nproc} exited with status {rc}; "
                          f"stopping the others", file=sys.stderr)
                    for q in procs:
                        q.terminate()
            time.sleep(poll)
    finally:
        for q in procs:
            q.kill()
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
