"""torch.distributed's "xla" backend: dist.init_process_group("xla",
init_method="xla://") gives a ProcessGroupXla, whose collectives on xla
tensors are the core collectives of collectives.py, traced into the step's
graph. Each returns a Work already completed with its (lazy) outputs: the
data moves when the graph runs, so wait() has nothing to wait for (as
torch_xla's backend). DistributedDataParallel runs over it: its parameter
check (allgather), initial broadcast and bucketed gradient all-reduces all
land in the step's graph.

Ranks are the processes of the xla runtime (jax's distributed runtime),
one per process. A sub-group (dist.new_group, DeviceMesh dims) runs its
collectives with its ranks as one replica group and the other processes
filling groups of its size (collectives.subgroup; a size that does not
divide the world's raises). broadcast is an
all_gather of every process's tensor and a pick of the root's: exact for
every value (torch_xla multiplies by 0/1, which turns a non-root's inf into
NaN), at world-size times the bytes. barrier() waits on the host for every
process (processes.barrier); pending tensors stay pending. reduce, gather,
scatter, send and recv raise NotImplementedError (they need a rank-dependent
graph). Collectives of CPU tensors run on a gloo backend of the same ranks
(made at first use): object collectives, a checkpoint's planning, and
init_process_group("cpu:gloo,xla:xla") work as with torch's own backends."""
import functools
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh
from torch._C._distributed_c10d import _create_work_from_future

from .._execution import executor
from .._runtime import runtime
from . import collectives as cc
from . import processes


