"""The writing of a checkpoint manager's step (txc.checkpoint, checkpoint.py):
write_step, DCP's write and commit of one step and the pruning to `keep`,
on a thread of the training process (several processes) or in a writer
process (one process, Linux): WriterProcess starts it once and hands it
each save, the staged tensors in a memfd arena both map, the messages
length-prefixed pickles on a socket pair; _serve is its loop."""
import contextlib
import io
import math
import mmap
import os
import pickle
import re
import shutil
import socket
import struct
import subprocess
import sys

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.state_dict_saver import _save_state_dict

from .distributed_checkpoint import SPMDSavePlanner, StagedTensor
from .serialization import remove_stale

STEP = re.compile(r"^step_(\d+)$")


def write_step(directory, step, flat, keep, writer_cls, planner, group=None, nproc=1, rank=0) -> None:
    """Writes the staged state `flat` as <directory>/step_<step> (committed
    at once), then removes all but the newest `keep` steps; a failed write's
    temporary directory is removed and its error raised. In the training
    process (a thread) or in the writer process."""
    path = os.path.join(directory, f"step_{step}")
    try:
        # dcp.save less its warning that one process saves alone (no_dist)
        # per_thread_copy_ahead=0: DCP's serial loader. Its overlapping one (the default where a PrivateUse1 device
        # exists) waits for the device's stream before copying tensors that are on the host already (staged):
        # every launched step
        _save_state_dict(flat, writer_cls(path, per_thread_copy_ahead=0), group, no_dist=nproc == 1, planner=planner)
        if rank == 0 and keep is not None:
            steps = sorted(int(m.group(1)) for m in map(STEP.match, os.listdir(directory)) if m)
            for old in steps[:-keep]:
                shutil.rmtree(os.path.join(directory, f"step_{old}"), ignore_errors=True)
    except BaseException:
        if rank == 0:
            remove_stale(path, ours=True)  # the temporary directory the failed save left
        raise


# ---- the writer process (one process's async saves) ---------------------------------------------------------------
# The write ran on a thread of the training process (DCP's torch.save per tensor holds the GIL over a tensor's copy
# and CRC: +45-54% step time during a save, bench/checkpoint.py), then in a child forked per save (+33%: the fork
# copies the page tables of a multi-GB process, and each step's writes to the device buffers, process memory on
# XLA:CPU, fault copy-on-write while the child lives). torch's own process executor (dcp.async_save with
# AsyncCheckpointerType.PROCESS, torch 2.11-2.15) needs a default process group (the manager's one process has
# none: no_dist) and starts its daemon with multiprocessing's spawn, which runs the trainer's script again in it
# unless guarded by `if __name__ == "__main__"`. So: a plain interpreter started once (subprocess, its command
# below), the staged tensors handed over in a memfd arena both map, its messages length-prefixed pickles on a
# socket pair.
PROCESS_WRITES = hasattr(os, "memfd_create") and hasattr(socket, "send_fds")  # Linux
_ALIGN = 64  # each tensor's offset in the arena (any dtype's alignment)
_SERVE = ("import ctypes, os, signal, sys\n"
          "ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: dies with the trainer's thread that started it\n"
          "if os.getppid() != int(sys.argv[2]):\n    os._exit(1)  # the trainer was gone before that\n"
          "signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the trainer's to handle\n"
          "sys.path[:0] = sys.argv[3:]\n"
          "from torch_xla_core._features.checkpoint_writer import _serve  # at the trainer's priority: seconds, once\n"
          "try:  # the writes take the CPU time training leaves: run only when a core is idle, preempted at once\n"
          "    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\n"
          "except (AttributeError, OSError):\n"
          "    os.nice(19)\n"
          "_serve(int(sys.argv[1]))\n")


def _send(sock, obj, fds=()) -> None:
    data = obj if isinstance(obj, bytes) else pickle.dumps(obj)
    head = struct.pack("<Q", len(data))
    if fds:
        socket.send_fds(sock, [head], list(fds))
        sock.sendall(data)
    else:
        sock.sendall(head + data)


def _recv(sock):
    """The next message's bytes and the file descriptors sent with it; EOFError once the other end is gone."""
    head, fds, _, _ = socket.recv_fds(sock, 8, 1)
    while head and len(head) < 8:
        more = sock.recv(8 - len(head))
        head += more
        if not more:
            break
    if len(head) < 8:
        raise EOFError("the other process closed its end")
    data = bytearray(struct.unpack("<Q", head)[0])
    view, got = memoryview(data), 0
    while got < len(data):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError("the other process closed its end")
        got += n
    return bytes(data), fds


class _ArenaPickler(pickle.Pickler):
    """Pickles a tensor in the arena as its place there (offset, shape, dtype), not its bytes."""

    def __init__(self, f, arena):
        super().__init__(f, protocol=pickle.HIGHEST_PROTOCOL)
        self._base = arena.data_ptr()
        self._end = self._base + arena.numel()

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor) and self._base <= obj.data_ptr() < self._end:
            return obj.data_ptr() - self._base, tuple(obj.shape), obj.dtype
        return None


