"""SPMD machinery of the executor (the user API is sharding.py): what a
graph partitioned over a mesh adds to a sync, as one field of the cache key
(Spmd) and four steps:

- key_field(cut): a graph is partitioned when a parameter is a buffer laid
  out over several devices or the graph holds a sharding annotation (core
  op "sharding", scan bodies included); the key then holds the mesh's device assignment and each
  parameter's sharding (XLA HloSharding text; "{replicated}" for one that is
  not sharded). All sharded values of one graph must use the same devices in
  the same order.
- lowering: the emitter writes mhlo.num_partitions and mhlo.sharding on
  @main's arguments (csrc/lower/emitter.cpp); results carry none, so XLA's
  SPMD partitioner chooses their shardings (propagation).
- compile(text, key): GSPMD (use_spmd_partitioning, not Shardy: the text
  carries mhlo.sharding) over the mesh's devices, with output shardings left
  to propagation, except a donated parameter's output, which must lie as
  its parameter does (XLA aliases the two buffers on every device):
  pin_aliased_outputs gives those results their parameter's mhlo.sharding.
  deserialize(data, text, key) loads a persistent-cache entry with the same
  options. This module and runtime.py are the two that touch jaxlib's
  compile API. check_partitioned refuses sharding custom calls in a graph
  that is not partitioned (ones a call_jax function emits by itself).
- bind/execute: inputs go in as global arrays laid out on the mesh (a buffer
  on one device is replicated once per sync; Python numbers once per value),
  execute_sharded runs every partition, and each output becomes one global
  jax array over the mesh with the sharding the compiler chose (a
  NamedSharding of the graph's mesh where it is one), so a tensor stays one
  logical value and .cpu() gathers it.

Donation works as on one device: a donated parameter's output aliases its
buffer on every device (the alias bytes of the compiled statistics are
per device)."""
import collections
import re
import time

import jax
import numpy as np
from jax._src import config
from jax._src import sharding_impls as si
from jax._src.lib import xla_client as xc
from jax.sharding import NamedSharding, PartitionSpec

from .. import metrics
from .._runtime import runtime

active = False   # set by sharding.mark_sharding: only then are parameters inspected

_REPLICATED = "{replicated}"
_meshes = {}     # device ids -> the jax Mesh last used over them (output shardings are read against it)
_replicated = {}  # (id(buffer), device ids) -> (buffer, its replicated copy): Python numbers
_out = {}        # executor Key -> output shardings of its executable


class Spmd(collections.namedtuple("Spmd", "device_ids params")):
    """Key.spmd: the mesh's device assignment (PJRT device ids, in the mesh's
    order; with several processes they span all of them) and each
    parameter's sharding (HloSharding text)."""


def activate(jmesh) -> None:
    global active
    active = True
    _meshes.setdefault(_ids(jmesh), jmesh)


def _ids(jmesh) -> tuple:
    return tuple(int(d.id) for d in jmesh.devices.flat)


def gspmd_lowering():
    """A context in which jax lowers shardings as GSPMD's mhlo.sharding
    annotations (not Shardy's sdy dialect): what compile() partitions.
    call_jax lowers under it (a shard_map'd kernel, kernels/per_shard.py)."""
    return config.use_shardy_partitioner(False)


def hlo_sharding(sharding, ndim: int) -> str:
    """The HloSharding text of a jax sharding for a value of rank ndim."""
    return str(sharding._to_xla_hlo_sharding(ndim))


def _spread(buf) -> bool:
    return type(buf) is not tuple and len(buf.sharding.device_set) > 1


def key_field(cut):
    """Key.spmd for a cut: None when nothing in it is sharded."""
    params = cut.params()
    ids = None
    shardings = []
    for p in params:
        if _spread(p):
            s = p.sharding
            mesh_ids = _ids(s.mesh) if hasattr(s, "mesh") else tuple(int(d.id) for d in s._device_assignment)
            ids = _same(ids, mesh_ids)
            shardings.append(hlo_sharding(s, p.ndim))
        else:
            shardings.append(_REPLICATED)
    annotations = cut.annotations()
    if annotations:
        devs = runtime.global_devices()
        for _, mesh_ids, _, _ in annotations:  # a Mesh's device ids are ordinals; the key holds PJRT ids
            ids = _same(ids, tuple(int(devs[i].id) for i in mesh_ids))
    if ids is None:
        return None
    return Spmd(ids, tuple(shardings))


class UnpartitionedAnnotation(RuntimeError):
    """A sharding annotation in a graph that is not partitioned (see check_partitioned)."""


