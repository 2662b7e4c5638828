"""The processes of a multi-process job: how this process joins jax's
distributed runtime (and so what listens where), and what it does when a
peer process dies. Which launcher started it and where process 0's
coordinator is: cluster.py.

What listens (see SECURITY.md):
- jax's coordination service (unauthenticated gRPC). Under
  torch_xla_core.launch the launcher hosts it on 127.0.0.1
  (TXC_COORDINATOR_HOSTED=1: process 0 starts none). Otherwise process 0
  runs it, bound to TXC_COORDINATOR_BIND when set (host:port; e.g.
  "[::]:1234" for every interface), else exactly the coordinator's address
  (_cluster.coordinator: 127.0.0.1 for a job on one machine, else the
  address of process 0's machine) — never every interface unless the user
  says so (jax's own default is [::]).
- Every process listens for jax's CPU collectives (gloo, over TCP), and
  for its ring link (below), on TXC_GLOO_HOSTNAME when set, else 127.0.0.1
  when the coordinator is a loopback address, else this machine's host
  name, resolved (gloo's default).
- torch.distributed's store: torchrun's agent hosts it (torch_xla_core.launch
  binds it to 127.0.0.1); torch's gloo process group listens on the
  loopback interface under the launcher (GLOO_SOCKET_IFNAME=lo).

A dead peer. Once joined, the processes form a ring of TCP links (each
connects to the next): a process that dies (killed, crashed, an uncaught
exception) closes its links without saying goodbye, and its neighbours tell
the others along the ring at once. A call of this process waiting on the
device (a .cpu(), .item(), sync(wait=True), txc.wait_device_ops()) whose
value waits on a collective then raises PeerLostError naming the peer
(in milliseconds), also when the collective itself failed on the closed
connection, so that `try/except` around a step can save what is on the host
and exit. Under torchrun the agent then stops the group (SIGTERM, SIGKILL
30 s later; or restarts it): a SIGTERM that comes after a known loss is
left to the process's own exit, one that comes while a call waits turns
into PeerLostError there, any other ends the process as SIGTERM does.
jax's runtime cannot be told to raise instead: its coordination client
aborts the process (a C++ fatal error) once its heartbeat
(TXC_DISTRIBUTED_TIMEOUT) sees the dead peer, or at once when the service
itself is gone (hence the launcher hosts it; under plain torchrun process
0 does, and its death aborts the others); jaxlib 0.10's
missed_heartbeat_callback cannot be a Python function (the call fails with
std::bad_cast, itself an abort). A process that has lost a peer ends with
os._exit once its own exit handlers (registered after torch_xla_core's
join) have run: jax's exit handlers would wait for the dead peer (shutdown
barrier, the collective still blocked in gloo). Its exit status is 1
unless the script calls peers.exit(status)."""
import atexit
import json
import logging
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import warnings
from functools import partial

import jax
from jax._src import distributed, xla_bridge
from jax._src.lib import _jax

from . import cluster as _cluster
from .. import config

__all__ = ["PeerLostError", "lost", "wait", "blocking", "exit"]


class PeerLostError(RuntimeError):
    """A peer process of this job died while this process waited on a value
    that needs it. `peer` is its process index (None when unknown), `status`
    its exit status (None when unknown)."""

    def __init__(self, message, peer=None, status=None):
        super().__init__(message)
        self.peer, self.status = peer, status


_lost = None          # (message, peer, status) once a peer is known dead
LOST_PEER_KEY = "torch_xla_core_lost_peer"  # in torchelastic's error file of a process that ended for a lost peer
_watching = False     # a multi-process job: waits poll instead of blocking
_waiting = [0]        # calls now polling in wait()/blocking() (a SIGTERM there raises PeerLostError)
_exit_status = [1]
_ring = None          # _Ring once joined


def _split(address: str):
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise RuntimeError(f"TXC_COORDINATOR={address!r} is not host:port (e.g. 127.0.0.1:1234)")
    return host, port


def bind_addresses(coordinator: str):
    """(where process 0's coordination service listens, where gloo listens or
    None for its default) for this coordinator address and the environment."""
    host, _ = _split(coordinator)
    bind = config.get("TXC_COORDINATOR_BIND") or coordinator
    gloo = config.get("TXC_GLOO_HOSTNAME") or ("127.0.0.1" if _cluster.is_loopback(host) else None)
    return bind, gloo


