"""Sharded checkpoints through torch.distributed.checkpoint (DCP), as
torch_xla's SPMDSavePlanner / SPMDLoadPlanner: each process writes only the
pieces of the xla tensors that lie on its own devices, and reads back only
the pieces its devices need, in whatever layout the tensors it loads into
have now (another mesh or partition spec: resharding on load).

    import torch.distributed.checkpoint as dcp
    from torch_xla_core.distributed_checkpoint import SPMDSavePlanner, SPMDLoadPlanner
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.save(state, checkpoint_id=path, planner=SPMDSavePlanner())
    # later, possibly sharded another way (mark_sharding the new model first):
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
    opt.load_state_dict(state["optim"])   # its hyper-parameters; tensors are loaded in place

Saving: an xla tensor becomes one DCP chunk per distinct piece on this
process's devices (a replicated piece held by several devices or processes
is listed by each, and DCP's dedup keeps one writer); its chunks together
cover the tensor once, so DCP's metadata describes the whole tensor and any
layout can read it. A tensor on one device is one chunk. Everything else
(CPU tensors, Python values) is DCP's default.

Loading: each xla tensor asks for the chunks its current layout puts on
this process's devices (DCP's create_read_items_for_chunk_list works out
which saved chunks overlap them); the reads land in host buffers, and once
every read of this process is in, each tensor's pieces go straight to their
devices and its storage takes the new value in place (parameters, optimizer
state and their aliases keep their identity; no gather onto one device).
All or nothing: CPU tensors and Python values of the state dict are staged
the same way, so a load that fails part way (a truncated, missing or
corrupt file; DCP names the step and the error) leaves every value of the
state dict as it was. The price: this process's share of the state is on
the host at once during a load.

Several processes (torch_xla_core.launch): DCP coordinates its plans
through torch.distributed, so every process calls
torch.distributed.init_process_group("gloo") first (the launcher sets
MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE), and all of them call
dcp.save / dcp.load with the same state dict keys. A multi-process save
without that process group is refused (DCP would let every process write
a metadata file of its own pieces only)."""
import ctypes
import dataclasses
import os
import pathlib
import shutil

import jax
import numpy as np
import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import (DefaultLoadPlanner, DefaultSavePlanner,
                                                          create_default_local_load_plan)
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from .. import _C, metrics
from .._tracing import tensor as _tensor
from .._runtime import dtypes as _dtypes, runtime
from .._tracing.tensor import XlaTensor, storage_buffer, whole_storage
from .serialization import fsync_dir, remove_stale, temp_name

__all__ = ["SPMDSavePlanner", "SPMDLoadPlanner", "AtomicFileSystemWriter", "StagedTensor"]


def _check_process_group(what: str) -> None:
    runtime.backend()
    n = jax.process_count()
    if n > 1 and not torch.distributed.is_initialized():
        raise RuntimeError(
            f"{what}: this is one of {n} processes, but torch.distributed has no process group, so DCP cannot "
            f"coordinate them (each process would write a checkpoint of its own pieces only). Call "
            f"torch.distributed.init_process_group('gloo') in every process first (torch_xla_core.launch sets "
            f"MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE for it).")


def _compute(tensors) -> None:
    """Computes the pending ones among these xla tensors in one sync (not one
    graph per tensor)."""
    pending = []
    for t in tensors:
        lt = whole_storage(t) or t._lt  # a parameter is an alias of its storage: compute the storage
        if not lt.is_data:
            pending.append(lt)
    if pending:
        _tensor.sync_lazy(pending)


def _pieces(buf) -> list:
    """The distinct pieces of buf on this process's devices: (offsets, sizes,
    the jax shards (one per device) that hold it)."""
    out = {}
    for s in buf.addressable_shards:
        box = tuple(slice(*sl.indices(n)[:2]) for sl, n in zip(s.index, buf.shape))
        offsets = tuple(sl.start for sl in box)
        sizes = tuple(sl.stop - sl.start for sl in box)
        out.setdefault((offsets, sizes), []).append(s)
    return [(o, z, shards) for (o, z), shards in sorted(out.items())]


