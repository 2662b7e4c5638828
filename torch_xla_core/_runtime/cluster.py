"""Which launcher started this process, and so where the job's processes
meet: detect() reads the environment each launcher sets, coordinator()
says where jax's coordination service is (process 0 hosts it there).

- torch_xla_core.launch, torchrun (torch.distributed.run) and a Kubeflow
  PyTorchJob: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun adds
  LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE, TORCHELASTIC_*; a
  PyTorchJob sets none of those: one process per pod). One rendezvous:
  torch's TCPStore at MASTER_ADDR:MASTER_PORT (torchrun's agent hosts it;
  in a PyTorchJob process 0 does, and torch's own init_process_group then
  joins it as a client: TORCHELASTIC_USE_AGENT_STORE). Process 0 picks a
  free port and publishes the coordinator's address there; the others read
  it. The coordinator binds 127.0.0.1 when the job is on one machine
  (LOCAL_WORLD_SIZE == WORLD_SIZE), else MASTER_ADDR, the address of
  process 0's machine (SECURITY.md). torch_xla_core.launch hosts the
  service itself and says where (TXC_COORDINATOR).
- SLURM (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the step's node
  list and job id: the first node hosts the coordinator on port
  SLURM_JOB_ID % 4096 + 61440 (jax's convention; JAX_COORDINATOR_PORT
  overrides), 127.0.0.1 when the step has one node.
- By hand: TXC_NUM_PROCESSES, TXC_PROCESS_ID, TXC_COORDINATOR, TXC_LOCAL_RANK.
A job of one process joins nothing.

A job torchrun restarts (--max-restarts) meets again in the same store:
torch's agent keeps one TCPStore for every round (torch 2.14's static and
c10d rendezvous), so a key written in the last round is still there. Every
key this module writes is per round (TORCHELASTIC_RESTART_COUNT), and
isolate_restarts() does the same for init_process_group's store: without it a
restarted process could read the last round's gloo address of another and
fail with 'Gloo connectFullMesh failed ... Connection refused' once gloo's
connect timeout ran out (torch up to 2.4 prefixed the store per attempt)."""
import dataclasses
import importlib
import ipaddress
import os
import socket
import time
from datetime import timedelta

import torch.distributed as dist
from jax._src.clusters.slurm_cluster import SlurmCluster

from .. import config

_KEY = "torch_xla_core/jax_coordinator"
_store = None  # a PyTorchJob's TCPStore hosted by process 0 (kept alive for the job's life)
_reserved = None  # process 0's socket holding the coordinator's port until its service listens (release())


class LaunchError(RuntimeError):
    """The environment names a multi-process job but not all of it."""


@dataclasses.dataclass(frozen=True)
class Job:
    launcher: str             # "txc" (TXC_* by hand), "torchrun", "pytorchjob" or "slurm"
    num_processes: int
    process_id: int
    local_rank: int
    spans_machines: bool      # False: every listener binds loopback
    coordinator: str | None   # host:port known from the environment; None: through torch's store
    master: tuple = ()        # (MASTER_ADDR, MASTER_PORT) of torch's store
    local_size: int = 1       # processes on this machine (several: each takes GPU local_rank, as torchrun's)


def _int(name, launcher):
    raw = config.get(name)
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise LaunchError(f"{name}={raw!r} is not an integer; {launcher} sets it to one (torch_xla_core reads it "
                          f"to join the job's processes)") from None