def join(job, coordinator: str, timeout: int) -> None:
    """jax.distributed.initialize for this _cluster.Job with the listeners
    bound as the module docstring says, gloo CPU collectives, and the ring
    of links that tells of a dead peer."""
    num_processes, process_id = job.num_processes, job.process_id
    bind, gloo = bind_addresses(coordinator)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    hosted = config.get("TXC_COORDINATOR_HOSTED") and process_id == 0
    # several processes on a machine with GPUs: each takes the one of its local rank (torchrun's convention; jax's
    # srun detection does the same); CPU and TPU devices are the process's own
    gpu = [job.local_rank] if job.local_size > 1 and config.get("PJRT_DEVICE") not in ("CPU", "TPU") else None

    def initialize():
        if hosted:  # the launcher runs the coordination service: process 0 is a client like the others
            distributed._jax = _NoService(_jax)
        try:
            jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                                       initialization_timeout=timeout, heartbeat_timeout_seconds=timeout,
                                       coordinator_bind_address=bind, cluster_detection_method="deactivate",
                                       local_device_ids=gpu)
        finally:
            if hosted:
                distributed._jax = _jax
    _watch(job)
    blocking(initialize, f"joining jax's distributed runtime as process {process_id} of {num_processes}")
    if gloo is not None:
        try:
            coll = _jax.make_gloo_tcp_collectives(distributed_client=distributed.global_state.client,
                                                  hostname=gloo)
            xla_bridge.register_backend_factory("cpu", partial(xla_bridge.make_cpu_client, collectives=coll),
                                                priority=0, fail_quietly=False)
        except (RuntimeError, TypeError, AttributeError) as e:  # jax's CPU client started first, another jax
            warnings.warn(f"torch_xla_core: jax's CPU client could not be given gloo collectives bound to {gloo} "
                          f"({type(e).__name__}: {e}), so they listen where gloo's default puts them (this machine's "
                          f"host name, resolved). Start torch_xla_core before using jax, or set TXC_GLOO_HOSTNAME",
                          RuntimeWarning, stacklevel=3)
    global _ring
    host = gloo or socket.gethostbyname(socket.gethostname())
    _ring = blocking(lambda: _Ring(distributed.global_state.client, process_id, num_processes, host, timeout),
                     f"linking process {process_id} of {num_processes} to its neighbours")