class SPMDSavePlanner(DefaultSavePlanner):
    """DCP save planner for state dicts holding xla tensors, sharded or not:
    each process writes the pieces on its own devices (see the module doc)."""

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        _check_process_group("SPMDSavePlanner")
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self._xla = {}   # fqn -> {offsets: single-device jax array holding that piece}

    def create_local_plan(self) -> SavePlan:
        items = []
        rest = {}
        _compute([v for v in self.state_dict.values() if isinstance(v, XlaTensor)])
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, XlaTensor):
                obj = StagedTensor(obj)
            elif not isinstance(obj, StagedTensor):
                rest[fqn] = obj
                continue
            self._xla[fqn] = obj
            props = TensorProperties(dtype=obj.dtype)
            for offsets, (sizes, _) in obj.pieces.items():
                items.append(WriteItem(
                    index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)),
                                                properties=props, size=torch.Size(obj.shape))))
        saved, self.state_dict = self.state_dict, rest
        try:
            plan = super().create_local_plan()  # DCP's items for everything that is not an xla tensor
        finally:
            self.state_dict = saved
        self.plan = dataclasses.replace(plan, items=list(plan.items) + items)
        return self.plan

    def resolve_data(self, write_item: WriteItem):
        staged = self._xla.get(write_item.index.fqn)
        if staged is None:
            return super().resolve_data(write_item)
        metrics.counter_add("checkpoint_write_piece")
        return staged.host(tuple(write_item.index.offset))


class StagedTensor:
    """An xla tensor's value at one moment, for a save that writes later (an
    async checkpoint): the distinct pieces on this process's devices, their
    copies to the host started now. Until fetch() (or the write) takes a
    piece to the host its device buffer is held here: immutable, and never
    donated while referred to, so in-place updates made after staging do
    not reach what is written. SPMDSavePlanner writes it as the tensor it
    was, each piece once."""

    def __init__(self, t: XlaTensor):
        buf = storage_buffer(t)
        self.shape, self.dtype = tuple(t.shape), t.dtype
        self._buf = buf  # held: a buffer referred to from Python is never donated (its shards would go with it)
        self.pieces = {}  # offsets -> (sizes, device buffer, then host tensor, then None once written)
        for offsets, sizes, shards in _pieces(buf):
            a = shards[0].data
            a.copy_to_host_async()
            self.pieces[offsets] = (sizes, a)

    def fetch(self) -> None:
        """Takes every piece to the host now and lets the device buffers go."""
        for offsets, (sizes, a) in self.pieces.items():
            if a is not None and not isinstance(a, torch.Tensor):
                self.pieces[offsets] = (sizes, runtime.to_host(a, "staging a checkpoint"))
        self._buf = None

    def host(self, offsets) -> torch.Tensor:
        sizes, a = self.pieces[offsets]
        if a is None:
            raise RuntimeError(f"StagedTensor: the piece at {list(offsets)} of a {str(self.dtype)[6:]}"
                               f"{list(self.shape)} tensor was written already (a staged value is written once)")
        self.pieces[offsets] = (sizes, None)
        host = a if isinstance(a, torch.Tensor) else runtime.to_host(a, "writing a checkpoint")
        if all(p is None or isinstance(p, torch.Tensor) for _, p in self.pieces.values()):
            self._buf = None
        return host


def stage(state: dict, host: bool = True) -> dict:
    """A flat state dict's values as they are now, for a later write: xla
    tensors as StagedTensor (the pending ones computed in one sync; with
    host=True their pieces copied to the host before it returns, all
    transfers started first), CPU tensors cloned, other values as they are."""
    _compute([v for v in state.values() if isinstance(v, XlaTensor)])
    out = {k: StagedTensor(v) if isinstance(v, XlaTensor) else v.detach().clone() if isinstance(v, torch.Tensor)
           else v for k, v in state.items()}
    if host:
        for v in out.values():
            if isinstance(v, StagedTensor):
                v.fetch()
    return out


@dataclasses.dataclass
class _Staging:
    prefix: str   # the data files' names, as DCP's _StoragePrefix
    folder: str   # the temporary directory every process writes into