def detect():
    """The Job this process belongs to, or None when it runs alone."""
    has = config.is_set  # the launchers' variables count as set when empty (config.py)
    if config.get("TXC_NUM_PROCESSES") > 1:
        why = f"TXC_NUM_PROCESSES={config.get('TXC_NUM_PROCESSES')}"
        coord = config.require("TXC_COORDINATOR", why=why)
        return Job("txc", config.get("TXC_NUM_PROCESSES"), config.require("TXC_PROCESS_ID", why=why),
                   config.get("TXC_LOCAL_RANK"), not is_loopback(coord.rpartition(":")[0]), coord)  # devices: as set
    if has("WORLD_SIZE") and has("RANK"):
        elastic = has("TORCHELASTIC_RUN_ID") or has("LOCAL_RANK")
        who = "torchrun" if elastic else "pytorchjob"
        n, rank = _int("WORLD_SIZE", who), _int("RANK", who)
        if n <= 1:
            return None
        missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not config.get(v)]
        if missing:
            raise LaunchError(f"RANK and WORLD_SIZE={n} are set but {' and '.join(missing)} not: torch_xla_core "
                              f"meets the other processes through torch's store at MASTER_ADDR:MASTER_PORT (as "
                              f"init_process_group('env://') does); set them, or start with torchrun")
        local = _int("LOCAL_RANK", who) if has("LOCAL_RANK") else 0
        local_size = _int("LOCAL_WORLD_SIZE", who) if has("LOCAL_WORLD_SIZE") else 1
        master = (config.get("MASTER_ADDR"), _int("MASTER_PORT", who))
        return Job(who, n, rank, local, local_size < n and not is_loopback(master[0]),
                   config.get("TXC_COORDINATOR"), master, local_size)
    if has("SLURM_NTASKS") and has("SLURM_PROCID"):
        n = _int("SLURM_NTASKS", "srun")
        if n <= 1:
            return None
        if not SlurmCluster.is_env_present():
            raise LaunchError("SLURM_NTASKS and SLURM_PROCID are set but not SLURM_JOB_ID, SLURM_STEP_NODELIST and "
                              "SLURM_LOCALID: start the processes with srun (inside an allocation)")
        nodes = _int("SLURM_STEP_NUM_NODES", "srun") if has("SLURM_STEP_NUM_NODES") else 1
        coord = SlurmCluster.get_coordinator_address(None, config.get("JAX_COORDINATOR_PORT"))
        if nodes <= 1:
            coord = "127.0.0.1:" + coord.rpartition(":")[2]
        return Job("slurm", n, _int("SLURM_PROCID", "srun"), _int("SLURM_LOCALID", "srun"),
                   nodes > 1, coord, (), -(-n // nodes))
    return None


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def coordinator(job: Job, timeout: float) -> str:
    """host:port of jax's coordination service for this job: from the
    environment, or through torch's store (process 0 publishes it, and holds
    its port until the caller's release(), once the service listens)."""
    if job.coordinator is not None:
        return job.coordinator
    store = _connect(job, timeout)
    if job.process_id == 0:
        global _reserved
        host = job.master[0] if job.spans_machines else "127.0.0.1"
        release()
        _reserved = reserve_port(host)  # held until the service listens on it: the caller's release()
        addr = _hostport(host, _reserved.getsockname()[1])
        store.set(_key(), addr)
        return addr
    # the key is this round's; an address nothing listens on yet is read again (process 0 may not have
    # started its service)
    deadline = time.monotonic() + timeout
    while True:
        addr = store.get(_key()).decode()
        if _listening(addr):
            return addr
        if time.monotonic() > deadline:
            raise LaunchError(f"process 0 published jax's coordinator at {addr} through torch's store at "
                              f"{job.master[0]}:{job.master[1]}, but nothing listens there after {timeout:g} s "
                              f"(TXC_DISTRIBUTED_TIMEOUT): process 0 did not start it")
        time.sleep(0.05)


def reserve_port(host: str = "127.0.0.1") -> socket.socket:
    """A socket bound to a free port of `host`, with SO_REUSEPORT: a server
    that binds that port with SO_REUSEPORT too (gRPC does: jax's coordination
    service) can listen on it while this socket holds it, and no other
    process's bind can take it in between. Close it once the server listens."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        if hasattr(socket, "SO_REUSEPORT"):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((host.strip("[]"), 0))
    except BaseException:
        s.close()
        raise
    return s


def release() -> None:
    """Lets go of the port coordinator() held for process 0's service (once
    the service listens on it, or its start failed)."""
    global _reserved
    if _reserved is not None:
        _reserved.close()
        _reserved = None


def _restart() -> str | None:
    """This round's number when torchrun restarted the job (TORCHELASTIC_RESTART_COUNT > 0)."""
    n = config.get("TORCHELASTIC_RESTART_COUNT")
    return n if n not in (None, "", "0") else None


def _key() -> str:
    n = _restart()
    return _KEY if n is None else f"{_KEY}/round{n}"


def isolate_restarts() -> None:
    """Makes init_process_group's env:// store per round in a job torchrun
    restarted (see the module docstring): the keys a process group writes
    (gloo's addresses) go under 'torch_xla_core/round<N>/'. Installed at import
    (_install.py); a first round is left as torch makes it."""
    # the module (torch.distributed.rendezvous as an attribute is its function of that name)
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    env = handlers.get("env")
    if env is None or getattr(env, "_txc_rounds", False):
        return

    def per_round(url, *args, **kwargs):
        for store, rank, world in env(url, *args, **kwargs):
            n = _restart()
            if n is not None and config.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                store = dist.PrefixStore(f"torch_xla_core/round{n}", store)
            yield store, rank, world
    per_round._txc_rounds = True
    handlers["env"] = per_round


def _listening(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def _connect(job: Job, timeout: float):
    """torch's TCPStore at MASTER_ADDR:MASTER_PORT: a client of torchrun's
    agent's store; in a PyTorchJob process 0 hosts it (on the loopback
    address only when MASTER_ADDR is one) unless torch's own
    init_process_group already does."""
    global _store
    host, port = job.master
    t = timedelta(seconds=timeout)
    if job.launcher == "pytorchjob" and job.process_id == 0:
        if _store is None:
            try:
                fd = None
                if is_loopback(host):
                    s = socket.socket()
                    s.bind((host, port))
                    s.listen(128)
                    fd = s.detach()
                _store = dist.TCPStore(host, port, None, True, t, wait_for_workers=False, master_listen_fd=fd)
                os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # init_process_group joins it as a client
            except (OSError, RuntimeError):  # torch's init_process_group hosts it already: a client like the others
                pass
        if _store is not None:
            return _store
    try:
        return dist.TCPStore(host, port, None, False, t)
    except (OSError, RuntimeError) as e:
        raise LaunchError(f"could not reach torch's store at {host}:{port} (MASTER_ADDR:MASTER_PORT) within "
                          f"{timeout:g} s to meet the job's other processes ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:200]})") from None
