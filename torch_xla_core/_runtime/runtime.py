"""The PJRT runtime, through jaxlib: picks the platform (PJRT_DEVICE =
CPU | CUDA | TPU, default the best available; TXC_NUM_CPU_DEVICES=N gives
the CPU platform N devices, xla:0 .. xla:N-1, read when the runtime starts,
i.e. at the first xla op), compiles StableHLO text into
executables cached by graph hash, executes them on device buffers, and moves
data between host and device. jaxlib's compile entry points are
semi-private; this module is the only place that touches them. The
compile cache and sync live in executor.py."""
import collections
import struct
import time
import zlib

import jax
import jaxlib
import numpy as np
import torch
from jax._src import distributed
from jax._src.lib import xla_client as xc
from jax.extend.backend import get_backend

from . import cluster as _cluster, dtypes as _dtypes, peers
from .. import config, metrics
from .torch_compat import array_result_handler

_PLATFORMS = {"CPU": "cpu", "CUDA": "cuda", "GPU": "cuda", "TPU": "tpu"}
_INSTALL_HINT = {
    "cuda": "pip install 'torch_xla_core[cuda]' (the jax CUDA plugin)",
    "tpu": "pip install 'torch_xla_core[tpu]' (libtpu)",
}

_backend = None
_devices = None
_scalars = {}        # (value, dtype code) -> device buffer


def _cpu_device_count():
    """Applies TXC_NUM_CPU_DEVICES (jax's jax_num_cpu_devices) before jax's CPU client starts."""
    n = config.get("TXC_NUM_CPU_DEVICES")
    if n is None:
        return
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:  # jax's backends already started (jax was used before torch_xla_core)
        raise RuntimeError(f"TXC_NUM_CPU_DEVICES={n} could not be applied: {e}. Set it before jax or "
                           f"torch_xla_core starts a device (or use XLA_FLAGS="
                           f"--xla_force_host_platform_device_count={n}).") from None


_job = None  # the _cluster.Job this process joined (None: it runs alone)


def _distributed():
    """Joins jax's distributed runtime when a launcher started this process
    in a job of several (torchrun, torch_xla_core.launch, a PyTorchJob,
    srun, or TXC_* by hand: _runtime/cluster.py): one global device list over the
    processes, CPU collectives through gloo; what listens where and what a
    dead peer does: peers.py."""
    global _job
    job = _cluster.detect()
    if job is None:
        return
    timeout = int(config.get("TXC_DISTRIBUTED_TIMEOUT"))
    try:
        peers.join(job, _cluster.coordinator(job, timeout), timeout)
    finally:
        _cluster.release()
    _job = job


def local_ordinal() -> int:
    """This process's rank among the processes on its machine."""
    backend()
    return 0 if _job is None else _job.local_rank


def _select_backend():
    _cpu_device_count()
    _distributed()

    want = config.get("PJRT_DEVICE")  # CPU, CUDA, GPU or TPU (upper-cased), or None
    if want:
        platform = _PLATFORMS[want]
        try:
            return get_backend(platform)
        except RuntimeError as e:
            hint = _INSTALL_HINT.get(platform, "")
            raise RuntimeError(f"PJRT_DEVICE={want} was requested, but jax has no working {platform} "
                               f"backend ({e}). {hint}") from None
    for platform in ("tpu", "cuda", "cpu"):
        try:
            return get_backend(platform)
        except RuntimeError:
            continue
    raise RuntimeError("no PJRT backend is available")  # pragma: no cover (cpu always is)


def backend():
    global _backend, _devices, _flags
    if _backend is None:
        _flags = compiler_flags()  # XLA reads them once, when its first client starts
        _backend = _select_backend()
        _devices = _backend.local_devices()
    return _backend


_flags = None
# Flags that change what XLA writes beside an executable (dumps, logs), not the executable
_NOT_CODEGEN = ("--xla_dump", "--xla_log", "--xla_gpu_dump", "--xla_force_host_platform_device_count")


def compiler_flags() -> str:
    """The compiler flags in effect: XLA_FLAGS and LIBTPU_INIT_ARGS as the
    backend saw them when it started, less those that only name dump and log
    outputs (or the CPU device count, which the device kind and count
    carry). A flag such as --xla_cpu_enable_fast_math changes the code XLA
    emits, so the persistent compile cache keys on these."""
    if _flags is not None:
        return _flags
    parts = []
    for var in ("XLA_FLAGS", "LIBTPU_INIT_ARGS"):
        kept = [f for f in (config.get(var) or "").split() if not f.startswith(_NOT_CODEGEN)]
        if kept:
            parts.append(f"{var}={' '.join(kept)}")
    return ";".join(parts)