class AtomicFileSystemWriter(FileSystemWriter):
    """DCP's FileSystemWriter, committing the checkpoint directory at once:
    every process writes its files into one temporary directory next to
    `path` (<path>.txc-tmp.<pid>.<random>), the coordinator writes
    `.metadata` last (fsynced, like the data files), then renames the
    directory to `path` (an atomic exchange with an old checkpoint there:
    renameat2 RENAME_EXCHANGE on Linux) after DCP's gather of every
    process's results, and removes the old one. A process killed at any
    moment leaves `path` holding the old checkpoint or the new one; what a
    killed or failed save left is removed by the next save to `path`.

        dcp.save(state, storage_writer=AtomicFileSystemWriter(path), planner=SPMDSavePlanner())
    """

    def __init__(self, path, **kwargs):
        super().__init__(path, **kwargs)
        self._target, self._staging = self.path, None

    def reset(self, checkpoint_id=None) -> None:
        super().reset(checkpoint_id)
        self._target = self.path

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self._target, save_id=self.save_id)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if not self.use_collectives:
            raise RuntimeError("AtomicFileSystemWriter commits one checkpoint for all processes: call dcp.save "
                               "with use_collectives=True (the default)")
        if not self.overwrite and os.path.exists(os.path.join(self._target, ".metadata")):
            raise RuntimeError(f"Checkpoint already exists at {self._target} and overwrite=False")
        return plan

    def prepare_global_plan(self, plans: list) -> list:  # the coordinator: one temporary directory for all
        os.makedirs(os.path.dirname(os.path.abspath(self._target)), exist_ok=True)
        remove_stale(self._target, ours=True)  # what killed saves (and a failed one of this process) left
        self._staging = temp_name(self._target)
        os.makedirs(self._staging)
        return [dataclasses.replace(p, storage_data=_Staging(f"__{i}_", self._staging)) for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner):
        self.path = pathlib.Path(plan.storage_data.folder)
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            return super().write_data(plan, planner)
        finally:
            self.path = self._target

    def finish(self, metadata, results) -> None:
        self.path = pathlib.Path(self._staging)
        try:
            super().finish(metadata, results)  # .metadata, last
        finally:
            self.path = self._target
        fsync_dir(self._staging)
        commit_dir(self._staging, os.fspath(self._target))
        self._staging = None


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None) if os.name == "posix" else None


def commit_dir(staging: str, target: str) -> None:
    """Renames the directory `staging` to `target`: an atomic exchange where
    `target` exists (then the old one is removed). Without renameat2 the old
    one is moved aside first (<target>.txc-old.<pid>): a kill between the
    two renames leaves it there, not at `target`."""
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.lexists(target):
        os.rename(staging, target)
    elif _renameat2 is not None and _renameat2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD, os.fsencode(target),
                                               _RENAME_EXCHANGE) == 0:
        shutil.rmtree(staging)  # the old checkpoint, now under the temporary name
    else:
        old = f"{target}.txc-old.{os.getpid()}"
        os.rename(target, old)
        os.rename(staging, target)
        shutil.rmtree(old)
    fsync_dir(parent)


class _Target:
    """An xla tensor being loaded: its layout now and one host buffer per
    distinct piece on this process's devices, filled by DCP's reads (made
    at the first read, dropped once the pieces are on the devices)."""

    def __init__(self, fqn, t: XlaTensor):
        self.fqn, self.t = fqn, t
        self.buf = storage_buffer(t)
        self.whole = whole_storage(t)
        self.pieces = {}   # offsets -> (sizes, shards holding that piece)
        if self.whole is None:  # a view of part of a storage: read all of it, copy it in (install)
            self.pieces[(0,) * t.dim()] = (tuple(t.shape), [])
        else:
            for offsets, sizes, shards in _pieces(self.buf):
                self.pieces[offsets] = (sizes, shards)
        self.host = {}     # offsets -> host tensor being filled
        self.pending = 0

    def host_piece(self, offsets) -> torch.Tensor:
        h = self.host.get(offsets)
        if h is None:
            h = self.host[offsets] = torch.empty(self.pieces[offsets][0], dtype=self.t.dtype)
        return h

    def chunks(self) -> list:
        return [ChunkStorageMetadata(torch.Size(o), torch.Size(z)) for o, (z, _) in self.pieces.items()]

    def install(self) -> None:
        """Moves the filled pieces to their devices; the tensor takes the new value."""
        t, buf = self.t, self.buf
        code = _dtypes.code(t.dtype)
        if self.whole is None:  # a view of part of a storage: an ordinary (lazy) copy into it
            (host,) = self.host.values()
            with torch.no_grad():
                t.copy_(host.to(t.device))
            self.host = {}
            return
        arrays = []
        with jax.enable_x64(True):
            for offsets, (sizes, shards) in self.pieces.items():
                host = self.host[offsets]
                a = host.view(torch.int16).numpy().view(_dtypes.NUMPY[code]) if t.dtype == torch.bfloat16 else \
                    host.numpy()
                arrays += [jax.device_put(np.array(a, copy=True), s.device) for s in shards]
            if len(buf.sharding.device_set) == 1:
                new, device = arrays[0], runtime.device_index(arrays[0])
            else:  # one global array over the mesh, in the layout the tensor had
                new, device = jax.make_array_from_single_device_arrays(tuple(buf.shape), buf.sharding, arrays), 0
        self.whole.assign(_C.from_data(new, code, list(t.shape), device))
        self.host = {}
        metrics.counter_add("checkpoint_load_tensor")


