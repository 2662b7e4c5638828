"""Host-side meeting points of the processes, in torch_xla's names:
rendezvous(tag, payload) exchanges bytes, mesh_reduce(tag, data, fn)
reduces Python values, barrier() waits for all; spawn(fn, args, nprocs)
starts processes as xmp.spawn does. They go through jax's distributed
runtime's key-value store (the coordination service every process joined),
so none compiles or runs a graph and none syncs pending tensors (torch_xla's
rendezvous syncs and gathers on the device). With one process each is
immediate."""
import io
import multiprocessing
import os
import socket

import torch
import torch.multiprocessing as tmp
from jax._src import distributed

from .. import config
from .._runtime import cluster, peers, runtime

_count = {}  # tag -> how many rendezvous of that tag this process has made (each one's key)


def _client():
    return distributed.global_state.client


def _timeout_ms() -> int:
    return int(config.get("TXC_COLLECTIVE_TIMEOUT") * 1000)


def rendezvous(tag: str, payload: bytes = b"", replicas=()) -> list:
    """Waits until every process (or every rank in `replicas`) reaches the
    rendezvous named `tag`, and returns their payloads, position i holding
    rank i's (of the ranks taking part, in order). The n-th rendezvous of a
    tag in one process meets the n-th of the others."""
    n, rank = runtime.process_count(), runtime.process_index()
    ranks = sorted(replicas) if replicas else list(range(n))
    if rank not in ranks:
        raise ValueError(f"rendezvous({tag!r}): this process (rank {rank}) is not among replicas={list(replicas)}")
    if not isinstance(payload, (bytes, bytearray)):
        raise TypeError(f"rendezvous({tag!r}): payload must be bytes, got {type(payload).__name__}")
    if n == 1:
        return [bytes(payload)]
    seq = _count[tag] = _count.get(tag, 0) + 1
    base = f"txc_rendezvous/{tag}/{seq}"
    client, timeout = _client(), _timeout_ms()
    what = f"rendezvous {tag!r} (processes {ranks})"
    client.key_value_set_bytes(f"{base}/{rank}", bytes(payload))
    got = [peers.blocking(lambda r=r: client.blocking_key_value_get_bytes(f"{base}/{r}", timeout), what)
           for r in ranks]
    peers.blocking(lambda: client.wait_at_barrier(base, timeout, ranks if replicas else None), what)
    client.key_value_delete(f"{base}/{rank}")  # everyone has read it
    return got


def barrier(tag: str = "barrier") -> None:
    """Waits until every process reaches it (host only: pending tensors stay pending)."""
    rendezvous(tag)


def mesh_reduce(tag: str, data, reduce_fn):
    """reduce_fn(list of every process's `data`, rank order): `data` (any
    value torch.save takes; xla tensors are read to the CPU) is saved,
    exchanged through rendezvous(tag) and loaded with weights_only=True."""
    buf = io.BytesIO()
    torch.save(_to_cpu(data), buf)
    return reduce_fn([torch.load(io.BytesIO(b), weights_only=True) for b in rendezvous(tag, buf.getvalue())])


def _to_cpu(data):
    return torch.utils._pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, data)


def spawn(fn, args=(), nprocs=None, join=True, daemon=False, start_method="spawn"):
    """torch_xla's xmp.spawn: fn(rank, *args) in each of `nprocs` processes
    on this machine (None or 1: in this process), joined into one job (each
    its own devices; the TXC_* variables of a job started by hand, and
    torch.distributed's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE on
    127.0.0.1). Returns {rank: fn's value} (values must pickle); with
    join=False, torch.multiprocessing's context instead."""
    if nprocs is None or nprocs == 1:
        return {0: fn(0, *args)}
    if runtime.started():  # (a started runtime cannot join other processes)
        raise RuntimeError("spawn: this process has already started the xla runtime; call spawn before any "
                           "xla tensor is made (torch_xla's xmp.spawn has the same rule)")
    held = cluster.reserve_port()  # the coordinator's port, held while process 0 starts its service there
    try:
        env = {"TXC_NUM_PROCESSES": str(nprocs), "TXC_COORDINATOR": f"127.0.0.1:{held.getsockname()[1]}",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": str(nprocs),
               "LOCAL_WORLD_SIZE": str(nprocs)}
        results = multiprocessing.get_context(start_method).SimpleQueue()
        ctx = tmp.start_processes(_child, (fn, args, env, results), nprocs=nprocs, join=join, daemon=daemon,
                                  start_method=start_method)
    finally:
        held.close()
    if not join:
        return ctx
    out = {}
    while not results.empty():
        rank, value = results.get()
        out[rank] = value
    return out


def _child(rank, fn, args, env, results):
    os.environ.update(env)
    os.environ.update({"TXC_PROCESS_ID": str(rank), "TXC_LOCAL_RANK": str(rank), "RANK": str(rank),
                       "LOCAL_RANK": str(rank)})
    results.put((rank, fn(rank, *args)))


def _free_port() -> int:
    """A port free now (torch's TCPStore server in process 0 binds it without SO_REUSEPORT, so it cannot be held
    as the coordinator's is)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
