"""txc.checkpoint: step-numbered checkpoints of a training run, as Orbax's
CheckpointManager (complete or invisible, the last N kept, the latest found
on restart, saved in the background while training goes on).

    mngr = txc.checkpoint.CheckpointManager("ckpts", keep=3)
    loader = txc.checkpoint.ResumableLoader(txc.data.DeviceLoader(torch_loader))
    items = dict(model=model, optimizer=opt, scheduler=sched, loader=loader)
    start = mngr.restore(**items)          # the latest readable step (None: none yet), loaded in place
    for step in range(0 if start is None else start, n_steps):
        ...train one step...
        if step % 100 == 0:
            mngr.save(step, **items)       # returns once the state is taken; the write goes on
    mngr.wait_until_finished()

save(step, **items): each item is an object with state_dict() and
load_state_dict() (a module, optimizer, LR scheduler, ResumableLoader) or a
dict (of tensors and Python values). The RNG states (torch's CPU generator,
the xla generator, Python's random and numpy's) are saved too, under "rng".
What is saved is taken when save() is called, at the step boundary: the
pending xla values are computed in one sync and copied to the host (every
transfer started, then awaited), CPU tensors cloned, Python values copied,
so an in-place update made afterwards cannot reach them, and the device
buffers stay free for the next step to donate (no second executable).
The write (torch.distributed.checkpoint with SPMDSavePlanner) then goes on
in the background (async_save=True, the default) while the next steps
train; one save is in flight at a time (the next save waits for it). One
process (Linux) writes in a writer process started at its first async save
and reused by the next ones: the staged tensors are copied into memory it
shares with it (a memfd arena, reused while the state fits) at the step
boundary, and it writes and commits the step under SCHED_IDLE (it runs
when a core is idle and yields to a training thread at once; nice 19 where
that is refused), so neither the write's
GIL-holding calls (DCP's torch.save per tensor) nor a fork of the training
process (its page tables, copy-on-write faults on the device buffers)
touch the steps. It dies with the trainer (PR_SET_PDEATHSIG; a dead one is
replaced at the next save). Several processes write on a background thread
(nice 19) of each: their writes coordinate over the manager's gloo group.
An error of the background write is raised by the next save(),
wait_until_finished() or restore(), naming the step.

On disk: <directory>/step_<N>/, a DCP checkpoint committed at once
(distributed_checkpoint.AtomicFileSystemWriter: a temporary directory
renamed after the last file and `.metadata` are fsynced), so a process
killed mid-save leaves the previous steps as they were. After each commit
all but the newest `keep` steps are removed.

restore(step=None, **items): the newest step (or `step`) loaded into the
items: xla tensors in place (their layout kept, sharded or not), an
optimizer's state (created if the optimizer has none yet), a dict updated;
the RNG states set. A checkpoint that cannot be read (its metadata
unreadable, a file missing or shorter than its index says, a record that
fails to load) is skipped with a warning naming it, and the one before is
tried. Returns the step restored, or None when there is none.

Several processes (torch_xla_core.launch, torch.distributed initialized
with gloo): every process creates the manager and calls save/restore at the
same steps; each writes the pieces of the tensors on its own devices, and
process 0 commits the step once all have written (DCP's gather is the
barrier). The RNG states and ResumableLoader positions are per process.
The background writes use a gloo group of their own."""
import collections
import contextlib
import copy
import itertools
import os
import pickle
import random
import re
import threading
import warnings
import weakref

import jax
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from .._tracing import random as _random
from .._execution import sharding
from .._runtime import runtime
from .._tracing.tensor import XlaTensor
from .data import DeviceLoader
from .checkpoint_writer import PROCESS_WRITES, STEP, WriterProcess, reason, write_step
from .distributed_checkpoint import AtomicFileSystemWriter, SPMDLoadPlanner, SPMDSavePlanner, stage
from .serialization import remove_stale

