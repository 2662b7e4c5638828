"""GSPMD sharding in torch_xla's names: a Mesh of xla devices with named
axes, mark_sharding(tensor, mesh, partition_spec) to lay a tensor out over
it, and XLA's SPMD partitioner does the rest (torch_xla_core/_execution/spmd.py).

    import torch_xla_core.sharding as xs
    mesh = xs.Mesh(range(8), (4, 2), ("data", "model"))
    xs.mark_sharding(model.fc.weight, mesh, (None, "model"))
    xs.mark_sharding(x, mesh, ("data", None))
    loss = model(x).sum(); loss.backward(); opt.step(); txc.sync()
    xs.get_sharding(model.fc.weight.grad)   # what the compiler chose

A partition spec has one entry per tensor dimension: an axis name or index
(that dimension is split over the axis), a tuple of them (split over their
product), or None (not split; replicated over the axes no dimension uses).
A dimension the axes do not divide is split unevenly, as torch_xla does:
the pieces are ceil(size / parts) long and the last ones are zero-padded
(local_shards shows the padded pieces; values and .cpu() are the tensor's).
Results computed from such a tensor come out replicated (XLA hands back
no uneven pieces as one buffer; mark_sharding them to lay them out again),
and its buffer is not donated.
A tensor holding device data is resharded at once (its buffer is laid out
on the mesh's devices, no full copy per device); a pending value gets an
annotation in the graph (a custom_call @Sharding, part of the graph's hash).
Sharded tensors are on xla:0, the mesh's virtual device, as in torch_xla;
outputs of a partitioned graph keep the shardings the compiler chose.
Annotations inside scan/scan_layers bodies count as ones outside do (a
body annotation alone partitions the graph). Kernels (call_jax,
flash_attention, multi_queries_paged_attention) run per shard given specs
(kernels/per_shard.py); set_global_mesh gives them a default mesh.
Devices: TXC_NUM_CPU_DEVICES=N gives the CPU platform N devices."""
import collections
import math

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from .. import _C
from . import spmd as _spmd
from .._tracing import tensor as _tensor
from .._runtime import dtypes as _dtypes, runtime
from .._tracing.tensor import XlaTensor, storage_buffer, whole_storage

__all__ = ["Mesh", "ShardingSpec", "mark_sharding", "get_sharding", "local_shards", "local_shard_values",
           "clear_sharding", "load_local_shards",
           "Shard", "set_global_mesh", "get_global_mesh"]

_global_mesh = None
_annotated = {}  # hash of an annotation node -> (Mesh, spec in axis names): what mark_sharding asked for


