"""Collectives across processes on xla tensors, in torch_xla's names and
signatures (xm.all_reduce, all_gather, reduce_scatter, all_to_all,
collective_permute, reduce_gradients, optimizer_step). Each is one core op
(csrc/ops/collective.cpp) traced into the step's graph: no host round trip
and no sync of its own. A graph holding one runs as one replica per process
(executor Key.replicas), so replica ids are process ranks; `groups` is a
list of rank lists of equal size (None or []: every process).

pin_layout is accepted for torch_xla's signatures and has no effect: every
process compiles the same program, so layouts agree. Unlike torch_xla,
all_gather is a native all-gather (no all-reduce emulation)."""
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

from .._tracing import tensor as _tensor
from .._execution import executor
from .._runtime import runtime

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_TYPES = (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX)


def world_size() -> int:
    """The number of processes (replicas): 1 when run alone."""
    return runtime.process_count()


def groups_of(groups, who: str):
    """(the replica groups flattened, the group size) for `groups` (None or
    []: one group of every process); bad groups raise naming `who`."""
    n = world_size()
    if not groups:
        return tuple(range(n)), n
    groups = [list(g) for g in groups]
    size = len(groups[0])
    flat = [int(r) for g in groups for r in g]
    if size == 0 or any(len(g) != size for g in groups):
        raise ValueError(f"{who}: groups {groups} must be non-empty lists of equal size (torch_xla's rule)")
    if sorted(flat) != list(range(n)):
        raise ValueError(f"{who}: groups {groups} must hold each of the {n} process ranks 0..{n - 1} exactly once")
    return tuple(flat), size


def subgroup(ranks, who: str):
    """The `groups` argument for a collective over the processes `ranks`
    (a torch.distributed group, in its rank order): None for every process;
    else `ranks` as one replica group and the other processes, in rank
    order, as groups of the same size. Each process compiles the program it
    traced and only the group's members run this collective, so the members
    need only agree on it, and they do: it depends on `ranks` alone. The
    fill mirrors torch's sibling groups (DeviceMesh's dims, new_subgroups), so
    siblings compile one program. A group whose size does not divide the
    world's raises (XLA's replica groups are of one size)."""
    n = world_size()
    ranks = [int(r) for r in ranks]
    if ranks == list(range(n)):
        return None
    k, members = len(ranks), set(ranks)
    if n % k:
        raise NotImplementedError(f"{who}: a process group of ranks {ranks} on {n} processes; xla collectives on a "
                                  f"sub-group need its size to divide the world size (XLA's replica groups are of "
                                  f"equal size). Use a group of {[d for d in range(1, n + 1) if n % d == 0]} ranks, "
                                  f"or a 'gloo' group for CPU tensors")
    rest = [r for r in range(n) if r not in members]
    return sorted([ranks] + [rest[i:i + k] for i in range(0, len(rest), k)], key=min)


def process_group(group, who: str):
    """(the `groups` argument, the group size) of a torch.distributed process
    group (a ProcessGroup or the name funcol passes; None: the world)."""
    if group is None:
        group = dist.group.WORLD
    pg = group if isinstance(group, dist.ProcessGroup) else c10d._resolve_process_group(group)
    ranks = dist.get_process_group_ranks(pg)
    return subgroup(ranks, who), len(ranks)


# torch's reduce ops: (the name funcol's schemas pass, the ReduceOp, the core reduction, whether it averages)
_TORCH_REDUCE = (("sum", dist.ReduceOp.SUM, REDUCE_SUM, False), ("avg", dist.ReduceOp.AVG, REDUCE_SUM, True),
                 ("product", dist.ReduceOp.PRODUCT, REDUCE_MUL, False), ("min", dist.ReduceOp.MIN, REDUCE_MIN, False),
                 ("max", dist.ReduceOp.MAX, REDUCE_MAX, False), ("band", dist.ReduceOp.BAND, REDUCE_AND, False),
                 ("bor", dist.ReduceOp.BOR, REDUCE_OR, False))