__all__ = ["CheckpointManager", "ResumableLoader"]

_SKELETON = "__structure__"
_OWN = re.compile(r"^__rank(\d+)__$")  # the first part of a per-process entry


class _Ref:
    """A tensor's place in a saved item: its key in the flat DCP state dict
    and the device it was on."""
    __slots__ = ("fqn", "device")

    def __init__(self, fqn, device):
        self.fqn, self.device = fqn, device


def _flatten(tree, prefix, flat):
    """tree with each tensor replaced by a _Ref to flat[key] (key: the path joined by '/')."""
    if isinstance(tree, torch.Tensor):
        key = prefix
        while key in flat:
            key += "'"
        flat[key] = tree
        return _Ref(key, str(tree.device))
    if isinstance(tree, dict):
        out = type(tree)() if type(tree) in (dict, collections.OrderedDict) else {}
        for k, v in tree.items():
            out[k] = _flatten(v, f"{prefix}/{k}", flat)
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_flatten(v, f"{prefix}/{i}", flat) for i, v in enumerate(tree))
    return copy.deepcopy(tree)


def _unflatten(tree, flat):
    if isinstance(tree, _Ref):
        t = flat[tree.fqn]  # loaded in place, or on the CPU: back to the device it was saved from
        return t.to(tree.device) if t.device.type == "cpu" and tree.device != "cpu" else t
    if isinstance(tree, dict):
        out = type(tree)()
        for k, v in tree.items():
            out[k] = _unflatten(v, flat)
        return out
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_unflatten(v, flat) for v in tree)
    return tree