def platform() -> str:
    """The platform in use: 'cpu', 'cuda' or 'tpu'."""
    p = backend().platform
    return "cuda" if p == "gpu" else p  # newer jaxlib names its CUDA backend "gpu"


def devices():
    backend()
    return _devices


def device_count() -> int:
    return len(devices())


COMPILE_OPTIONS = "xla_client.CompileOptions() defaults"  # what compile_text passes; part of the disk cache key


def global_devices():
    """Every process's devices (jax's distributed runtime; with one process,
    devices()): what a sharding mesh may span."""
    return backend().devices()


def process_count() -> int:
    """The number of processes joined by jax's distributed runtime (1 alone)."""
    backend()
    return jax.process_count()


def process_index() -> int:
    """This process's rank among them (0 alone)."""
    backend()
    return jax.process_index()


def started() -> bool:
    """Whether the runtime has started (the first xla op starts it; a
    started runtime cannot join other processes)."""
    return _backend is not None


def replica_devices(device_index: int) -> tuple:
    """The device ids of a graph with collectives across processes
    (executor Key.replicas): one replica per process, in rank order, each on
    that process's device `device_index` (devices ordered by id: PJRT's ids
    are not dense, 0 and 2048 for two CPU processes). Replica ids are then
    process ranks, as torch.distributed's and torch_xla's are."""
    by_process = {}
    for d in sorted(global_devices(), key=lambda d: d.id):
        by_process.setdefault(d.process_index, []).append(d)
    return tuple(ds[device_index].id for _, ds in sorted(by_process.items()))


def replicated(device_ids):
    """(devices, CompileOptions) for an executable run as len(device_ids)
    replicas, one per process: each process launches it on its own device
    with its own inputs, and the collectives in it meet across them."""
    by_id = {d.id: d for d in global_devices()}
    opts = xc.CompileOptions()
    opts.num_replicas, opts.num_partitions = len(device_ids), 1
    opts.device_assignment = xc.DeviceAssignment.create(np.array([[i] for i in device_ids]))
    return [by_id[i] for i in device_ids], opts


def compile_text(text: str, device_index: int = 0):
    """Compiles StableHLO text for device `device_index` (one replica)."""
    return compile_on(text, (devices()[device_index],), _options(device_index))  # (devices(): starts the backend)


def compile_on(text: str, devices, options):
    """Compiles StableHLO text onto `devices` with jaxlib CompileOptions: the
    one call of jaxlib's compile API (a partitioned graph's options and
    devices come from _execution/spmd.py)."""
    return backend().compile_and_load(text, xc.DeviceList(tuple(devices)), options)


def deserialize_on(data: bytes, devices, options):
    """The executable serialize() wrote, loaded onto `devices` with the
    options it was compiled with. Only for bytes this program wrote: PJRT
    does not validate them."""
    return backend().deserialize_executable(data, xc.DeviceList(tuple(devices)), options)


def _options(device_index: int):
    opts = xc.CompileOptions()
    if device_index:  # the executable's one replica runs there (the default assignment is device 0)
        opts.device_assignment = xc.DeviceAssignment.create(np.array([[_devices[device_index].id]]))
    return opts


def serialize(exe) -> bytes:
    """A loaded executable as bytes (PJRT's serialized executable)."""
    return exe.serialize()


def deserialize(data: bytes, device_index: int = 0):
    """The executable that serialize() wrote, loaded onto device `device_index`
    (compiled with compile_text's options). Only for bytes this program wrote:
    PJRT does not validate them."""
    return deserialize_on(data, (_devices[device_index],), _options(device_index))


def fingerprint(device_index: int = 0) -> str:
    """Everything besides the program that decides what an executable is:
    jaxlib's version, the platform and its version, the device kind, the
    compile options and the compiler flags (compiler_flags(); the
    persistent compile cache keys on it)."""
    be = backend()
    d = devices()[device_index]
    return (f"jaxlib={jaxlib.__version__};platform={platform()};platform_version={be.platform_version};"
            f"device_kind={d.device_kind};options={COMPILE_OPTIONS};flags={compiler_flags()}")