def torch_reduce_op(op, n: int, who: str):
    """(the core reduction, the scale of its result) for torch's reduce op
    `op` over n processes (avg: a sum scaled by 1/n): a dist.ReduceOp (or
    its RedOpType), or its name as funcol's schemas pass it ("sum",
    "ReduceOp.AVG", ...)."""
    for name, known, kind, mean in _TORCH_REDUCE:
        # (a ReduceOp compares equal to its RedOpType but does not hash as one)
        if (op.lower().rsplit(".", 1)[-1] == name) if isinstance(op, str) else op == known:
            return kind, 1.0 / n if mean else 1.0
    raise NotImplementedError(f"{who}: reduce op {getattr(op, 'op', op)} is not supported "
                              f"({', '.join(r[0] for r in _TORCH_REDUCE)} are)")


def _xla(t, who: str):
    if not isinstance(t, _tensor.XlaTensor):
        raise TypeError(f"{who}: expected an xla tensor, got a {type(t).__name__} on "
                        f"{getattr(t, 'device', 'no device')}; move it with .to('xla') first")
    return t


def _reduce_type(reduce_type, who: str) -> str:
    if reduce_type not in _REDUCE_TYPES:
        raise ValueError(f"{who}: unknown reduce type {reduce_type!r}; use one of {_REDUCE_TYPES}")
    return reduce_type


def collective(op: str, t, attrs, who: str):
    """The core collective `op` of xla tensor t (a new tensor, no autograd)."""
    _xla(t, who)
    executor.use_collectives()
    return _tensor.op(op, t._lt, attrs=tuple(attrs))


def _reduced(reduce_type, t, scale, flat, size, who):
    r = collective("all_reduce", t, (reduce_type, flat, size), who)
    return r if scale == 1.0 else r * scale


def all_reduce(reduce_type, inputs, scale=1.0, groups=None, pin_layout=True):
    """Reduces across the processes of each group, then multiplies by
    `scale`. A tensor gives a new tensor; a list is reduced in place (one
    collective per dtype: the tensors are flattened into one buffer) and
    returned."""
    who = "all_reduce"
    reduce_type = _reduce_type(reduce_type, who)
    flat, size = groups_of(groups, who)
    if isinstance(inputs, torch.Tensor):
        return _reduced(reduce_type, inputs, scale, flat, size, who)
    by_dtype = {}
    for t in inputs:
        by_dtype.setdefault(_xla(t, who).dtype, []).append(t)
    with torch.no_grad():
        for ts in by_dtype.values():
            if len(ts) == 1:
                ts[0].copy_(_reduced(reduce_type, ts[0], scale, flat, size, who))
                continue
            joined = _reduced(reduce_type, torch.cat([t.reshape(-1) for t in ts]), scale, flat, size, who)
            for t, part in zip(ts, joined.split([t.numel() for t in ts])):
                t.copy_(part.view(t.shape))
    return inputs


def all_gather(value, dim=0, groups=None, output=None, pin_layout=True):
    """The values of the group's processes concatenated along `dim` (a 0-d
    value: stacked); into `output` when given."""
    who = "all_gather"
    flat, size = groups_of(groups, who)
    if _xla(value, who).dim() == 0:
        value = value.reshape(1)
    r = collective("all_gather", value, (dim, flat, size), who)
    if output is not None:
        with torch.no_grad():
            output.copy_(r)
        return output
    return r


def reduce_scatter(reduce_type, input, scale, scatter_dim, shard_count, groups=None, output=None,  # noqa: A002
                   pin_layout=True):
    """Reduces across the group, then each process keeps its shard (its rank
    within the group) of `scatter_dim`, times `scale`. A list of inputs is
    reduced tensor by tensor (a list back; into `output`'s tensors when
    given)."""
    who = "reduce_scatter"
    reduce_type = _reduce_type(reduce_type, who)
    flat, size = groups_of(groups, who)
    if shard_count != size:
        raise ValueError(f"{who}: shard_count={shard_count} but the groups have {size} processes each")
    if isinstance(input, (list, tuple)):
        outs = [reduce_scatter(reduce_type, t, scale, scatter_dim, shard_count, groups) for t in input]
        if output is None:
            return outs
        with torch.no_grad():
            for o, r in zip(output, outs):
                o.copy_(r)
        return output
    r = collective("reduce_scatter", input, (reduce_type, scatter_dim, flat, size), who)
    if scale != 1.0:
        r = r * scale
    if output is not None:
        with torch.no_grad():
            output.copy_(r)
        return output
    return r


