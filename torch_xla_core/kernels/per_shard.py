"""Kernels run per shard under SPMD: call_jax(fn, ..., mesh=, in_specs=,
out_specs=) runs fn once per device on its shards, as jax.shard_map does
(and torch_xla's enable_manual_sharding / disable_manual_sharding around a
Pallas call). A Pallas kernel is a custom call XLA's partitioner cannot
split (on TPU it would gather its inputs onto every device); inside a
manual region each device runs it on its own block.

How: PerShard wraps the function in jax.shard_map, so jax's own lowering
writes the manual region into the call's StableHLO: each input goes
through a @Sharding custom call (its full layout) and
@SPMDFullToShardShape ({manual}), the kernel runs on shard shapes, and
each result comes back through @Sharding {manual} and
@SPMDShardToFullShape. call_jax lowers with GSPMD's annotations (not
Shardy's), the partitioner our compile uses (_execution/spmd.py). Gradients are
jax.vjp of the shard_map'd function, so an input replicated over an axis
its cotangent varies on is summed over that axis (jax's transpose rule).

Each tensor input also gets a sharding annotation node in our graph
(sharding.annotated) with its in_spec, so the graph is partitioned over
the mesh even when nothing else in it is sharded (executor key: _spmd.key_field).

Specs are torch_xla partition specs: a tuple with one entry per dimension
(an axis name, a tuple of names, or None); None for a whole input means
replicated. out_specs is one spec for every result, or a list of specs, one
per result in flattened order (a spec shorter than a result's rank leaves
the rest of its dims whole)."""
import math

import jax
from jax.sharding import PartitionSpec as P

from .._execution import sharding as xs
from .._tracing.tensor import index_of


class PerShard:
    """fn run per shard: fn(*args, **static) where `layout` marks the tensor
    positions among args; hashable (it keys call_jax's lowering cache)."""
    __slots__ = ("fn", "layout", "mesh", "in_specs", "out_specs", "per_result", "check_vma", "__qualname__")

    def __init__(self, fn, layout, mesh, in_specs, out_specs, per_result, check_vma=True):
        # out_specs: one spec per result (per_result) or one for all
        self.fn, self.layout, self.mesh = fn, tuple(layout), mesh
        self.in_specs, self.out_specs, self.per_result = tuple(in_specs), tuple(out_specs), bool(per_result)
        self.check_vma = bool(check_vma)
        self.__qualname__ = "per_shard(" + (getattr(fn, "__qualname__", None) or type(fn).__name__) + ")"

    def _key(self):
        return (self.fn, self.layout, self.mesh, self.in_specs, self.out_specs, self.per_result, self.check_vma)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, PerShard) and self._key() == other._key()

    def out_spec(self, k: int, ndim: int) -> tuple:
        """Result k's spec, padded to its rank."""
        s = self.out_specs[k] if self.per_result else self.out_specs
        return tuple(s) + (None,) * (ndim - len(s))

    def __call__(self, *full, **static):
        pos = [i for i, dyn in enumerate(self.layout) if dyn]
        tree = []

        def local(*arrays):
            args = list(full)
            for i, a in zip(pos, arrays):
                args[i] = a
            leaves, t = jax.tree_util.tree_flatten(self.fn(*args, **static))
            tree.append(t)
            return tuple(leaves)

        out_specs = tuple(P(*s) for s in self.out_specs) if self.per_result else P(*self.out_specs)
        # one spec for every result is a prefix of the result tuple
        mapped = jax.shard_map(local, mesh=self.mesh._jax, in_specs=tuple(P(*s) for s in self.in_specs),
                               out_specs=out_specs, check_vma=self.check_vma)
        leaves = mapped(*[full[i] for i in pos])
        return jax.tree_util.tree_unflatten(tree[-1], list(leaves))


def _spec(entry):
    """One spec entry list as a tuple of axis names / tuples / None."""
    return tuple(tuple(e) if isinstance(e, list) else e for e in entry)


def wrap(fn, fname, layout, tensors, mesh, in_specs, out_specs, check_vma=True) -> PerShard:
    """Checks call_jax's per-shard arguments (before anything is lowered) and
    returns the PerShard of fn; layout: per positional argument, whether it
    is a tensor."""
    mesh = mesh if mesh is not None else xs.get_global_mesh()
    if not isinstance(mesh, xs.Mesh):
        raise ValueError(f"call_jax({fname}): running per shard needs mesh= (a torch_xla_core.sharding.Mesh) or "
                         f"sharding.set_global_mesh(mesh); got {mesh!r}")
    if in_specs is None or out_specs is None:
        raise ValueError(f"call_jax({fname}): running per shard needs both in_specs= (one partition spec per tensor "
                         f"argument) and out_specs= (one spec, or a list of one per result)")
    if not isinstance(in_specs, (tuple, list)) or len(in_specs) != len(tensors):
        raise ValueError(f"call_jax({fname}): in_specs must hold one partition spec per tensor argument "
                         f"({len(tensors)}), got {in_specs!r}")
    off = [k for k, t in enumerate(tensors) if index_of(t) != 0]
    if off:
        raise ValueError(f"call_jax({fname}): tensor arguments {off} are not on xla:0; sharded values live on "
                         f"xla:0 (the mesh's virtual device): move them with .to('xla:0')")
    specs = []
    for k, (t, s) in enumerate(zip(tensors, in_specs)):
        try:
            specs.append((None,) * t.dim() if s is None else xs.tensor_spec_names(mesh, _spec(s), t, op=f"call_jax({fname})"))
            refuse_uneven(mesh, specs[-1], t.shape, f"call_jax({fname})")
        except ValueError as e:
            raise ValueError(f"{e} (in_specs[{k}], tensor argument {k} of shape {list(t.shape)})") from None
    if isinstance(out_specs, list):
        outs = tuple(_spec(s) for s in out_specs)
        flat = [n for s in outs for e in s if e is not None for n in (e if isinstance(e, tuple) else (e,))]
    else:
        outs = _spec(out_specs)
        flat = [n for e in outs if e is not None for n in (e if isinstance(e, tuple) else (e,))]
    bad = [a for a in flat if a not in mesh.axis_names]
    if bad:
        raise ValueError(f"call_jax({fname}): out_specs name unknown mesh axes {bad}; {mesh} has axes "
                         f"{list(mesh.axis_names)}")
    return PerShard(fn, layout, mesh, specs, outs, isinstance(out_specs, list), check_vma)


def refuse_uneven(mesh, spec, shape, op) -> None:
    """Refuses a spec that splits a dim of `shape` into unequal pieces: a
    layout may (sharding.py pads the last pieces), but a function run per
    shard sees every piece at one shape (jax.shard_map would refuse it while
    lowering, naming none of ours)."""
    for d, (n, e) in enumerate(zip(shape, spec)):
        parts = axis_size(mesh, e)
        if n % parts:
            raise ValueError(f"{op}: dim {d} of size {n} is not divisible by {parts} (mesh axes {e!r}): a function "
                             f"run per shard gets equal pieces; pad the dim to a multiple of {parts} or split it over "
                             f"axes that divide it")


def annotate(per_shard: PerShard, lts, specs):
    """LazyTensors of `lts` annotated with their full layouts `specs`."""
    return tuple(xs.annotated(lt, per_shard.mesh, tuple(s)) for lt, s in zip(lts, specs))


def axis_size(mesh, entry) -> int:
    """How many pieces a spec entry splits a dimension into."""
    if entry is None:
        return 1
    names = entry if isinstance(entry, tuple) else (entry,)
    return math.prod(mesh.shape()[a] for a in names)
