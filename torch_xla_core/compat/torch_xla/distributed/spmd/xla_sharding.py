"""torch_xla.distributed.spmd.xla_sharding over torch_xla_core.sharding:
Mesh (with get_op_sharding), HybridMesh, get_1d_mesh, mark_sharding
returning an XLAShardedTensor, mark_sharding_with_gradients,
clear_sharding, ShardingSpec for data loaders, the global mesh."""
import collections
import math

import numpy as np
import torch

from ....._features import patched_linear
from ....._execution import sharding
from ....._runtime import runtime
from .xla_sharded_tensor import ShardingType, XLAShardedTensor  # noqa: F401  (xs.ShardingType)


XLAPatchedLinear = patched_linear.XLAPatchedLinear  # nn.Linear as an einsum: sharded dims survive
xla_patched_nn_linear_forward = patched_linear.xla_patched_nn_linear_forward
apply_xla_patch_to_nn_linear = patched_linear.apply_xla_patch_to_nn_linear


class Mesh:
    """torch_xla's Mesh(device_ids, mesh_shape, axis_names=None) over every
    device (torch_xla requires all of them; torch_xla_core.sharding.Mesh
    also takes a subset): device_ids is an ndarray, axis_names may be None
    (partition specs then name axes by index). Checks raise AssertionError
    with torch_xla's messages."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        device_ids = np.asarray(device_ids)
        n = len(runtime.global_devices())
        assert n == len(device_ids), \
            f"Number of device IDs ({len(device_ids)}) must match the global number of devices ({n})"
        if axis_names is not None:
            assert len(mesh_shape) == len(axis_names), \
                f"Number of axis names ({len(axis_names)}) must match mesh dimensions ({len(mesh_shape)})"
            assert len(set(axis_names)) == len(axis_names), f"Axis names must be unique, got: {axis_names}"
        size = math.prod(mesh_shape)
        assert len(device_ids) == size, f"Number of device IDs ({len(device_ids)}) must match mesh size ({size})"
        assert len(np.unique(device_ids)) == len(device_ids), f"Device IDs must be unique, got: {device_ids}"
        assert all(0 <= d < size for d in device_ids.flat), \
            f"Device IDs must be less than mesh size ({size}), got: {device_ids}"
        self.device_ids, self.mesh_shape, self.axis_names = device_ids, tuple(mesh_shape), axis_names
        self.core = sharding.Mesh(device_ids.ravel().tolist(), mesh_shape, axis_names)

    def size(self) -> int:
        return math.prod(self.mesh_shape)

    def shape(self) -> collections.OrderedDict:
        """Axis name (index when unnamed) -> size."""
        keys = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return collections.OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str):
        if self.axis_names is None or name not in self.axis_names:
            return None
        return self.axis_names.index(name)

    def get_op_sharding(self, partition_spec) -> str:
        """The layout partition_spec gives a tensor of its rank, as XLA's
        HloSharding text ('{devices=[4,1]0,1,2,3}')."""
        return self.core.op_sharding(partition_spec)

    def __eq__(self, other):
        return isinstance(other, Mesh) and self.core == other.core

    def __hash__(self):
        return hash(self.core)

    def __str__(self):
        return (f"{{'device_ids': {self.device_ids.tolist()}, 'mesh_shape': {self.mesh_shape}, "
                f"'axis_names': {self.axis_names}}}")


class HybridMesh(Mesh):
    """A mesh of ici_mesh_shape devices per slice times dcn_mesh_shape slices
    (one slice here: the mesh is their elementwise product, devices in order)."""

    def __init__(self, *, ici_mesh_shape, dcn_mesh_shape=None, axis_names=None):
        dcn = tuple(dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici_mesh_shape)
        shape = tuple(i * d for i, d in zip(ici_mesh_shape, dcn))
        super().__init__(np.arange(math.prod(shape)), shape, axis_names)


def get_1d_mesh(axis_name: str = None) -> Mesh:
    """Every device in one axis."""
    n = len(runtime.global_devices())
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))


_global_mesh = None


def set_global_mesh(mesh: Mesh) -> None:
    """The mesh kernels default to (also txc.sharding's global mesh)."""
    global _global_mesh
    _global_mesh = mesh
    sharding.set_global_mesh(mesh.core if mesh is not None else None)


def get_global_mesh():
    """The mesh set_global_mesh() set, or None."""
    return _global_mesh


def _tensor_of(t):
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def wrap_as_sharded_tensor(t, mesh_shape=None, partition_spec=None) -> XLAShardedTensor:
    """t as an XLAShardedTensor (t itself if it is one)."""
    if isinstance(t, XLAShardedTensor):
        return t
    return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)