class Mesh:
    """A logical mesh of xla devices: device_ids (global device ordinals,
    each once: with one process the xla device indices; with several, all
    processes' devices in process order) laid out in mesh_shape, with one name per axis (default
    "axis0", "axis1", ...). A mesh may use a subset of the devices."""

    def __init__(self, device_ids, mesh_shape, axis_names=None):
        ids = [int(i) for i in (device_ids.tolist() if isinstance(device_ids, np.ndarray) else device_ids)]
        shape = tuple(int(s) for s in mesh_shape)
        if len(ids) != math.prod(shape):
            raise ValueError(f"Mesh: {len(ids)} device ids do not fill mesh_shape {shape} "
                             f"({math.prod(shape)} devices); give exactly prod(mesh_shape) ids")
        devs = runtime.global_devices()
        n = len(devs)
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ValueError(f"Mesh: device ids {bad} are not devices: this process has {n} xla devices "
                             f"(0..{n - 1}; TXC_NUM_CPU_DEVICES=N sets the CPU device count)")
        if len(set(ids)) != len(ids):
            raise ValueError(f"Mesh: device ids {ids} name a device twice")
        names = tuple(axis_names) if axis_names is not None else tuple(f"axis{i}" for i in range(len(shape)))
        if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(a, str) for a in names):
            raise ValueError(f"Mesh: axis_names {names} must be {len(shape)} distinct strings, one per mesh axis")
        self.device_ids = tuple(ids)
        self.mesh_shape = shape
        self.axis_names = names
        self._jax = jax.sharding.Mesh(np.array([devs[i] for i in ids], dtype=object).reshape(shape), names)

    def size(self) -> int:
        return len(self.device_ids)

    def shape(self) -> collections.OrderedDict:
        """Axis name -> size, in axis order (torch_xla's Mesh.shape())."""
        return collections.OrderedDict(zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return np.array(self.device_ids).reshape(self.mesh_shape)

    def op_sharding(self, partition_spec) -> str:
        """XLA's HloSharding text of the layout partition_spec gives a tensor
        of its rank over this mesh ('{devices=[4,1]<=[4]}')."""
        names = spec_names(self, partition_spec)
        _spmd.activate(self._jax)
        return _spmd.hlo_sharding(NamedSharding(self._jax, PartitionSpec(*names)), len(names))

    def __eq__(self, other):
        return isinstance(other, Mesh) and (self.device_ids, self.mesh_shape, self.axis_names) == (
            other.device_ids, other.mesh_shape, other.axis_names)

    def __hash__(self):
        return hash((self.device_ids, self.mesh_shape, self.axis_names))

    def __repr__(self):
        axes = ", ".join(f"{a}={s}" for a, s in zip(self.axis_names, self.mesh_shape))
        return f"Mesh({axes}; devices {list(self.device_ids)})"


class ShardingSpec(collections.namedtuple("ShardingSpec", "mesh partition_spec hlo")):
    """How a tensor lies on the devices: its mesh and partition spec (one
    entry per dimension: an axis name, a tuple of names, or None), and XLA's
    HloSharding text. mesh and partition_spec are None when the layout is no
    spec over a known mesh (then hlo still says it)."""


class Shard(collections.namedtuple("Shard", "device index shape")):
    """One device's piece of a tensor: its xla device index, the slices of the
    whole it holds, and its shape."""


def set_global_mesh(mesh: Mesh) -> None:
    """The mesh kernels use when given a partition_spec and no mesh (torch_xla's xs.set_global_mesh)."""
    global _global_mesh
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh: expected a torch_xla_core.sharding.Mesh, got {type(mesh).__name__}")
    _global_mesh = mesh


def get_global_mesh():
    """The mesh set_global_mesh set, or None."""
    return _global_mesh


def tensor_spec_names(mesh: Mesh, spec, t, op="mark_sharding") -> tuple:
    """The partition spec in axis names (a tuple of names or None per dim),
    checked; `op` names the caller in errors."""
    if not isinstance(spec, (tuple, list)):
        raise ValueError(f"{op}: partition_spec must be a tuple (one entry per dimension), got {spec!r}")
    if len(spec) != t.dim():
        raise ValueError(f"{op}: partition_spec {tuple(spec)} has {len(spec)} entries but the tensor has "
                         f"{t.dim()} dimensions {list(t.shape)}; give one entry per dimension (None: not split)")
    return spec_names(mesh, spec, op)


def spec_names(mesh: Mesh, spec, op="mark_sharding") -> tuple:
    """A partition spec (axis names or indices, tuples of them, None per
    dim) in axis names, checked."""
    used = set()
    out = []
    for d, e in enumerate(spec):
        if e is None:
            out.append(None)
            continue
        axes = e if isinstance(e, (tuple, list)) else (e,)
        names = []
        for a in axes:
            if isinstance(a, int) and not isinstance(a, bool):
                if not 0 <= a < len(mesh.axis_names):
                    raise ValueError(f"{op}: mesh axis index {a} (dim {d}) is not an axis of {mesh}")
                a = mesh.axis_names[a]
            if a not in mesh.axis_names:
                raise ValueError(f"{op}: unknown mesh axis {a!r} (dim {d}); {mesh} has axes "
                                 f"{list(mesh.axis_names)}")
            if a in used:
                raise ValueError(f"{op}: mesh axis {a!r} is used twice in {tuple(spec)}")
            used.add(a)
            names.append(a)
        out.append(names[0] if len(names) == 1 else tuple(names))
    return tuple(out)


def mark_sharding(t: torch.Tensor, mesh: Mesh, partition_spec) -> torch.Tensor:
    """Lays t out over mesh as partition_spec says (in place; returns t).
    Device data is resharded now; a pending value is annotated in the graph.
    A tensor already sharded is resharded (the new spec wins)."""
    if not isinstance(t, XlaTensor):
        raise ValueError(f"mark_sharding: expected an xla tensor, got a tensor on {t.device}; move it with "
                         f".to('xla') first")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mark_sharding: mesh must be a torch_xla_core.sharding.Mesh, got {type(mesh).__name__}")
    names = tensor_spec_names(mesh, partition_spec, t)
    lt = whole_storage(t)
    if lt is None:
        raise ValueError("mark_sharding: t is a view of part of another tensor; shard the tensor it views "
                         "(or a clone)")
    if _tensor.index_of(t) != 0:
        raise ValueError(f"mark_sharding: t is on {t.device}; sharded tensors live on xla:0 (the mesh's "
                         f"virtual device): move it with .to('xla:0')")
    ns = NamedSharding(mesh._jax, PartitionSpec(*names))
    _spmd.activate(mesh._jax)
    if lt.is_data:
        buf = _spmd.lay_out(_padded(lt.data, mesh, names), ns)
        lt.assign(_C.from_data(buf, _dtypes.code(t.dtype), list(t.shape), 0))
    else:
        lt.assign(annotated(lt, mesh, names))
    return t


def _padded(buf, mesh: Mesh, names: tuple):
    """buf, or its values zero-padded at the end of each dim that its mesh
    axes do not divide (to the next multiple): the last pieces of an uneven
    layout are padded, as XLA's partitioner lays such a value out. The
    tensor keeps its own shape; only its buffer is padded (.cpu() and
    clear_sharding take the tensor's part)."""
    shape = tuple(buf.shape)
    padded = tuple(_round_up(n, math.prod(mesh.shape()[a] for a in ((e,) if isinstance(e, str) else e)))
                   if e is not None else n for n, e in zip(shape, names))
    if padded == shape:
        return buf
    host = np.asarray(buf)
    return np.pad(host, [(0, p - n) for n, p in zip(shape, padded)])


def _round_up(n: int, parts: int) -> int:
    """n rounded up to a multiple of parts: the padded size of a dim split into parts pieces."""
    return -(-n // parts) * parts


def annotated(lt, mesh: Mesh, names: tuple):
    """A new LazyTensor: lt's value with a sharding annotation (checked
    spec in axis names); remembered for known_spec."""
    _spmd.activate(mesh._jax)
    hlo = _spmd.hlo_sharding(NamedSharding(mesh._jax, PartitionSpec(*names)), len(names))
    attrs = (hlo, list(mesh.device_ids), list(mesh.mesh_shape), ",".join(mesh.axis_names))
    out = _tensor.lazy_op(_tensor.OP.sharding, (lt,), attrs)
    if len(_annotated) > 4096:
        _annotated.clear()
    _annotated[out.hash] = (mesh, names)
    return out


def known_spec(t):
    """(Mesh, partition spec in axis names) of an xla tensor whose layout is
    known while tracing: device data laid out over a mesh, or a value
    mark_sharding annotated last; else None (a pending value's layout is
    chosen by the compiler later)."""
    lt = whole_storage(t) if isinstance(t, XlaTensor) else None
    if lt is None:
        return None
    if lt.is_data:
        s = lt.data.sharding if type(lt.data) is not tuple else None
        jm = getattr(s, "mesh", None)
        if s is None or len(s.device_set) == 1 or not hasattr(jm, "axis_names") or jm.axis_names == ("devices",):
            return None
        spec = tuple(s.spec) + (None,) * (t.dim() - len(s.spec))
        return _mesh_of(jm), spec
    if lt.op == "sharding":
        return _annotated.get(lt.hash)
    return None


def get_sharding(t: torch.Tensor):
    """How t lies on the devices (computing it first if pending): a
    ShardingSpec, or None when t is on one device."""
    buf = storage_buffer(t)
    s = buf.sharding
    if len(s.device_set) == 1:
        return None
    hlo = _spmd.hlo_sharding(s, buf.ndim)
    jm = getattr(s, "mesh", None)
    if jm is None or not hasattr(jm, "axis_names") or jm.axis_names == ("devices",):
        return ShardingSpec(None, None, hlo)
    mesh = _mesh_of(jm)
    spec = tuple(s.spec) + (None,) * (buf.ndim - len(s.spec))
    return ShardingSpec(mesh, spec, hlo)


def _mesh_of(jm) -> Mesh:
    m = Mesh.__new__(Mesh)
    devs = runtime.global_devices()
    m.device_ids = tuple(devs.index(d) for d in jm.devices.flat)
    m.mesh_shape = tuple(jm.devices.shape)
    m.axis_names = tuple(jm.axis_names)
    m._jax = jm
    return m


def local_shards(t: torch.Tensor) -> list:
    """t's pieces as they lie on this process's devices: Shard(device (its
    global ordinal), index, shape)."""
    buf = storage_buffer(t)
    devs = runtime.global_devices()
    return sorted((Shard(devs.index(s.device), s.index, tuple(s.data.shape)) for s in buf.addressable_shards),
                  key=lambda s: s.device)


def local_shard_values(t: torch.Tensor) -> list:
    """(Shard, its values as a CPU tensor) for each of t's pieces on this
    process's devices, in device order."""
    buf = storage_buffer(t)
    devs = runtime.global_devices()
    out = [(Shard(devs.index(s.device), s.index, tuple(s.data.shape)), runtime.to_host(s.data))
           for s in buf.addressable_shards]
    return sorted(out, key=lambda p: p[0].device)


def load_local_shards(t: torch.Tensor, values) -> torch.Tensor:
    """Replaces t's values, piece by piece: `values` holds one CPU tensor
    per piece on this process's devices, in local_shard_values's order and
    each of its piece's shape (the padded one, for the last pieces of an
    uneven layout). t keeps its layout; in place, returns t. Every process
    gives its own pieces. A tensor on one device, or replicated, has no
    pieces to load: RuntimeError, as a wrong count, shape or dtype."""
    buf = storage_buffer(t)
    if len(buf.sharding.device_set) == 1 or buf.sharding.is_fully_replicated:
        raise RuntimeError("load_local_shards: the tensor is not split over devices (on one device, or "
                           "replicated): copy the whole value in instead (t.copy_(value))")
    devs = runtime.global_devices()
    pieces = sorted(buf.addressable_shards, key=lambda s: devs.index(s.device))
    values = list(values)
    if len(values) != len(pieces):
        raise RuntimeError(f"load_local_shards: {len(values)} values given for the {len(pieces)} pieces on this "
                           f"process's devices: give one per piece, in local_shard_values's order")
    local = runtime.devices()
    arrays = []
    for i, (p, v) in enumerate(zip(pieces, values)):
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(p.data.shape) or v.dtype != t.dtype:
            got = f"{v.dtype} {list(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
            raise RuntimeError(f"load_local_shards: value {i} is {got}; its piece (device "
                               f"{devs.index(p.device)}) is {t.dtype} {list(p.data.shape)}")
        arrays.append(runtime.to_device(v.cpu(), local.index(p.device)))
    new = jax.make_array_from_single_device_arrays(buf.shape, buf.sharding, arrays)
    whole_storage(t).assign(_C.from_data(new, _dtypes.code(t.dtype), list(t.shape), 0))
    return t


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Gathers t onto xla:0 alone (no sharding); in place, returns t."""
    buf = storage_buffer(t)
    if len(buf.sharding.device_set) > 1:
        one = runtime.move(buf, 0) if tuple(buf.shape) == tuple(t.shape) else runtime.to_device(_tensor.to_cpu(t))
        whole_storage(t).assign(_C.from_data(one, _dtypes.code(t.dtype), list(t.shape), 0))
    return t