def scalar(value, dtype_code: int, device_index: int = 0):
    """A device buffer holding a Python number, cached per dtype and value.
    A float is keyed by its bits: 0.0 and -0.0 (or NaNs with different
    payloads) compare equal but are different values. The number is cast as
    torch casts a scalar: integers wrap (-1 -> 255 in uint8), floats truncate."""
    tv = type(value)
    key = (_F64.pack(value) if tv is float else
           _F64.pack(value.real) + _F64.pack(value.imag) if tv is complex else value, dtype_code, device_index)
    buf = _scalars.get(key)
    if buf is None:
        buf = _put(np.asarray(value).astype(_dtypes.NUMPY[dtype_code]), devices()[device_index])
        if len(_scalars) > 4096:
            _scalars.clear()
        _scalars[key] = buf
    return buf


_F64 = struct.Struct("<d")


# id(executable) -> (executable, result handlers of its outputs), the last _HANDLERS_KEPT executables run
_handlers = collections.OrderedDict()
_HANDLERS_KEPT = 64


def _outputs(exe, results):
    """The outputs of an execution as jax Arrays. The first run of an
    executable takes jaxlib's general path (disassemble: a Python sharding
    object made per output, ~5-10 µs each); it keeps one C++ result handler
    per output (its aval, sharding and memory kind), and later runs build
    their Arrays through those (~0.5-1 µs each: a 1281-output training step
    saves ~7 ms per run). Executables are not weak-referenceable, so the
    handlers of the last _HANDLERS_KEPT executables run are kept, with them."""
    got = _handlers.get(id(exe))
    if got is not None and got[0] is exe:
        _handlers.move_to_end(id(exe))
        return results.consume_with_handlers(got[1])
    outs = [x[0] for x in results.disassemble_into_single_device_arrays()]
    _handlers[id(exe)] = (exe, [_result_handler(o) for o in outs])
    while len(_handlers) > _HANDLERS_KEPT:
        _handlers.popitem(last=False)
    return outs


def _result_handler(o):
    """jaxlib's C++ handler that makes Arrays like o (torch_compat.py: jaxlib 0.10
    and 0.11 take different arguments)."""
    return array_result_handler(o.aval, o.sharding, o._committed)


def launch(exe, params):
    """Starts an executable: (its outputs, not yet ready; the launch's start
    time for wait_ready). Timer "execute_launch"."""
    t0 = time.perf_counter()
    outs = _outputs(exe, exe.execute_sharded(params))
    metrics.timer_add("execute_launch", time.perf_counter() - t0)
    return outs, t0


def wait_ready(outs, t0):
    """Blocks until the outputs of a launch started at t0 are ready. Timer
    "execute": launch until ready, the step's device time as the host sees
    it. The executor writes the outputs where they go between the launch and
    this wait (a sync's cut.assign, a replay's writes), so that this work of
    the host overlaps the device's instead of following it."""
    peers.wait(outs)
    metrics.timer_add("execute", time.perf_counter() - t0)


def _put(a: np.ndarray, device):
    # jax truncates 64-bit host data unless x64 is on; scope it to the copy.
    # Callers pass memory that is theirs alone (to_device's private copy):
    # on the CPU jax shares the host memory of a torch-owned array (even with
    # may_alias=False) instead of copying it.
    with jax.enable_x64(True):
        return jax.device_put(a, device)


def to_device(t: torch.Tensor, device_index: int = 0):
    """Copies a CPU tensor to the device; returns the device buffer. One host
    copy: a private torch copy (64-byte aligned) that the CPU device then
    shares, not a numpy copy that jax copies again; later writes to `t`
    never reach the device buffer."""
    with metrics.timed("transfer_to_device"):
        src = t.detach()
        t = src.resolve_conj().resolve_neg().contiguous()
        if t.data_ptr() == src.data_ptr() and t.numel():  # still the caller's memory: copy it
            t = t.clone(memory_format=torch.contiguous_format)
        if t.dtype == torch.bfloat16:
            a = t.view(torch.int16).numpy().view(_dtypes.NUMPY[_dtypes.BF16])
        else:
            a = t.numpy()
        buf = _put(a, devices()[device_index])
    metrics.counter_add("transfer_to_device")
    return buf


def device_index(buf) -> int:
    """The device a single-device buffer lies on (-1: several, a sharded buffer)."""
    ds = buf.devices()
    return devices().index(next(iter(ds))) if len(ds) == 1 else -1


def move(buf, device_index: int):
    """The buffer's data on device `device_index` (a device-to-device copy;
    a sharded buffer is gathered there)."""
    with metrics.timed("transfer_between_devices"), jax.enable_x64(True):
        r = jax.device_put(buf, devices()[device_index])
    metrics.counter_add("transfer_between_devices")
    return r