class SPMDLoadPlanner(DefaultLoadPlanner):
    """DCP load planner for state dicts holding xla tensors: each tensor is
    read in its current layout, only the pieces on this process's devices
    (resharding from however it was saved; see the module doc)."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        _check_process_group("SPMDLoadPlanner")
        self._left, self._staged, self._dests = None, [], {}
        super().set_up_planner(state_dict, metadata, is_coordinator)
        _compute([v for v in self.state_dict.values() if isinstance(v, XlaTensor)])
        self._targets = {fqn: _Target(fqn, obj) for fqn, obj in self.state_dict.items() if isinstance(obj, XlaTensor)}

    def create_local_plan(self) -> LoadPlan:
        rest = {k: v for k, v in self.state_dict.items() if k not in self._targets}
        plan = create_default_local_load_plan(rest, self.metadata, not self.allow_partial_load)
        items = list(plan.items)
        for fqn, tgt in self._targets.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is None:
                if self.allow_partial_load:
                    continue
                raise RuntimeError(f"SPMDLoadPlanner: the checkpoint has no entry {fqn!r}; its entries start "
                                   f"{sorted(self.metadata.state_dict_metadata)[:8]} (allow_partial_load=True "
                                   f"skips missing ones)")
            if not isinstance(md, TensorStorageMetadata):
                raise RuntimeError(f"SPMDLoadPlanner: checkpoint entry {fqn!r} is not a tensor, but the state dict "
                                   f"holds an xla tensor of shape {list(tgt.t.shape)} there")
            if tuple(md.size) != tuple(tgt.t.shape):
                raise ValueError(f"SPMDLoadPlanner: {fqn!r} was saved with shape {list(md.size)} but the tensor "
                                 f"to load into has shape {list(tgt.t.shape)}")
            reads = create_read_items_for_chunk_list(fqn, md, tgt.chunks())
            tgt.pending = len(reads)
            items += reads
        return dataclasses.replace(plan, items=items)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        plan = super().finish_plan(new_plan)
        self._left, self._staged, self._dests = len(plan.items), [], {}  # reads to come; applied after the last
        return plan

    def _done(self, apply) -> None:
        """One read is in; `apply` gives the state dict its value, after the last read (all or nothing)."""
        if self._left is None:  # a reader that never asked finish_plan: no count to wait for
            apply()
            return
        self._staged.append(apply)
        self._left -= 1
        if self._left == 0:
            staged, self._staged = self._staged, []
            for f in staged:
                f()

    def load_bytes(self, read_item: ReadItem, value) -> None:
        obj = torch.load(value, weights_only=False)  # as DefaultLoadPlanner; parsed now, set with the rest
        fqn = read_item.dest_index.fqn

        def apply():
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[fqn], obj)
            else:
                self.state_dict[fqn] = obj
        self._done(apply)

    def resolve_tensor(self, read_item: ReadItem):
        tgt = self._targets.get(read_item.dest_index.fqn)
        if tgt is None:
            dest = super().resolve_tensor(read_item)
            if self._left is None:
                return dest
            self._dests[read_item] = dest
            return torch.empty(dest.shape, dtype=dest.dtype)  # staged: copied into dest after the last read
        host = tgt.host_piece(tuple(read_item.dest_index.offset))
        for d, (o, n) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            host = host.narrow(d, o, n)
        return host

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        tgt = self._targets.get(read_item.dest_index.fqn)
        if tgt is None:
            super().commit_tensor(read_item, tensor)
            dest = self._dests.pop(read_item, None)
            if dest is not None:
                self._done(lambda: dest.copy_(tensor))
            return
        metrics.counter_add("checkpoint_read_piece")
        tgt.pending -= 1
        self._done(tgt.install if tgt.pending == 0 else (lambda: None))
