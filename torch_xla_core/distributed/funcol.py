"""torch's functional collectives on xla tensors: handlers in our dispatch
table for the _c10d_functional ops (all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, all_to_all_single, broadcast, their in-place, out=
and coalesced variants, wait_tensor) and _dtensor::shard_dim_alltoall.
torch.distributed._functional_collectives, DTensor's redistribute and
FSDP2 call these; an xla tensor reaches them through __torch_dispatch__
(the Python key comes before any backend kernel), so each becomes a core
collective in the step's graph, and wait_tensor is the identity (the data
moves when the graph runs). Schemas differ across torch versions (the
group and the reduce op are str in 2.11, Any later): both a group name and
a ProcessGroup, both a str and a ReduceOp are taken."""
import torch

from .._ops import impl, impl_by_name
from . import collectives as cc

_F = torch.ops._c10d_functional


def _group(group, who, size=None):
    """(the replica groups, the size) of the process group (collectives.process_group);
    size: the caller's group_size, which must be the group's."""
    groups, n = cc.process_group(group, f"{who} on xla tensors")
    if size is not None and size != n:
        raise ValueError(f"{who}: group_size={size} but the group has {n} processes")
    return groups, n


def _all_reduce(t, op, group, who="all_reduce"):
    groups, n = _group(group, who)
    kind, scale = cc.torch_reduce_op(op, n, f"{who} on xla tensors")
    return cc.all_reduce(kind, t, scale=scale, groups=groups)


def _gather(t, group_size, group, who="all_gather_into_tensor"):
    return cc.all_gather(t, 0, _group(group, who, group_size)[0])


def _scatter(t, op, group_size, group, who="reduce_scatter_tensor"):
    groups, n = _group(group, who, group_size)
    return cc.reduce_scatter(*cc.torch_reduce_op(op, n, f"{who} on xla tensors"), 0, n, groups)


@impl(_F.all_reduce.default)
def all_reduce(t, reduce_op, group_name):
    return _all_reduce(t, reduce_op, group_name)


@impl(_F.all_reduce_.default)
def all_reduce_(t, reduce_op, group_name):
    with torch.no_grad():
        return t.copy_(_all_reduce(t, reduce_op, group_name))


@impl(_F.all_reduce_coalesced.default)
def all_reduce_coalesced(ts, reduce_op, group_name):
    return [_all_reduce(t, reduce_op, group_name) for t in ts]


@impl(_F.all_reduce_coalesced_.default)
def all_reduce_coalesced_(ts, reduce_op, group_name):
    return [all_reduce_(t, reduce_op, group_name) for t in ts]


@impl(_F.all_gather_into_tensor.default)
def all_gather_into_tensor(t, group_size, group_name):
    return _gather(t, group_size, group_name)


@impl(_F.all_gather_into_tensor_out.default)
def all_gather_into_tensor_out(t, group_size, group_name, *, out):
    with torch.no_grad():
        return out.copy_(_gather(t, group_size, group_name))


@impl(_F.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(ts, group_size, group_name):
    return [_gather(t, group_size, group_name) for t in ts]


@impl(_F.reduce_scatter_tensor.default)
def reduce_scatter_tensor(t, reduce_op, group_size, group_name):
    return _scatter(t, reduce_op, group_size, group_name)


@impl(_F.reduce_scatter_tensor_out.default)
def reduce_scatter_tensor_out(t, reduce_op, group_size, group_name, *, out):
    with torch.no_grad():
        return out.copy_(_scatter(t, reduce_op, group_size, group_name))


@impl(_F.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(ts, reduce_op, group_size, group_name):
    return [_scatter(t, reduce_op, group_size, group_name) for t in ts]


@impl(_F.all_to_all_single.default)
def all_to_all_single(t, output_split_sizes, input_split_sizes, group_name):
    groups, n = _group(group_name, "all_to_all_single")
    for sizes in (output_split_sizes, input_split_sizes):
        if sizes and len(set(int(s) for s in sizes)) > 1:
            raise NotImplementedError(f"all_to_all_single on xla tensors: uneven split sizes {list(sizes)} "
                                      f"(XLA's all_to_all splits evenly)")
    return cc.all_to_all(t, 0, 0, n, groups)


def _broadcast(t, src, group):
    return cc.all_gather(t.unsqueeze(0), 0, _group(group, "broadcast")[0])[src]


@impl(_F.broadcast.default)
def broadcast(t, src, group_name):
    return _broadcast(t, src, group_name)


@impl(_F.broadcast_.default)
def broadcast_(t, src, group_name):
    with torch.no_grad():
        return t.copy_(_broadcast(t, src, group_name))


@impl(_F.wait_tensor.default)
def wait_tensor(t):
    return t  # the collective is in the graph: nothing to wait for


@impl_by_name("_c10d_functional::wait_tensors")  # torch 2.15
def wait_tensors(ts):
    return list(ts)


@impl_by_name("_c10d_functional::_wrap_tensor_autograd")
def wrap_tensor_autograd(t):
    """funcol's wrapper of a result in an AsyncCollectiveTensor (a Python
    custom op, made when torch.distributed._functional_collectives loads):
    nothing is asynchronous here, so a copy (a custom op may not return its
    input; XLA elides the copy)."""
    return t.clone()


@impl(torch.ops._dtensor.shard_dim_alltoall.default)
def shard_dim_alltoall(t, gather_dim, shard_dim, group_name):
    """DTensor's Shard(gather_dim) -> Shard(shard_dim): one all_to_all."""
    groups, n = _group(group_name, "shard_dim_alltoall")
    return cc.all_to_all(t, shard_dim, gather_dim, n, groups)