def check_partitioned(key, text: str) -> None:
    """A graph whose text holds a sharding custom call must be partitioned.
    key_field sees every annotation node, scan bodies' included
    (csrc/trace/graph.cpp GraphCut::annotations), and per-shard kernels
    annotate their inputs, so what is left is a call_jax function that emits
    shardings itself (jax.lax.with_sharding_constraint, its own shard_map)
    in a graph with no sharded input: refused rather than run on one device
    unsharded (the pending tensors stay pending)."""
    if key.spmd is None and ('call_target_name = "Sharding"' in text or "custom_call @Sharding(" in text):
        raise UnpartitionedAnnotation("this graph holds sharding annotations that no sharded input or "
                                      "mark_sharding explains (a call_jax function that shards by itself?), so "
                                      "it is not partitioned and they would be ignored. Shard an input with "
                                      "torch_xla_core.sharding.mark_sharding, or give call_jax mesh=/in_specs=/"
                                      "out_specs= to run the function per shard.")


def _same(ids, other):
    if ids is not None and ids != other:
        raise RuntimeError(f"one graph uses sharded tensors on two different meshes (devices {list(ids)} and "
                           f"{list(other)}): XLA partitions a graph over one device assignment. Reshard the "
                           f"tensors onto one mesh with torch_xla_core.sharding.mark_sharding.")
    return other


def _jmesh(spmd: Spmd):
    m = _meshes.get(spmd.device_ids)
    if m is None:  # a sharded value whose mesh we did not make (a positional sharding)
        m = jax.sharding.Mesh(np.array(_devices(spmd.device_ids), dtype=object), ("devices",))
        _meshes[spmd.device_ids] = m
    return m


def _devices(ids) -> list:
    by_id = {d.id: d for d in runtime.global_devices()}
    return [by_id[i] for i in ids]


def lay_out(buf, sharding):
    """A buffer (on one device, or laid out otherwise) laid out as `sharding`,
    which may span other processes' devices: each process then supplies its
    own devices' pieces of its copy of the value."""
    with jax.enable_x64(True):
        if sharding.is_fully_addressable:
            return jax.device_put(buf, sharding)
        host = np.asarray(buf)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


_MAIN = re.compile(r"^(\s*func\.func public @main\()(.*)(\) -> \()(.*)(\) \{)$", re.MULTILINE)
_ALIASED_ARG = re.compile(r'tf\.aliasing_output = (\d+) : i32, mhlo\.sharding = ("[^"]*")')


def _top_level_split(s: str) -> list:
    """s split at the commas outside <>, {} and quotes."""
    out, depth, quoted, start = [], 0, False, 0
    for i, c in enumerate(s):
        if c == '"':
            quoted = not quoted
        elif not quoted and c in "<{":
            depth += 1
        elif not quoted and c in ">}":
            depth -= 1
        elif not quoted and depth == 0 and c == ",":
            out.append(s[start:i].strip())
            start = i + 1
    out.append(s[start:].strip())
    return out


_ARG_DIMS = re.compile(r"tensor<((?:\d+x)*)[a-z]")
_TILES = re.compile(r'"\{devices=\[([\d,]+)\]')
_ALIAS_ATTR = re.compile(r"tf\.aliasing_output = \d+ : i32, ")


def _unalias_uneven(text: str) -> str:
    """@main without the donation of parameters laid out unevenly (a dim
    their mesh axes do not divide: padded buffers, sharding.py): XLA would
    have to lay the aliased result out unevenly too, which it cannot hand
    back as one buffer (and aborts serializing such an executable)."""
    m = _MAIN.search(text)
    if m is None or "tf.aliasing_output" not in m.group(2):
        return text
    args = _top_level_split(m.group(2))
    changed = False
    for i, a in enumerate(args):
        d, t = _ARG_DIMS.search(a), _TILES.search(a)
        if "tf.aliasing_output" not in a or d is None or t is None:
            continue
        dims = [int(x) for x in d.group(1).split("x") if x]
        tiles = [int(x) for x in t.group(1).split(",")]
        if any(n % k for n, k in zip(dims, tiles)):
            args[i] = _ALIAS_ATTR.sub("", a)
            changed = True
    if not changed:
        return text
    return text[:m.start(2)] + ", ".join(args) + text[m.end(2):]