def all_to_all(value, split_dimension, concat_dimension, split_count, groups=None, pin_layout=True):
    """Splits `split_dimension` into split_count chunks, sends chunk i to the
    group's i-th process and concatenates what arrives along
    `concat_dimension`."""
    who = "all_to_all"
    flat, size = groups_of(groups, who)
    if split_count != size:
        raise ValueError(f"{who}: split_count={split_count} but the groups have {size} processes each")
    return collective("all_to_all", value, (split_dimension, concat_dimension, flat, size), who)


def collective_permute(value, pairs):
    """Sends `value` from each pair's source rank to its target rank; a rank
    no pair targets receives zeros."""
    who = "collective_permute"
    n = world_size()
    flat = tuple(int(r) for p in pairs for r in p)
    if any(len(p) != 2 for p in pairs) or any(not 0 <= r < n for r in flat):
        raise ValueError(f"{who}: pairs {pairs} must be [source, target] rank pairs within 0..{n - 1}")
    return collective("collective_permute", value, (flat,), who)


def reduce_gradients(optimizer, groups=None, pin_layout=True):
    """The mean of each gradient across the processes of its group, in
    place (one all-reduce per dtype). With one process: nothing to do.
    torch_xla scales by the world size even with groups; here the mean is
    over the group."""
    size = groups_of(groups, "reduce_gradients")[1]
    if size == 1:
        return
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if grads:
        all_reduce(REDUCE_SUM, grads, scale=1.0 / size, groups=groups)


def optimizer_step(optimizer, barrier=False, optimizer_args=None, groups=None, pin_layout=True):
    """torch_xla's xm.optimizer_step: reduce_gradients (the mean across
    processes), then optimizer.step(**optimizer_args); with barrier=True
    the step's graph then runs (sync). Returns step's value. As in
    torch_xla the default is no barrier: txc.data.DeviceLoader syncs at
    each batch; in a loop of your own pass barrier=True (or call sync())."""
    reduce_gradients(optimizer, groups=groups)
    r = optimizer.step(**(optimizer_args or {}))
    if barrier:
        _tensor.sync_lazy(None)
    return r


def device_mesh(group=None, mesh=None, *, mesh_dim_names=None):
    """A DeviceMesh of xla devices over a process group of the "xla"
    backend (default: the world) or a list of groups, one per dim (then
    `mesh` and `mesh_dim_names` as torch asks): DeviceMesh.from_group(group,
    "xla", ...). torch's init_device_mesh("xla", shape) works as well
    (backend._xla_mesh_init)."""
    return DeviceMesh.from_group(group or dist.group.WORLD, "xla", mesh, mesh_dim_names=mesh_dim_names)


def distribute_tensor(tensor, device_mesh, placements=None, *, src_data_rank=0):
    """torch.distributed.tensor.distribute_tensor for a mesh of xla devices
    (device_mesh()): torch sends any "xla" mesh to
    torch_xla's SPMD (an ImportError without it), so this does torch's
    generic work, in the graph: src_data_rank's tensor goes to every process
    (None: each keeps its own), each Shard(d) keeps this process's chunk, and
    the DTensor is made with DTensor.from_local. Partial placements raise,
    as in torch."""
    from torch.distributed.tensor import DTensor, Replicate  # lazy: DTensor's import costs ~1 s
    placements = list(placements) if placements is not None else [Replicate()] * device_mesh.ndim
    local = _xla(tensor, "distribute_tensor").detach()
    if src_data_rank is not None:
        local = all_gather(local.unsqueeze(0))[src_data_rank]
    for i, p in enumerate(placements):
        if p.is_partial():
            raise ValueError(f"distribute_tensor: placement {p} (Partial) is not allowed, as in torch")
        if p.is_shard():
            chunks = local.chunk(device_mesh.size(i), dim=p.dim)
            k = device_mesh.get_local_rank(i)
            local = chunks[k] if k < len(chunks) else local.narrow(p.dim, 0, 0)
    local = local.contiguous()
    return DTensor.from_local(local, device_mesh, placements, run_check=False, shape=tensor.shape,
                              stride=tensor.stride()).requires_grad_(tensor.requires_grad)