class _NoService:
    """jaxlib as jax.distributed.initialize sees it, less the coordination
    service (process 0 starts one there; under the launcher the launcher
    hosts it, so that no worker's death takes it down)."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def get_distributed_runtime_service(self, *args, **kwargs):
        return None


def _watch(job):
    global _watching
    _watching = True
    atexit.register(_at_exit)  # after jax's handlers were registered: runs before them
    if job.launcher == "torchrun" and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def _on_sigterm(signum, frame):
    """torchrun's agent stops (or restarts) the group with SIGTERM when a
    worker failed. See the module docstring."""
    if _lost is not None:  # known already: the process is saving and exiting; the agent's SIGKILL bounds it
        return
    t0 = time.monotonic()
    while _lost is None and time.monotonic() - t0 < 0.5:  # a ring notice on its way
        time.sleep(0.01)
    if _lost is None and not _waiting[0]:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _set_lost("torchrun's agent is stopping this process's group (SIGTERM): a process of the job failed, or the "
              "job restarts", None, None)


def _set_lost(message, peer, status):
    global _lost
    if _lost is None:
        _lost = (message, peer, status)
        _Waiter.wake()
        if _ring is not None:
            _ring.send(f"lost {'-' if peer is None else peer} {'-' if status is None else status} {message}")


class _Ring:
    """This process's TCP links to the next and the previous process of the
    job (listening on `host`, the address gloo uses, published through jax's
    key-value store). A line 'bye' says a clean exit; 'lost <peer> <status>
    <message>' a death, passed on; end of file without 'bye', a death."""

    def __init__(self, client, rank: int, n: int, host: str, timeout: float):
        self.rank, self.n, self._lock, self.closed = rank, n, threading.Lock(), False
        srv = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        client.key_value_set(f"torch_xla_core/link/{rank}", f"{host} {srv.getsockname()[1]}")
        nxt, prev = (rank + 1) % n, (rank - 1) % n
        h, port = client.blocking_key_value_get(f"torch_xla_core/link/{nxt}", int(timeout * 1000)).split()
        out = socket.create_connection((h, int(port)), timeout=timeout)
        srv.settimeout(timeout)
        inc = srv.accept()[0]
        srv.close()
        for s in (out, inc):
            s.settimeout(None)
        self.links = {out: nxt, inc: prev}
        threading.Thread(target=self._read, name="txc-peer-ring", daemon=True).start()

    def send(self, line: str) -> None:
        with self._lock:
            for s in list(self.links):
                try:
                    s.sendall(line.encode() + b"\n")
                except OSError:
                    pass

    def close(self) -> None:
        """Ends the links (the neighbours see a death unless 'bye' came first)."""
        self.closed = True
        for s in self.links:
            try:
                s.shutdown(socket.SHUT_RDWR)  # close() alone would wait for the reader, in select on it
            except OSError:
                pass
            s.close()

    def _read(self):
        bufs, said_bye = {s: b"" for s in self.links}, set()
        while bufs:
            try:
                ready = select.select(list(bufs), [], [])[0]
            except (OSError, ValueError):  # closed under it (this process is ending)
                return
            for s in ready:
                peer = self.links[s]
                try:
                    chunk = s.recv(4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    del bufs[s]
                    if peer not in said_bye and not self.closed:
                        _set_lost(f"process {peer} of {self.n} died (its link to process {self.rank} closed "
                                  f"without a goodbye: killed, or crashed)", peer, None)
                    continue
                bufs[s] += chunk
                while b"\n" in bufs[s]:
                    line, bufs[s] = bufs[s].split(b"\n", 1)
                    parts = line.decode(errors="replace").split(" ", 3)
                    if parts[0] == "bye":
                        said_bye.add(peer)
                    elif parts[0] == "lost" and len(parts) == 4:
                        _set_lost(parts[3], None if parts[1] == "-" else int(parts[1]),
                                  None if parts[2] == "-" else int(parts[2]))


def lost():
    """The message of a peer known dead, or None."""
    return None if _lost is None else _lost[0]


def _raise(what: str):
    message, peer, status = _lost
    raise PeerLostError(
        f"{what}: {message}, and this value waits on it (a collective over the job's processes), so it will "
        f"never be ready. Save what you need from the host now and exit (torchrun's agent kills this process "
        f"30 s after its SIGTERM; else jax's runtime aborts it once its heartbeat notices, "
        f"TXC_DISTRIBUTED_TIMEOUT). Device values computed by this step are lost.",
        peer, status) from None


def wait(bufs, what: str = "waiting on the device") -> None:
    """Blocks until every buffer is ready. In a multi-process job, raises
    PeerLostError once a peer is known dead while one is not: the buffers
    are waited for on a helper thread (_Waiter), this thread sleeps until
    that one or a peer's death wakes it."""
    if not _watching:
        for b in bufs:
            b.block_until_ready()
        return
    try:
        if all(b.is_ready() for b in bufs):  # (stops at the first that is not: a running graph's first output)
            return
    except (RuntimeError, AttributeError):  # deleted (donated) or failed, or host data: _wait_one sees to it
        return _wait_each(bufs, what)
    if _lost is not None:
        _raise(what)
    _waiting[0] += 1
    try:
        if _Waiter.wait(bufs, what) is not None:  # an error: a deleted buffer, a failed collective, host data
            _wait_each(bufs, what)
    finally:
        _waiting[0] -= 1


class _Waiter:
    """A daemon thread that blocks until a list of buffers is ready (one
    jaxlib call for all, the GIL released) and wakes the caller, which
    sleeps meanwhile instead of polling each buffer: polling cost the
    waiting thread ~8 ms of CPU per replayed 2-process MLP step (1281
    outputs, is_ready then block_until_ready each, and a sleep's wake-up
    every millisecond), CPU that the device's computation shares on a CPU
    host. One per calling thread (a thread's wait never queues behind
    another's, which might need it first). A peer's death (_set_lost) wakes
    every caller; the helper then stays blocked on the dead peer's
    collective, harmlessly, and later waits raise before asking it."""

    pending = set()           # the Events of the calls waiting now
    _local = threading.local()

    def __init__(self):
        self._requests = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="txc-wait", daemon=True).start()

    @classmethod
    def wait(cls, arrays, what):
        """Blocks until `arrays` are ready or a peer is known dead; returns
        the error of the wait (None when none)."""
        self = getattr(cls._local, "waiter", None)
        if self is None:
            self = cls._local.waiter = cls()
        done, result = threading.Event(), []
        cls.pending.add(done)
        try:
            self._requests.put((arrays, done, result))
            while not done.wait(0.1):  # (woken at once by the answer or _set_lost: the timeout is a safety net)
                if _lost is not None:
                    break
            if _lost is not None and not result:
                _raise(what)
        finally:
            cls.pending.discard(done)
        return result[0]

    def _serve(self):
        while True:
            arrays, done, result = self._requests.get()
            try:
                _jax.batched_block_until_ready(arrays)
                result.append(None)
            except BaseException as e:  # noqa: BLE001  (the caller finds which buffer, and explains it)
                result.append(e)
            done.set()
            del arrays, done, result  # (holding the buffers until the next wait would keep them alive)

    @classmethod
    def wake(cls):
        for done in list(cls.pending):
            done.set()

    @classmethod
    def forked(cls):  # a forked child has none of the helper threads
        cls.pending, cls._local = set(), threading.local()


