"""torch_xla's XLAShardedTensor: what mark_sharding returns, a tensor that
computes as the sharded xla tensor it wraps (global_tensor) and tells how
it is laid out (sharding_spec, sharding_type, local_shards)."""
import collections
import dataclasses
import enum

import torch
import torch.utils._pytree as pytree

from ....._execution import sharding


class ShardingType(enum.IntEnum):
    """torch_xla's kinds of layout (XLA's OpSharding types)."""
    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6

    @classmethod
    def of(cls, hlo: str) -> "ShardingType":
        """The type of an HloSharding text ('' or '{replicated}': REPLICATED)."""
        if not hlo or "replicated}" in hlo and "devices=" not in hlo:
            return cls.REPLICATED
        if "manual" in hlo:
            return cls.MANUAL
        if "maximal" in hlo:
            return cls.MAXIMAL
        if "last_tile_dim_replicate" in hlo or "last_tile_dims" in hlo:
            return cls.PARTIAL
        return cls.TILED if "devices=" in hlo else cls.UNKNOWN


@dataclasses.dataclass
class XLAShard:
    """One device's piece: its values on the CPU (`data`, which the user may
    change or replace before load_local_shards_), the slices of the whole it
    holds (`indices`: a list of slices, Ellipsis when it holds all of it),
    the device ('xla:i') and which replica of that piece it is."""
    data: torch.Tensor
    indices: object
    shard_device: str
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        if self.indices is Ellipsis:
            return self.data
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.indices)]


class XLAShardedTensor(torch.Tensor):
    """A sharded xla tensor (global_tensor) as torch_xla's mark_sharding
    returns it: ops on it run on global_tensor and give XLAShardedTensors."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape=None, partition_spec=None):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.size(), strides=elem.stride(),
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                layout=elem.layout, device=elem.device,
                                                requires_grad=elem.requires_grad)
        r.global_tensor = elem
        r.mesh_shape = mesh_shape
        r.partition_spec = partition_spec
        return r

    @property
    def sharding_spec(self) -> str:
        """XLA's HloSharding text ('{devices=[1,4]0,1,2,3}'), '' when on one device."""
        s = sharding.get_sharding(self.global_tensor)
        return s.hlo if s is not None else ""

    @property
    def sharding_type(self):
        return ShardingType.of(self.sharding_spec)

    @property
    def local_shards(self) -> list:
        """This process's pieces, one per device (torch_xla's XLAShard)."""
        pieces = sharding.local_shard_values(self.global_tensor)
        counts = collections.Counter()
        out = []
        for shard, data in pieces:
            idx = tuple(shard.index)
            full = all(sl.start in (None, 0) and sl.stop in (None, n)
                       for sl, n in zip(idx, self.global_tensor.shape))
            # a padded piece of an uneven layout holds the part of the tensor inside its bounds
            indices = Ellipsis if full else [slice(min(sl.start or 0, n), n if sl.stop is None else min(sl.stop, n), 1)
                                             for sl, n in zip(idx, self.global_tensor.shape)]
            key = repr(indices)
            out.append(XLAShard(data, indices, f"xla:{shard.device}", counts[key]))
            counts[key] += 1
        return out

    def load_local_shards_(self, shards) -> None:
        """Loads this process's pieces (local_shards, their data changed) into
        the tensor, in place; the layout stays. RuntimeError for a missing
        piece, a wrong shape, or a replicated tensor (as torch_xla)."""
        sharding.load_local_shards(self.global_tensor, [s.data for s in shards])

    def __repr__(self, *, tensor_contents=None):
        return f"XLAShardedTensor({self.global_tensor!r})"

    # Ops run on global_tensor at the torch-function level (before autograd
    # and dispatch): autograd records them on the xla tensors themselves,
    # and xla tensors never see a wrapper among their operands.
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map(_unwrap, (args, kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        return pytree.tree_map(_wrap, out)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        args, kwargs = pytree.tree_map(_unwrap, (args, kwargs or {}))
        return pytree.tree_map(_wrap, func(*args, **kwargs))


def _unwrap(x):
    return x.global_tensor if isinstance(x, XLAShardedTensor) else x


def _wrap(x):
    return XLAShardedTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, XLAShardedTensor) \
        and x.device.type == "xla" else x