def wrap_if_sharded(x):
    """x as an XLAShardedTensor when it is an xla tensor laid out over several devices."""
    if isinstance(x, torch.Tensor) and x.device.type == "xla" and not isinstance(x, XLAShardedTensor) \
            and sharding.get_sharding(x) is not None:
        return XLAShardedTensor(x)
    return x


def mark_sharding(t, mesh: Mesh, partition_spec) -> XLAShardedTensor:
    """Lays t out over mesh as partition_spec says, in place; returns it as
    an XLAShardedTensor (its global_tensor is t)."""
    g = _tensor_of(t)
    if len(partition_spec) != g.dim():
        raise AssertionError(f"Partition spec length ({len(partition_spec)}) should be equal to the input rank "
                             f"({g.dim()}).")
    sharding.mark_sharding(g, mesh.core, tuple(partition_spec))
    return XLAShardedTensor(g, mesh_shape=mesh.mesh_shape, partition_spec=tuple(partition_spec))


def clear_sharding(t) -> torch.Tensor:
    """Gathers t onto one device; returns the plain tensor."""
    return sharding.clear_sharding(_tensor_of(t))


class MarkShardingFunction(torch.autograd.Function):
    """A copy of t laid out as partition_spec says, whose gradient is laid
    out the same way (mark_sharding_with_gradients)."""

    @staticmethod
    def forward(ctx, t, mesh, partition_spec):
        ctx.mesh, ctx.spec = mesh, partition_spec
        out = t.clone()
        sharding.mark_sharding(out, mesh.core, tuple(partition_spec))
        return out

    @staticmethod
    def backward(ctx, grad):
        g = grad.clone()
        sharding.mark_sharding(g, ctx.mesh.core, tuple(ctx.spec))
        return g, None, None


def mark_sharding_with_gradients(t, mesh: Mesh, partition_spec) -> torch.Tensor:
    """A new tensor equal to t, laid out as partition_spec says, and so is its
    gradient in the backward (t itself is not changed)."""
    if len(t.shape) != len(partition_spec):
        raise ValueError(f"mark_sharding_with_gradients: partition_spec {tuple(partition_spec)} has "
                         f"{len(partition_spec)} entries but the tensor has {t.dim()} dimensions")
    return MarkShardingFunction.apply(_tensor_of(t), mesh, tuple(partition_spec))


class ShardingSpec:
    """A mesh and partition spec that data loaders apply to each batch tensor
    (pl.MpDeviceLoader(loader, dev, input_sharding=ShardingSpec(mesh, spec)))."""

    def __init__(self, mesh: Mesh, partition_spec, minibatch: bool = False):
        """minibatch=True: each batch is this host's part of the global batch
        (dim 0); with one process that is the global batch, which must then
        split evenly over this process's devices (as torch_xla requires)."""
        if minibatch and runtime.process_count() > 1:
            raise NotImplementedError("ShardingSpec(minibatch=True) with several processes: per-process batches "
                                      "are not assembled into a global one here; give each process the global "
                                      "batch, or use torch.distributed with DDP")
        self.mesh, self.partition_spec, self.minibatch = mesh, tuple(partition_spec), minibatch

    def can_apply(self, t: torch.Tensor) -> bool:
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        if not self.can_apply(t):
            raise ValueError(f"ShardingSpec: partition_spec {self.partition_spec} does not fit a tensor of "
                             f"shape {list(t.shape)}")
        n = runtime.device_count()
        if self.minibatch and t.dim() and t.shape[0] % n:
            raise RuntimeError(f"When minibatch is configured, the per-host batch size must be divisible by local "
                               f"runtime device count. Per host input data shape = {list(t.shape)}, "
                               f"local_runtime_device_count = {n}")
        sharding.mark_sharding(t, self.mesh.core, self.partition_spec)