class _ArenaUnpickler(pickle.Unpickler):
    """A tensor pickled by _ArenaPickler back as a tensor over its bytes in
    the arena's mapping, a storage of its own (DCP copies a tensor whose
    storage is larger than it before writing it)."""

    def __init__(self, f, arena):
        super().__init__(f)
        self._arena = arena

    def persistent_load(self, pid):
        offset, shape, dtype = pid
        n = math.prod(shape)
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(self._arena, dtype=dtype, count=n, offset=offset).view(shape)


def _new_arena(size):
    """A memfd of `size` bytes and a uint8 tensor over its mapping."""
    fd = os.memfd_create("txc-checkpoint-staging", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, size)
        return fd, torch.frombuffer(mmap.mmap(fd, size), dtype=torch.uint8)
    except BaseException:
        os.close(fd)
        raise


class WriterProcess:
    """The process that writes one process's async saves: started once,
    reused by every save. share() copies a staged state's host tensors into
    the arena it maps too (a larger arena when the state outgrows it), at the
    step boundary; write() has it write and commit the step and waits for
    its answer."""

    def __init__(self):
        ours, theirs = socket.socketpair()
        with theirs:
            paths = [os.path.abspath(p) for p in sys.path if p]
            self._proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(theirs.fileno()), str(os.getpid()),
                                           *paths], pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self._sock, self.pid = ours, self._proc.pid
        self._arena, self._unsent = None, None  # the arena, and its memfd until the writer has it

    def alive(self) -> bool:
        return self._proc.poll() is None

    def share(self, flat: dict) -> None:
        """Moves flat's host tensors (CPU values, StagedTensor pieces) into the arena, in place. In save(), not on
        the background thread: ~15 ms for 38 MiB, which on the thread slowed the first steps after save() by more
        (bench/checkpoint.py)."""
        tensors = [v for v in flat.values() if isinstance(v, torch.Tensor)]
        tensors += [t for v in flat.values() if isinstance(v, StagedTensor) for _, t in v.pieces.values()]
        size = sum(-(-t.nbytes // _ALIGN) * _ALIGN for t in tensors)
        if self._arena is None or self._arena.numel() < size:
            if self._unsent is not None:
                os.close(self._unsent)
            self._arena = None
            self._unsent, self._arena = _new_arena(max(size, mmap.PAGESIZE))
        offset = 0

        def place(t):
            nonlocal offset
            view = self._arena[offset:offset + t.nbytes].view(t.dtype).view(t.shape)
            view.copy_(t)
            offset += -(-t.nbytes // _ALIGN) * _ALIGN
            return view
        for k, v in flat.items():
            if isinstance(v, torch.Tensor):
                flat[k] = place(v)
            elif isinstance(v, StagedTensor):
                v.pieces = {o: (sizes, place(t)) for o, (sizes, t) in v.pieces.items()}

    def write(self, directory, step, keep, writer_cls, flat) -> None:
        """Has the writer write the state `flat`, shared (share()), as step `step`; raises its error."""
        try:
            if self._unsent is not None:
                fd, self._unsent = self._unsent, None
                try:
                    _send(self._sock, ("arena", self._arena.numel()), [fd])
                finally:
                    os.close(fd)
            f = io.BytesIO()
            _ArenaPickler(f, self._arena).dump(("write", directory, step, keep, writer_cls, flat))
            _send(self._sock, f.getvalue())
            error = pickle.loads(_recv(self._sock)[0])
        except (OSError, EOFError) as e:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)
            raise RuntimeError(f"the writer process (pid {self.pid}) ended before the write was committed (exit "
                               f"status {self._proc.poll()}): {type(e).__name__}: {e}") from None
        if error is not None:
            raise RuntimeError(error)

    def close(self) -> None:
        """Stops the writer (it exits at the end of its socket) and reaps it."""
        with contextlib.suppress(OSError):
            self._sock.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class _WriterPlanner(SPMDSavePlanner):
    """SPMDSavePlanner in the writer process, whose xla values are staged
    already (StagedTensor pieces in the arena): its check of the process
    group would start a runtime there (and could take the trainer's
    accelerator), so it is skipped; one process writes alone (no_dist)."""

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        DefaultSavePlanner.set_up_planner(self, state_dict, storage_meta, is_coordinator)
        self._xla = {}


def _serve(fd: int) -> None:
    """The writer process: writes each step it is sent, answers None or the error in one line, ends at the end of
    its socket (the trainer closed it, or is gone)."""
    sock = socket.socket(fileno=fd)
    arena = None
    while True:
        try:
            data, fds = _recv(sock)
        except (EOFError, OSError):
            return
        error = None
        try:
            msg = _ArenaUnpickler(io.BytesIO(data), arena).load()
            if msg[0] == "arena":
                arena = mmap.mmap(fds[0], msg[1])
                continue
            _, directory, step, keep, writer_cls, flat = msg
            write_step(directory, step, flat, keep, writer_cls, _WriterPlanner())
        except (Exception, CheckpointException) as e:  # noqa: BLE001  (sent to the trainer, raised at its next call)
            error = reason(e)
        finally:
            for f in fds:
                os.close(f)
        try:
            _send(sock, error)
        except OSError:
            return  # the trainer is gone


def reason(e) -> str:
    """An error in one line: DCP's CheckpointException by the errors of its processes."""
    if isinstance(e, CheckpointException):
        return "; ".join(f"process {r}: {reason(f[0] if isinstance(f, tuple) else f)}"
                         for r, f in sorted(e.failures.items()))
    return f"{type(e).__name__}: {e}"