_collectives = 0  # collective_barrier calls made by this process (each barrier's id)


def collective_barrier(what: str) -> None:
    """Before a step every process must take together (a gather of a value
    with pieces in other processes, a sync of a graph over their devices):
    waits until every process reaches the same step. A process that takes it
    alone (torch.save or .cpu() under `if rank == 0:`) would block in the
    collective for good; here it raises after TXC_COLLECTIVE_TIMEOUT seconds
    (default TXC_DISTRIBUTED_TIMEOUT, 60) with an error naming `what`. The
    barrier's id is this process's count of such steps and a hash of
    `what`, so processes that gather different values also stop. One
    process: nothing to wait for."""
    backend()
    n = jax.process_count()
    if n == 1:
        return
    global _collectives
    _collectives += 1
    timeout = config.get("TXC_COLLECTIVE_TIMEOUT")  # default: TXC_DISTRIBUTED_TIMEOUT, 60
    key = f"txc_collective_{_collectives}_{zlib.crc32(what.encode()):08x}"
    try:
        with metrics.timed("collective_barrier"):
            client = distributed.global_state.client
            peers.blocking(lambda: client.wait_at_barrier(key, int(timeout * 1000)), what)
    except peers.PeerLostError:
        raise
    except Exception as e:
        raise RuntimeError(
            f"{what}: this is a collective step (the value has pieces on other processes' devices), so every "
            f"process must take it at the same point, but not all {n} processes did within {timeout:g} s "
            f"(process {jax.process_index()} waited; {type(e).__name__}: {str(e).splitlines()[0][:200]}). Call "
            f"it in every process, e.g. torch_xla_core.save(obj, path) in all of them (process 0 writes), or "
            f"save the pieces with torch_xla_core.distributed_checkpoint. The processes are now out of step: "
            f"end the run.") from None


def to_host(buf, what: str = "copying an xla tensor to the CPU") -> torch.Tensor:
    """Copies a device buffer to a new CPU tensor. A buffer with pieces in
    other processes is gathered, a collective (collective_barrier(what))."""
    with metrics.timed("transfer_to_host"):
        if not buf.is_fully_addressable and not buf.is_fully_replicated:  # pieces in other processes
            from jax.experimental import multihost_utils  # lazy: multi-process only (jax's multihost helpers)
            spec = getattr(buf.sharding, "spec", None)
            collective_barrier(f"{what} (a {buf.dtype}{list(buf.shape)} tensor sharded "
                               f"{tuple(spec) if spec is not None else buf.sharding})")
            buf = peers.blocking(lambda: multihost_utils.process_allgather(buf, tiled=True), what)
        peers.wait([buf], what)
        a = np.asarray(buf)
        if a.dtype == _dtypes.NUMPY[_dtypes.BF16]:
            t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a.copy()) if not a.flags.writeable else torch.from_numpy(a)
    metrics.counter_add("transfer_to_host")
    return t


def wait_all() -> None:
    """Blocks until every live device buffer is ready: all launched
    executions and transfers have finished."""
    for a in backend().live_arrays():
        try:
            peers.wait([a], "waiting for the device's work")
        except peers.PeerLostError:
            raise
        except RuntimeError:  # a deleted (donated) buffer: nothing to wait for
            pass


def live_bytes(device_index: int = 0) -> int:
    """Bytes of the live device buffers of this process on device
    `device_index` (its part of each buffer laid out over several devices)."""
    d = devices()[device_index]
    arrays = [a for a in backend().live_arrays() if not a.is_deleted()]
    return sum(s.data.nbytes for a in arrays for s in a.addressable_shards if s.device == d)


def memory_kinds(device_index: int = 0) -> set:
    """The memory kinds the device can address ('device', 'pinned_host',
    'unpinned_host' on CPU and GPU), or {'device'} when PJRT lists none."""
    d = devices()[device_index]
    try:
        return {m.kind for m in d.addressable_memories()}
    except Exception:  # a plugin without memory spaces
        return {"device"}


def require_memory_kind(kind: str, who: str) -> None:
    """Raises, naming `who` (the feature asking) and the kinds there are,
    when the devices cannot address memory of `kind` (host offload on a
    platform without a host memory space)."""
    kinds = memory_kinds()
    if kind not in kinds:
        raise RuntimeError(f"{who}: the {platform()} devices list no host memory space (their memory kinds: "
                           f"{sorted(kinds)}), so values cannot be placed in '{kind}' memory there; run without "
                           f"offload on this platform")
