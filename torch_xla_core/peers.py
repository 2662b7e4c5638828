"""The processes of a multi-process job: how this process joins jax's
distributed runtime (and so what listens where), and what it does when a
peer process dies.

What listens (see SECURITY.md):
- jax's coordination service (unauthenticated gRPC). Under
  torch_xla_core.launch the launcher hosts it on 127.0.0.1
  (TXC_COORDINATOR_HOSTED=1: process 0 starts none). Otherwise process 0
  runs it, bound to TXC_COORDINATOR_BIND when set (host:port; e.g.
  "[::]:1234" for every interface), else exactly the address of
  TXC_COORDINATOR: on several machines the address the user named for
  process 0 — never every interface unless the user says so (jax's own
  default is [::]).
- Every process listens for jax's CPU collectives (gloo, over TCP). It
  binds TXC_GLOO_HOSTNAME when set, else 127.0.0.1 when the coordinator is
  a loopback address, else gloo's default (this machine's host name,
  resolved).
- torch.distributed's store (init_process_group): under the launcher the
  launcher hosts it on 127.0.0.1 (launch.py); torch's gloo process group
  listens on the loopback interface there (GLOO_SOCKET_IFNAME=lo).

A dead peer. torch_xla_core.launch tells the other processes at once
(through a pipe, TXC_LAUNCH_FD) when one exits with an error; a call of
this process waiting on the device (a .cpu(), .item(), sync(wait=True),
txc.wait_device_ops()) whose value waits on a collective then raises
PeerLostError naming the peer (well within TXC_COLLECTIVE_TIMEOUT, default
60 s; under a second here), also when the collective itself failed on the
closed connection, so that `try/except` around a step can save what is on
the host and exit. jax's runtime cannot be told to raise instead: its
coordination client aborts the process (a C++ fatal error) once its
heartbeat (TXC_DISTRIBUTED_TIMEOUT) sees the dead peer, or at once when
the service itself is gone (hence the launcher hosts it); jaxlib 0.10's
missed_heartbeat_callback cannot be a Python function (the call fails with
std::bad_cast, itself an abort). So the launcher sets that heartbeat past
its own bound and ends any process still running TXC_COLLECTIVE_TIMEOUT s
after the death itself, with a message naming both. A process that has
lost a peer ends with os._exit once its own exit handlers (registered after
torch_xla_core's join) have run: jax's exit handlers would wait for the
dead peer (shutdown barrier, the collective still blocked in gloo). Its
exit status is 1 unless the script calls peers.exit(status).
Without the launcher (several machines), jax's heartbeat is what notices
a dead peer, and it aborts."""
import atexit
import ipaddress
import logging
import os
import sys
import threading
import time
import warnings
from functools import partial

import jax
from jax._src import distributed, xla_bridge
from jax._src.lib import _jax

from . import config

__all__ = ["PeerLostError", "lost", "wait", "blocking", "exit"]


class PeerLostError(RuntimeError):
    """A peer process of this job died while this process waited on a value
    that needs it. `peer` is its process index (None when unknown), `status`
    its exit status (None when unknown)."""

    def __init__(self, message, peer=None, status=None):
        super().__init__(message)
        self.peer, self.status = peer, status


_lost = None          # (message, peer, status) once a peer is known dead
_watching = False     # a multi-process job: waits poll instead of blocking
_exit_status = [1]


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    gloo = config.get("TXC_GLOO_HOSTNAME") or ("127.0.0.1" if _is_loopback(host) else None)
    return bind, gloo


def join(num_processes: int, process_id: int, coordinator: str, timeout: int) -> None:
    """jax.distributed.initialize with the listeners bound as the module
    docstring says, gloo CPU collectives, and the launcher's notices."""
    bind, gloo = bind_addresses(coordinator)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    hosted = config.get("TXC_COORDINATOR_HOSTED") and process_id == 0

    def initialize():
        if hosted:  # the launcher runs the coordination service: process 0 is a client like the others
            distributed._jax = _NoService(_jax)
        try:
            jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id,
                                       initialization_timeout=timeout, heartbeat_timeout_seconds=timeout,
                                       coordinator_bind_address=bind)
        finally:
            if hosted:
                distributed._jax = _jax
    _watch()  # a peer that dies before every process joined: PeerLostError here, not a wait for the timeout
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


def _watch():
    global _watching
    _watching = True
    atexit.register(_end_if_lost)  # after jax's handlers were registered: runs before them
    fd = config.get("TXC_LAUNCH_FD")
    if fd is not None:
        try:
            os.set_inheritable(fd, False)
        except OSError:  # not open here (a child of a launched process inherits the variable, not the pipe)
            return
        threading.Thread(target=_read_notices, args=(fd,), name="txc-peer-notices", daemon=True).start()


def _read_notices(fd: int) -> None:
    """Lines from the launcher: 'lost <peer> <status> <message>'. End of
    file: the launcher itself is gone."""
    global _lost
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            chunk = b""
        if not chunk:
            if _lost is None:
                _lost = (f"the launcher (torch_xla_core.launch, pid {os.getppid()} at start) exited while this "
                         f"process ran", None, None)
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            parts = line.decode(errors="replace").split(" ", 3)
            if len(parts) == 4 and parts[0] == "lost" and _lost is None:
                _lost = (parts[3], int(parts[1]), int(parts[2]))


def lost():
    """The message of a peer known dead, or None."""
    return None if _lost is None else _lost[0]


def _raise(what: str):
    message, peer, status = _lost
    timeout = f"{config.get('TXC_COLLECTIVE_TIMEOUT'):g}"
    raise PeerLostError(
        f"{what}: {message}, and this value waits on it (a collective over the job's processes), so it will "
        f"never be ready. Save what you need from the host now and exit: the launcher ends this process "
        f"{timeout} s (TXC_COLLECTIVE_TIMEOUT) after the peer died, and jax's runtime can only abort it once "
        f"its heartbeat notices (TXC_DISTRIBUTED_TIMEOUT). Device values computed by this step are lost.",
        peer, status) from None


def wait(bufs, what: str = "waiting on the device") -> None:
    """Blocks until every buffer is ready. In a multi-process job it polls,
    and raises PeerLostError once a peer is known dead while one is not."""
    if not _watching:
        for b in bufs:
            b.block_until_ready()
        return
    for b in bufs:
        if not hasattr(b, "is_ready"):  # host data already (process_allgather's numpy result)
            continue
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
            _explain(e, what)
            raise


def _explain(e: BaseException, what: str) -> None:
    """Raises PeerLostError for an error that a peer's death caused (the
    launcher's notice, a poll away, is given 2 s to arrive); returns if no
    peer is known dead."""
    t0 = time.monotonic()
    while _lost is None and time.monotonic() - t0 < 2 and config.is_set("TXC_LAUNCH_FD"):
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
    while th.is_alive():
        th.join(delay)
        delay = min(delay * 2, 0.001)
        if _lost is not None and th.is_alive():
            _raise(what)
    if "error" in out:
        e = out["error"]
        if isinstance(e, Exception):
            _explain(e, what)
        raise e
    return out["value"]


def exit(status: int = 1):  # noqa: A001 (as sys.exit)
    """sys.exit(status) for a process that lost a peer: the status it ends
    with (its exit goes through os._exit, see the module docstring)."""
    _exit_status[0] = status
    sys.exit(status)


def _end_if_lost():
    if _lost is None:
        return
    try:
        print(f"torch_xla_core: this process lost a peer ({_lost[0]}); it ends now (os._exit) with status "
              f"{_exit_status[0]}, without jax's own shutdown, which would wait for that peer", file=sys.stderr)
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(_exit_status[0])