def _refs(tree):
    if isinstance(tree, _Ref):
        yield tree.fqn
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _refs(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _refs(v)


def rng_state() -> dict:
    """The RNG states a checkpoint holds: torch's CPU generator, the xla
    generator (computed if pending), Python's random and numpy's."""
    return {"torch": torch.get_rng_state(), "xla": _random.get_rng_state(), "python": random.getstate(),
            "numpy": np.random.get_state()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    _random.set_rng_state(state["xla"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


class CheckpointManager:
    """Step-numbered checkpoints in `directory` (see the module doc):
    save(step, **items), restore(step=None, **items) -> step or None,
    latest_step(), all_steps(), is_saving(), wait_until_finished(), close()."""

    def __init__(self, directory, keep: int | None = 3, async_save: bool = True):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"CheckpointManager: keep={keep!r} must be an int >= 1 (the steps kept) or None (all)")
        self.directory = os.path.abspath(os.fspath(directory))
        self.keep, self.async_save = keep, async_save
        runtime.backend()
        self._rank, self._nproc = jax.process_index(), jax.process_count()
        self._own = f"__rank{self._rank}__"  # the prefix of this process's entries (RNG, loader position)
        self._group = None
        if self._nproc > 1:
            if not dist.is_initialized():
                raise RuntimeError(f"CheckpointManager: this is one of {self._nproc} processes, but torch.distributed "
                                   f"has no process group: call torch.distributed.init_process_group('gloo') in "
                                   f"every process first (torch_xla_core.launch sets its environment)")
            self._group = dist.new_group(backend="gloo")  # the background writes' own: apart from the program's
        if self._rank == 0:
            os.makedirs(self.directory, exist_ok=True)
            for step in self._listed(committed=False):
                remove_stale(self._path(step))
        self._thread = None
        self._failed = None  # (step, exception) of a background write, raised at the next call
        self._writer = None  # one process's WriterProcess, started at the first async save
        self._process_writes = async_save and self._nproc == 1 and PROCESS_WRITES

    # ---- where ----------------------------------------------------------------------

    def _path(self, step: int) -> str:
        return os.path.join(self.directory, f"step_{step}")

    def _listed(self, committed=True) -> list:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        steps = set()
        for name in names:
            m = STEP.match(name if committed else name.split(".txc-")[0])
            if m and (not committed or os.path.isdir(os.path.join(self.directory, name))):
                steps.add(int(m.group(1)))
        return sorted(steps)

    def all_steps(self) -> list:
        """The committed steps, oldest first (a save in flight is not one yet)."""
        return self._listed()

    def latest_step(self):
        """The newest committed step whose metadata and files are intact (a
        damaged one is skipped with a warning), or None."""
        for step in reversed(self.all_steps()):
            if self._damage(step) is None:
                return step
        return None

    def _damage(self, step):
        """None, or why the checkpoint of `step` cannot be read (and a warning saying so)."""
        folder = self._path(step)
        try:
            md = dcp.FileSystemReader(folder).read_metadata()
            for info in (md.storage_data or {}).values():
                f = os.path.join(folder, info.relative_path)
                size = os.path.getsize(f)
                if size < info.offset + info.length:
                    raise OSError(f"{info.relative_path} is {size} bytes, its index says at least "
                                  f"{info.offset + info.length}: truncated")
        except Exception as e:  # noqa: BLE001  (any failure to read is damage)
            why = f"{type(e).__name__}: {e}"
        else:
            return None
        warnings.warn(f"CheckpointManager: skipping the checkpoint of step {step} at {folder}: it cannot be read "
                      f"({why}); using the one before", stacklevel=3)
        return why

    # ---- save -----------------------------------------------------------------------

    def save(self, step: int, **items) -> None:
        """Takes the items' state now and writes it as step `step` (in the
        background with async_save). See the module doc."""
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"CheckpointManager.save: step={step!r} must be an int >= 0")
        for name in items:
            if name == "rng" or _OWN.match(name) or name == _SKELETON:
                raise ValueError(f"CheckpointManager.save: {name!r} is a name the manager uses; name the item "
                                 f"otherwise")
        self.wait_until_finished()
        flat = {}
        skeleton = {}
        for name, obj in items.items():
            prefix = f"{self._own}/{name}" if isinstance(obj, ResumableLoader) else name
            state = obj.state_dict() if hasattr(obj, "state_dict") else obj
            if not isinstance(state, dict):
                raise TypeError(f"CheckpointManager.save: item {name!r} is a {type(obj).__name__}: pass an object "
                                f"with state_dict()/load_state_dict() or a dict")
            skeleton[name] = _flatten(state, prefix, flat)
        skeleton["rng"] = _flatten(rng_state(), f"{self._own}/rng", flat)
        flat = stage(flat)  # the values as they are now: one sync, the device-to-host copies, CPU tensors cloned
        if self._process_writes:
            if self._writer is None or not self._writer.alive():
                if self._writer is not None:
                    self._writer.close()
                self._writer = WriterProcess()
                weakref.finalize(self, self._writer.close)  # a manager dropped unclosed: its writer goes too
            self._writer.share(flat)  # the previous write is finished: the arena is free
        flat[f"{_SKELETON}/{self._own}"] = pickle.dumps(skeleton)  # one record (DCP would flatten a dict)
        if self.async_save:
            self._thread = threading.Thread(target=self._write, args=(step, flat), name=f"txc-checkpoint-{step}",
                                            daemon=True)
            self._thread.start()
        else:
            self._write(step, flat)
            self._raise_failed()

    def _write(self, step, flat) -> None:
        if self.async_save and self._writer is None and hasattr(os, "setpriority"):
            # the write takes the CPU time training leaves: the lowest priority for this thread (Linux: per thread).
            # Not when it only hands the state to the writer process: a thread at nice 19 holding the GIL between
            # its copies into the arena made the steps wait for it (+18% a step with a writer writing nothing)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            if self._writer is not None:
                self._writer.write(self.directory, step, self.keep, AtomicFileSystemWriter, flat)
            else:
                write_step(self.directory, step, flat, self.keep, AtomicFileSystemWriter, SPMDSavePlanner(),
                           self._group, self._nproc, self._rank)
        except BaseException as e:  # noqa: BLE001  (raised at the next call, naming the step)
            self._failed = (step, e)

    def _raise_failed(self) -> None:
        if self._failed is not None:
            (step, e), self._failed = self._failed, None
            raise RuntimeError(f"CheckpointManager: the save of step {step} to {self._path(step)} failed: "
                               f"{reason(e)}") from e

    def is_saving(self) -> bool:
        """Whether a background write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is committed; raises its error."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise_failed()

    def close(self) -> None:
        """Waits for the save in flight (raising its error) and stops the writer process."""
        try:
            self.wait_until_finished()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- restore --------------------------------------------------------------------

    def restore(self, step: int | None = None, **items):
        """Loads the newest readable step (or `step`: an error if it cannot be
        read) into the items and sets the RNG states; returns the step, or
        None when there is none."""
        self.wait_until_finished()
        if step is not None:
            steps = [step]
            if not os.path.isdir(self._path(step)):
                raise FileNotFoundError(f"CheckpointManager.restore: no checkpoint of step {step} in "
                                        f"{self.directory} (steps there: {self.all_steps()})")
        else:
            steps = list(reversed(self.all_steps()))
        for s in steps:
            if self._damage(s) is None and self._restore(s, items):
                return s
        if step is not None:
            raise RuntimeError(f"CheckpointManager.restore: the checkpoint of step {step} at {self._path(step)} "
                               f"cannot be read (the warning above says why); nothing was restored")
        return None

    def _restore(self, step, items) -> bool:
        folder = self._path(step)
        md = dcp.FileSystemReader(folder).read_metadata()
        saved = md.state_dict_metadata
        mine = f"{_SKELETON}/{self._own}"
        if mine not in saved:
            raise RuntimeError(f"CheckpointManager.restore: the checkpoint of step {step} at {folder} was written by "
                               f"processes {sorted(k.split('/')[-1] for k in saved if k.startswith(_SKELETON))}; "
                               f"this is process {self._rank}")
        live = {}
        for name, obj in items.items():
            if hasattr(obj, "state_dict"):
                _flatten(obj.state_dict(), f"{self._own}/{name}" if isinstance(obj, ResumableLoader) else name, live)
        optim = {name: obj for name, obj in items.items() if isinstance(obj, torch.optim.Optimizer)}
        target = {}
        for fqn, m in saved.items():
            if _OWN.match(fqn.split("/")[0]) and fqn.split("/")[0] != self._own:
                continue  # another process's RNG and loader position
            if fqn.startswith(_SKELETON + "/"):
                if fqn == mine:
                    target[fqn] = None
                continue
            if isinstance(m, BytesStorageMetadata):
                target[fqn] = None
                continue
            assert isinstance(m, TensorStorageMetadata)
            t = live.get(fqn)
            if isinstance(t, torch.Tensor) and tuple(t.shape) == tuple(m.size) and t.dtype == m.properties.dtype:
                target[fqn] = t  # loaded in place
            else:
                target[fqn] = _fresh(fqn, m, optim)
        try:
            _load_state_dict(target, dcp.FileSystemReader(folder), self._group, no_dist=self._nproc == 1,
                             planner=SPMDLoadPlanner())
            skeleton = pickle.loads(target[mine])
        except (Exception, CheckpointException) as e:  # noqa: BLE001  (a record that fails to load: damage)
            warnings.warn(f"CheckpointManager: skipping the checkpoint of step {step} at {folder}: loading it "
                          f"failed ({reason(e)}); using the one before", stacklevel=3)
            return False
        for name, obj in items.items():
            if name not in skeleton:
                raise KeyError(f"CheckpointManager.restore: the checkpoint of step {step} has no item {name!r} "
                               f"(it has {sorted(k for k in skeleton if k != 'rng')})")
            state = _unflatten(skeleton[name], target)
            if isinstance(obj, dict):
                obj.clear()
                obj.update(state)
            elif isinstance(obj, torch.nn.Module) and all(target[f] is live.get(f) for f in _refs(skeleton[name])):
                pass  # every tensor loaded in place
            else:
                obj.load_state_dict(state)
        set_rng_state(_unflatten(skeleton["rng"], target))
        return True


def _fresh(fqn, m, optim):
    """A tensor to load a saved entry into that has no live tensor: for an
    optimizer's per-parameter state shaped as its parameter, one like the
    parameter (its device and layout); else a CPU tensor."""
    parts = fqn.split("/")
    opt = optim.get(parts[0])
    if opt is not None and len(parts) == 4 and parts[1] == "state" and parts[2].isdigit():
        params = [p for g in opt.param_groups for p in g["params"]]
        i = int(parts[2])
        if i < len(params) and isinstance(params[i], XlaTensor) and tuple(params[i].shape) == tuple(m.size):
            t = torch.zeros(m.size, dtype=m.properties.dtype, device=params[i].device)
            spec = sharding.get_sharding(params[i])
            if spec is not None:
                sharding.mark_sharding(t, spec.mesh, spec.partition_spec)
            return t
    return torch.empty(m.size, dtype=m.properties.dtype)


class ResumableLoader:
    """An iterable of batches whose position a checkpoint holds: wraps a
    torch DataLoader, a txc.data.DeviceLoader over one, or any re-iterable.
    state_dict() is the epoch, the batches taken in it and the RNG states the
    epoch started with (torch's generator, the loader's and its sampler's);
    after load_state_dict() the next iteration starts the epoch over from
    those states (the same shuffle) and skips the batches taken, reading
    them on the host only. `epoch` counts the finished epochs."""

    def __init__(self, loader):
        self.loader = loader
        self.epoch, self.position = 0, 0
        self._start = None  # the RNG states the current epoch started with
        self._skip = 0

    def __len__(self) -> int:
        return len(self.loader)

    def _host(self):
        return self.loader.loader if isinstance(self.loader, DeviceLoader) else self.loader

    def _generators(self):
        host = self._host()
        sampler = getattr(host, "sampler", None)
        batch_sampler = getattr(getattr(host, "batch_sampler", None), "sampler", None)
        gens = [getattr(host, "generator", None), getattr(sampler, "generator", None),
                getattr(batch_sampler, "generator", None)]
        return [g for g in gens if isinstance(g, torch.Generator)]

    def _states(self):
        return {"torch": torch.get_rng_state(), "loader": [g.get_state() for g in self._generators()]}

    def __iter__(self):
        skip, self._skip = self._skip, 0
        now = torch.get_rng_state()
        if skip:
            torch.set_rng_state(self._start["torch"])
            for g, s in zip(self._generators(), self._start["loader"]):
                g.set_state(s)
        else:
            self._start = self._states()
        try:
            # the epoch's draws (a DataLoader's seed, its sampler's shuffle) happen here, on this thread
            it = iter(self._host())
            head = list(itertools.islice(it, skip + 1))
        finally:
            if skip:
                torch.set_rng_state(now)
        if len(head) < skip:
            raise RuntimeError(f"ResumableLoader: the checkpoint's position is batch {skip} of epoch {self.epoch}, "
                               f"but the loader now yields {len(head)} batches in it")
        batches = itertools.chain(head[skip:], it)
        if isinstance(self.loader, DeviceLoader):
            d = self.loader
            batches = DeviceLoader(_Once(batches), prefetch=d.prefetch, device=d.device, mark_step=d.mark_step,
                                   transform=d.transform)
        self.position = skip
        for batch in batches:
            self.position += 1
            yield batch
        self.epoch += 1
        self.position = 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "start": self._start if self.position else None}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._skip, self._start = state["epoch"], state["position"], state["start"]
        self.position = 0


class _Once:
    def __init__(self, it):
        self.it = it

    def __iter__(self):
        return self.it