def pin_aliased_outputs(text: str):
    """@main's results that alias a donated parameter get that parameter's
    mhlo.sharding (propagation may choose another layout for them, and XLA
    then refuses the alias: the two buffers differ in size per device).
    Returns the text and, per result, whether propagation chooses its
    sharding ([True]: all do)."""
    text = _unalias_uneven(text)
    m = _MAIN.search(text)
    if m is None:
        return text, [True]
    pinned = {int(k): s for k, s in _ALIASED_ARG.findall(m.group(2))}
    if not pinned:
        return text, [True]
    results = _top_level_split(m.group(4))
    for k, s in pinned.items():
        r = results[k]
        results[k] = (r[:-1] + f", mhlo.sharding = {s}}}") if r.endswith("}") else f"{r} {{mhlo.sharding = {s}}}"
    propagate = [k not in pinned for k in range(len(results))]
    return text[:m.start(4)] + ", ".join(results) + text[m.end(4):], propagate


OPTIONS = ("spmd: GSPMD partitioning (not Shardy), 1 replica x N partitions over the key's devices, output "
           "shardings propagated except donated results")  # part of the persistent cache's key


def _options(text: str, key):
    """The compile options of a partitioned graph and its text with donated
    results pinned (pin_aliased_outputs)."""
    text, propagate = pin_aliased_outputs(text)
    ids = key.spmd.device_ids
    opts = xc.CompileOptions()
    opts.num_replicas = 1
    opts.num_partitions = len(ids)
    build = opts.executable_build_options
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = False  # the text carries GSPMD's mhlo.sharding
    build.allow_spmd_sharding_propagation_to_output = propagate
    opts.device_assignment = xc.DeviceAssignment.create(np.array(ids, dtype=np.int64).reshape(1, len(ids)))
    return text, opts


def compile(text: str, key):
    """Compiles a partitioned graph over key.spmd's devices (runtime.compile_on)."""
    text, opts = _options(text, key)
    return runtime.compile_on(text, _devices(key.spmd.device_ids), opts)


def deserialize(data: bytes, text: str, key):
    """The executable that runtime.serialize() wrote for this partitioned
    graph (the persistent compile cache), loaded onto key.spmd's devices
    with the options compile() used."""
    _, opts = _options(text, key)
    return runtime.deserialize_on(data, _devices(key.spmd.device_ids), opts)


def bind(spmd: Spmd, params: list) -> list:
    """The parameters as global arrays on the mesh: a buffer on one device
    is replicated over the mesh (a Python number's copy is kept)."""
    rep = None
    out = []
    for p, s in zip(params, spmd.params):
        if s == _REPLICATED and len(p.sharding.device_set) == 1:
            k = (id(p), spmd.device_ids)
            hit = _replicated.get(k)
            if hit is not None and hit[0] is p:
                p = hit[1]
            else:
                if rep is None:
                    rep = NamedSharding(_jmesh(spmd), PartitionSpec())
                r = lay_out(p, rep)
                metrics.counter_add("spmd_replicate_input")
                if p.ndim == 0:  # Python numbers (runtime.scalar's cached buffers)
                    if len(_replicated) > 4096:
                        _replicated.clear()
                    _replicated[k] = (p, r)
                p = r
        out.append(p)
    return out


def _out_shardings(exe, key) -> list:
    """The output shardings of the executable of an executor Key, as jax
    shardings over its mesh (kept per key, not per Spmd: two graphs with the
    same inputs may lay out their outputs differently)."""
    r = _out.get(key)
    if r is not None:
        return r
    jmesh = _jmesh(key.spmd)
    devs = tuple(jmesh.devices.flat)
    r = []
    for o in exe.get_output_shardings():
        g = si.GSPMDSharding(devs, o)
        try:
            r.append(si._gspmd_to_named_sharding_via_mesh(g, jmesh))
        except Exception:  # not expressible over the mesh's axes: keep XLA's own
            r.append(g)
    if len(_out) > 4096:
        _out.clear()
    _out[key] = r
    return r


def launch(exe, key, params: list, specs: list):
    """Starts the partitioned executable of an executor Key: (its outputs as
    global arrays, the launch's start time for runtime.wait_ready)."""
    t0 = time.perf_counter()
    res = exe.execute_sharded(params)
    parts = res.disassemble_into_single_device_arrays()
    shardings = _out_shardings(exe, key)
    with jax.enable_x64(True):
        outs = [jax.make_array_from_single_device_arrays(tuple(dims), s, arrs)
                for (code, dims), s, arrs in zip(specs, shardings, parts)]
    metrics.timer_add("execute_launch", time.perf_counter() - t0)
    return outs, t0