def _done(result):
    """A completed Work holding `result`, the tensors the collective wrote in
    place (a list, or a list of lists), which a txc.compile recording in
    progress is told of: DDP's gradient buckets, which txc.compile (replay/) then
    records again among its inputs."""
    session = executor.recording_session()
    if session is not None:
        session.collective_wrote([t for x in result for t in (x if isinstance(x, list) else [x])])
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for v in x:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _cpu_to_gloo(method):
    """A collective of CPU tensors goes to the group's gloo backend (the
    same method of ProcessGroupGloo), as with init_process_group(
    "cpu:gloo,xla:xla"): torch drops the other backends of a group whose
    creator returns a whole ProcessGroup, so this group serves both."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        t = _first_tensor(args)
        if t is not None and t.device.type == "cpu":
            return getattr(self._gloo(), method.__name__)(*args, **kwargs)
        return method(self, *args, **kwargs)
    return run


class ProcessGroupXla(dist.ProcessGroup):
    """A torch.distributed process group over the xla runtime's processes
    (see the module's comment)."""

    def __init__(self, store, rank: int, size: int, timeout=timedelta(minutes=30)):
        super().__init__(rank, size)
        self.store, self.timeout = store, timeout
        self._cpu = None  # _gloo()
        self.ranks = list(range(size))  # the global rank of each of the group's ranks

    def getBackendName(self):  # noqa: N802 (torch's name)
        return "xla"

    # The group's name, which functional collectives pass and resolve (the
    # C++ base keeps it in a backend this Python group does not have).
    _name = None

    def _set_group_name(self, name):
        self._name = name

    @property
    def group_name(self):
        if self._name is None:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    # --- helpers
    def _groups(self, who):
        return cc.subgroup(self.ranks, f"'xla' process group {who}")

    def _reduce(self, op, who):
        return cc.torch_reduce_op(op, self.size(), f"'xla' process group {who}")

    # --- collectives
    @_cpu_to_gloo
    def allreduce(self, tensors, opts=None):
        op, scale = self._reduce(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "allreduce")
        cc.all_reduce(op, tensors, scale=scale, groups=self._groups("allreduce"))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    @_cpu_to_gloo
    def allgather(self, output_lists, inputs, opts=None):
        groups = self._groups("allgather")
        with torch.no_grad():
            for outs, t in zip(output_lists, inputs):
                g = cc.all_gather(t.unsqueeze(0), 0, groups)
                for i, o in enumerate(outs):
                    o.copy_(g[i].reshape(o.shape))
        return _done(output_lists)

    @_cpu_to_gloo
    def _allgather_base(self, output, input, opts=None):  # noqa: A002
        with torch.no_grad():
            output.copy_(cc.all_gather(input, 0, self._groups("all_gather_into_tensor")).reshape(output.shape))
        return _done([output])

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        return self._allgather_base(output, input, opts)

    @_cpu_to_gloo
    def reduce_scatter(self, outputs, input_lists, opts=None):
        op, scale = self._reduce(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter")
        groups, n = self._groups("reduce_scatter"), self.size()
        with torch.no_grad():
            for o, ins in zip(outputs, input_lists):
                o.copy_(cc.reduce_scatter(op, torch.stack(list(ins)), scale, 0, n, groups)[0].reshape(o.shape))
        return _done(outputs)

    @_cpu_to_gloo
    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        op, scale = self._reduce(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, "reduce_scatter_tensor")
        groups, n = self._groups("reduce_scatter_tensor"), self.size()
        with torch.no_grad():
            flat = input.reshape(n, -1)
            output.copy_(cc.reduce_scatter(op, flat, scale, 0, n, groups).reshape(output.shape))
        return _done([output])

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        return self._reduce_scatter_base(output, input, opts)

    @_cpu_to_gloo
    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        groups = self._groups("broadcast")
        with torch.no_grad():
            for t in tensors:
                t.copy_(cc.all_gather(t.unsqueeze(0), 0, groups)[root])
        return _done(tensors)

    @_cpu_to_gloo
    def alltoall(self, outputs, inputs, opts=None):
        n = self.size()
        with torch.no_grad():
            r = cc.all_to_all(torch.stack(list(inputs)), 0, 0, n, self._groups("alltoall"))
            for i, o in enumerate(outputs):
                o.copy_(r[i].reshape(o.shape))
        return _done(outputs)

    @_cpu_to_gloo
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        n = self.size()
        for sizes in (output_split_sizes, input_split_sizes):
            if sizes and len(set(sizes)) > 1:
                raise NotImplementedError(f"'xla' process group all_to_all_single: uneven split sizes {list(sizes)} "
                                          f"(XLA's all_to_all splits evenly); pad to equal splits")
        with torch.no_grad():
            r = cc.all_to_all(input.reshape(n, -1), 0, 0, n, self._groups("all_to_all_single"))
            output.copy_(r.reshape(output.shape))
        return _done([output])

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    def barrier(self, opts=None):
        processes.barrier("torch.distributed.barrier")
        return _done([])

    def _rank_dependent(self, what):
        raise NotImplementedError(f"'xla' process group {what}: not supported on xla tensors (it needs a graph "
                                  f"that differs between ranks); use all_reduce/all_gather, or pass CPU tensors "
                                  f"(this group runs those on gloo)")

    @_cpu_to_gloo
    def reduce(self, *a, **k):
        self._rank_dependent("reduce")

    @_cpu_to_gloo
    def gather(self, *a, **k):
        self._rank_dependent("gather")

    @_cpu_to_gloo
    def scatter(self, *a, **k):
        self._rank_dependent("scatter")

    @_cpu_to_gloo
    def send(self, *a, **k):
        self._rank_dependent("send")

    @_cpu_to_gloo
    def recv(self, *a, **k):
        self._rank_dependent("recv")

    _gloos = 0  # gloo backends made in this process: the n-th one's keys in the store are its own

    def _gloo(self):
        """The group's gloo backend for CPU tensors, made at its first use
        (every rank reaches it at the same collective, so the count agrees),
        over the group's own store, under keys of its own (a group made again
        after destroy_process_group gets the same store prefix)."""
        if self._cpu is None:
            ProcessGroupXla._gloos += 1
            store = dist.PrefixStore(f"txc_cpu/{ProcessGroupXla._gloos}/", self.store)
            self._cpu = dist.ProcessGroupGloo(store, self.rank(), self.size(), self.timeout)
        return self._cpu


def _create(opts, backend_options=None):
    """The backend's creator (extended_api: torch's _DistributedBackendOptions):
    a ProcessGroupXla named as torch names the group (funcol resolves
    groups by name; torch does not name a group a creator returns)."""
    n, me = runtime.process_count(), runtime.process_index()
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    if opts.group_size > n:
        raise RuntimeError(f"init_process_group('xla'): world_size={opts.group_size} but the xla runtime has {n} "
                           f"process(es); start one process per rank (torchrun, torch_xla_core.launch)")
    if ranks[opts.group_rank] != me:
        raise RuntimeError(f"init_process_group('xla'): torch.distributed rank {ranks[opts.group_rank]} is process "
                           f"{me} of the xla runtime; the ranks must agree (init_method='xla://' takes them from it)")
    pg = ProcessGroupXla(opts.store, opts.group_rank, opts.group_size, opts.timeout)
    pg.ranks = ranks
    pg._set_group_name(opts.group_id)
    return pg


def _xla_rendezvous(url, timeout=timedelta(minutes=30), **kwargs):
    """init_method='xla://': rank and world size from the xla runtime; the
    store is torch's env:// one (MASTER_ADDR/MASTER_PORT, set by torchrun
    and torch_xla_core.launch), or a private one when run alone."""
    n, rank = runtime.process_count(), runtime.process_index()
    if n == 1:
        yield dist.HashStore(), 0, 1
        return
    yield from dist.rendezvous("env://", rank, n, timeout=timeout)


def _xla_mesh_init(init):
    """DeviceMesh.__init__, plus for an "xla" mesh what torch leaves out of
    it (it hands "xla" to torch_xla's SPMD): the dims' process groups
    (init_device_mesh("xla", ...), as for any device) and this rank and its
    coordinates (sub-meshes, from_group meshes too), once torch.distributed
    is initialized."""
    @functools.wraps(init)
    def __init__(self, device_type, *args, **kwargs):
        init(self, device_type, *args, **kwargs)
        if device_type != "xla" or getattr(self, "_coordinate_on_dim", None) is not None or not dist.is_initialized():
            return
        if kwargs.get("_init_backend", True):
            override = kwargs.get("backend_override") or ((None, None),) * len(self._layout)
            self._dim_group_names = self._init_process_groups(self._layout, self._rank_map, self._mesh_dim_names,
                                                              override)
            registry = (self._root_mesh or self)._pg_registry
            for name in self._dim_group_names:
                registry[name] = c10d._resolve_process_group(name)
        rank = kwargs.get("_rank")
        self._rank = dist.get_rank() if rank is None else rank
        self._coordinate_on_dim = self._compute_coordinate_on_dim()

    __init__.txc_xla_mesh = True
    return __init__


def install() -> None:
    """Registers the "xla" backend and the xla:// init method with
    torch.distributed, and completes DeviceMesh for "xla" (_xla_mesh_init)."""
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _create, extended_api=True, devices=["xla"])
    dist.register_rendezvous_handler("xla", _xla_rendezvous)
    if not getattr(DeviceMesh.__init__, "txc_xla_mesh", False):
        DeviceMesh.__init__ = _xla_mesh_init(DeviceMesh.__init__)