os.register_at_fork(after_in_child=_Waiter.forked)


def _wait_each(bufs, what):
    """wait() a buffer at a time, polling (finds the one at fault)."""
    for b in bufs:
        _wait_one(b, what)


def _wait_one(b, what):
    if hasattr(b, "is_ready"):  # else host data already (process_allgather's numpy result)
        delay = 2e-5  # doubling to 1 ms: a wait ends at most ~1 ms (or its own length) late
        while True:
            try:
                if b.is_ready():
                    break
            except RuntimeError:  # deleted (donated) or failed: block_until_ready says which
                break
            if _lost is not None:
                _raise(what)
            time.sleep(delay)
            delay = min(delay * 2, 0.001)
        try:
            b.block_until_ready()
        except RuntimeError as e:  # a collective that failed as its peer died (gloo: connection closed)
            if getattr(b, "is_deleted", lambda: False)():  # a donated buffer: not ours to explain
                raise
            explain_failure(e, what)
            raise


def explain_failure(e: BaseException, what: str) -> None:
    """Raises PeerLostError for an error that a peer's death caused (the
    ring's notice, a poll away, is given 2 s to arrive); returns if no
    peer is known dead."""
    t0 = time.monotonic()
    while _lost is None and time.monotonic() - t0 < 2 and _ring is not None:
        time.sleep(0.01)
    if _lost is not None:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        _raise(f"{what} ({type(e).__name__}: {first})")


def blocking(fn, what: str):
    """fn() (a call that blocks in C++ on the other processes: a barrier, a
    gather); in a multi-process job it runs on a helper thread so that a
    peer known dead raises PeerLostError here at once (the helper stays
    blocked until its own timeout, harmless)."""
    if not _watching:
        return fn()
    if _lost is not None:
        _raise(what)
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the caller
            out["error"] = e
    th = threading.Thread(target=run, name="txc-blocking", daemon=True)
    th.start()
    delay = 2e-5
    _waiting[0] += 1
    try:
        while th.is_alive():
            th.join(delay)
            delay = min(delay * 2, 0.001)
            if _lost is not None and th.is_alive():
                _raise(what)
    finally:
        _waiting[0] -= 1
    if "error" in out:
        e = out["error"]
        if isinstance(e, Exception):
            explain_failure(e, what)
        raise e
    return out["value"]


def exit(status: int = 1):  # noqa: A001 (as sys.exit)
    """sys.exit(status) for a process that lost a peer: the status it ends
    with (its exit goes through os._exit, see the module docstring)."""
    _exit_status[0] = status
    sys.exit(status)


def _record_consequence(message, peer):
    """Writes torchelastic's error file (TORCHELASTIC_ERROR_FILE, set by
    torchrun for each worker) for a process that ends because a peer was
    lost, marked LOST_PEER_KEY: torchrun picks the first failure by a
    timestamp in whole seconds, so a survivor that exits within the same
    second as the dead one may be named instead; torch_xla_core.launch skips
    failures so marked (root_failure)."""
    path = config.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": {"message": f"PeerLostError: {message}",
                                   "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))}},
                       LOST_PEER_KEY: peer}, f)
    except OSError:
        pass


def root_failure(failures: dict):
    """The failure that started it all among torchrun's {rank: ProcessFailure}:
    the earliest of those not marked as ending for a lost peer
    (_record_consequence), else the earliest. (rank, failure)."""
    roots = [r for r, f in failures.items() if LOST_PEER_KEY not in (f.error_file_data or {})] or list(failures)
    rank = min(roots, key=lambda r: (failures[r].timestamp, r))
    return rank, failures[rank]


def _at_exit():
    """Says goodbye on the ring, or, leaving on an uncaught exception, tells
    the others that this process failed; a process that failed or lost a
    peer then ends (os._exit) without jax's shutdown."""
    if _lost is None:
        failed = getattr(sys, "last_value", None)
        if _ring is None or failed is None or isinstance(failed, SystemExit):
            if _ring is not None:
                _ring.send("bye")
            return
        first = str(failed).strip().splitlines()[0][:200] if str(failed).strip() else ""
        _set_lost(f"process {_ring.rank} of {_ring.n} failed ({type(failed).__name__}: {first})", _ring.rank, None)
        why = "it failed, and told the others"
    else:
        why = f"it lost a peer ({_lost[0]})"
        _record_consequence(_lost[0], _lost[1])
    try:
        print(f"torch_xla_core: this process ends now (os._exit) with status {_exit_status[0]}: {why}; without "
              f"jax's own shutdown, which would wait for the other processes", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(_exit_status[0])
