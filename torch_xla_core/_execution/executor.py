"""The executor: the one place where pending tensors become device data.
sync() cuts the pending graph (csrc/trace/graph.h), makes its cache key,
finds or compiles its executable, binds the parameters, executes, and
assigns the results back to the tensors' storages. It owns:

- the cache key, an explicit value (Key): the graph's structural hash, the
  float32 matmul precision, the device, the platform and the donated
  parameters (input/output aliasing: device data that only this graph still
  refers to — a training step's old parameters and optimizer state — is
  overwritten in place instead of held twice; see GraphCut.donations) and
  the memory kinds of host-resident parameters and outputs (offload.py);
- the compile cache: key -> loaded executable, least recently used
  evicted beyond TXC_COMPILE_CACHE_SIZE entries (default 1024; metrics
  "cache_hit", "cache_miss", "cache_evict", "compile"); a miss first looks
  in the persistent cache on disk (torch_xla_core/_execution/compile_cache.py,
  TXC_COMPILE_CACHE) and writes what it compiles there;
- compiles in flight: a compile runs on a worker thread while the caller
  waits, so Ctrl-C returns at once; the compile finishes in the background
  and a re-run of the same graph (or another thread's sync of it) waits for
  that compile instead of starting a second one ("compile_reused");
- failures: a graph that fails to compile or run raises once, naming the core
  op and the aten op that made the failing node (from the compiler's line
  number, else by compiling halves of the graph); the tensors computed from
  that node then hold a failed value that raises the same error when used,
  and every other pending tensor is computed by the next sync as usual;
- out of memory: torch.OutOfMemoryError naming the graph's largest buffers
  and the aten ops that made them (nothing is marked failed: free memory and
  retry);
- a long compile's progress line (_execution/progress.py, TXC_COMPILE_PROGRESS);
- recompiles: each compile is attributed to the user's frame that synced
  and explained on request (torch_xla_core/_execution/recompiles.py, TXC_DEBUG=recompiles);
- devices: a graph runs on the device its values are on (Key.device; a
  sync of every live tensor runs one graph per device in use, see
  use_devices()); a sharded graph runs on its mesh, partitioned by XLA's
  SPMD partitioner (Key.spmd; torch_xla_core/_execution/spmd.py does its lowering
  options, compile options, input transfer and output assembly);
- TXC_DUMP_DIR: every compiled graph's StableHLO is written there
  (graph-<hash>.mlir); torch_xla_core/_features/debug.py shows a sync's graph without
  running it. TXC_DONATE=0 turns donation off.

Threading model: there is one pending graph per process, shared by all
threads (as in PyTorch/XLA, whose graph is per device). Tracing is
serialized by the GIL; sync() takes a process-wide lock, so syncs run one at
a time. A sync (all live tensors) computes every thread's pending tensors,
and a deferred check (torch_xla_core/_tracing/checks.py) computed by it raises in
whichever thread next syncs or reads a value. Tracing in other threads may go
on while a sync compiles or executes; what they write after the cut stays
pending for the next sync."""
import collections
import concurrent.futures
import contextlib
import os
import re
import sys
import threading
import time

import torch

from .. import _C, config, metrics
from . import spmd as _spmd, compile_cache, growth, recompiles
from .progress import Progress as _Progress
from .._tracing import checks as _checks, random as _random, tensor as _tensor
from .._runtime import peers, runtime

class Key(collections.namedtuple("Key", "graph precision device platform aliases memory spmd replicas unread fused",
                                 defaults=(None, None, (), 0))):
    """What identifies a compiled executable: the graph's hash, the float32
    matmul precision, the device index, the platform, the donated
    (parameter, output) pairs, the memory kinds of the parameters and outputs
    that live outside device memory (GraphCut.memory_kinds(): () when all are
    on the device; see _features/offload.py), for a graph partitioned over a
    mesh its device assignment and parameter shardings (_spmd.Spmd; None for
    one device), for a graph with collectives across processes the device of
    each replica, one per process (runtime.replica_devices; None otherwise),
    the outputs that extra parameters read by nothing are donated to
    (donating_variant; () otherwise), and for graphs compiled as one
    (_execution/fusion.py) how many (their keys hashed into graph; else 0)."""


class Plan(collections.namedtuple("Plan", "cut key checks")):
    """A sync about to run: the cut, its key, the deferred checks it computes."""

    def stablehlo(self) -> str:  # (lowered once: a recording keeps the text compiled)
        k, text = self.key, self.__dict__.get("text")
        if text is None:
            text = self.__dict__["text"] = (
                self.cut.lower(k.precision, list(k.aliases), len(k.spmd.device_ids), list(k.spmd.params))
                if k.spmd is not None else self.cut.lower(k.precision, list(k.aliases), unread=list(k.unread),
                                                          num_replicas=len(k.replicas) if k.replicas else 1))
        return text


_lock = threading.RLock()     # one sync at a time
_cache_lock = threading.Lock()
_cache = collections.OrderedDict()   # Key -> executable, least recently used first
_inflight = {}                       # Key -> Future of a compile under way
_pool = None
_sync_listeners = []                 # called with each sync's Plan (the profiler names graphs)
_last = None                         # the executable that ran last (memory statistics)
_session = None                      # the txc.compile recording under way (recording()), or None
_multi = False                       # a device other than xla:0 has been used: syncs go device by device
_collectives = False                 # a collective was traced (torch_xla_core/distributed): cuts are asked


def use_devices() -> None:
    """Notes that tensors on devices other than xla:0 exist: from now on a
    sync runs one graph per device that has pending values."""
    global _multi
    _multi = True


def multi_device() -> bool:
    """Whether use_devices() was called: syncs go device by device."""
    return _multi


def add_sync_listener(fn) -> None:
    """fn(plan) is called with each sync's Plan before it runs (the profiler
    names graphs with it)."""
    _sync_listeners.append(fn)


def remove_sync_listener(fn) -> None:
    _sync_listeners.remove(fn)

_STAT_FIELDS = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes", "temp_size_in_bytes",
                "generated_code_size_in_bytes", "host_argument_size_in_bytes", "host_output_size_in_bytes",
                "host_alias_size_in_bytes", "host_temp_size_in_bytes", "peak_memory_in_bytes")


def last_memory_stats() -> dict:
    """The compiled memory statistics of the graph that ran last (XLA's
    CompiledMemoryStats: argument/output/alias/temp bytes, host_* and peak),
    or {} before the first sync."""
    if _last is None:
        return {}
    st = _last.get_compiled_memory_stats()
    return {f: int(getattr(st, f)) for f in _STAT_FIELDS if hasattr(st, f)}


def cache_size() -> int:
    """The compile cache's bound (TXC_COMPILE_CACHE_SIZE, default 1024)."""
    return config.get("TXC_COMPILE_CACHE_SIZE")


def cached_count() -> int:
    return len(_cache)


def clear_cache() -> None:
    """Empties the in-memory compile cache (and the recompile history of call sites)."""
    with _cache_lock:
        _cache.clear()
    recompiles.clear()


class GraphError(RuntimeError):
    """A graph failed to compile or run; the message names the op at fault."""


def _workers():
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="txc-compile")
    return _pool


def _compile(key, text):
    try:
        _dump(key, text)
        _spmd.check_partitioned(key, text)
        exe = compile_cache.load(key, text)  # the persistent cache (TXC_COMPILE_CACHE)
        if exe is None:
            with metrics.timed("compile"):
                if key.spmd is not None:
                    exe = _spmd.compile(text, key)
                elif key.replicas is not None:
                    exe = runtime.compile_on(text, *runtime.replicated(key.replicas))
                else:
                    exe = runtime.compile_text(text, key.device)
            metrics.counter_add("compile")
            compile_cache.store(key, text, exe)
        with _cache_lock:
            _cache[key] = exe
            limit = cache_size()
            while len(_cache) > limit:
                _cache.popitem(last=False)
                metrics.counter_add("cache_evict")
        return exe
    finally:
        with _cache_lock:
            _inflight.pop(key, None)


def _compile_into(fut, key, text):
    """_compile, its result into `fut`: a Future put in _inflight before the
    work was queued, so that no Ctrl-C can land between queueing a compile and
    registering it (the next sync would not find it and compile again)."""
    if not fut.set_running_or_notify_cancel():  # cancelled while being queued (executable)
        return
    try:
        fut.set_result(_compile(key, text))
    except BaseException as e:  # noqa: BLE001  (handed to whoever waits for it)
        fut.set_exception(e)


def _dump(key, text):
    d = config.get("TXC_DUMP_DIR")
    if d:
        os.makedirs(d, exist_ok=True)
        name = f"graph-{key.graph:016x}-{key.precision}-xla{key.device}" + ("-donated" if key.aliases else "") + \
            (f"-unread{len(key.unread)}" if key.unread else "") + (f"-fused{key.fused}" if key.fused else "")
        if key.spmd is not None:
            name += f"-spmd{len(key.spmd.device_ids)}-{hash(key.spmd) & 0xffffffff:08x}"
        with open(os.path.join(d, name + ".mlir"), "w") as f:
            f.write(f"// {key}\n{text}")


def _donating() -> bool:
    return config.get("TXC_DONATE")


def plan(lts=None, device=_tensor.ALL_DEVICES) -> Plan:
    """The cut a sync of these LazyTensors (default: all live) would run, and
    its key; with device >= 0, only their values on that device."""
    checks = _checks.snapshot()
    if lts is not None:  # a partial sync: the checks and the RNG state move on too
        lts = list(lts) + [c[0] for c in checks] + _random.roots()
    cut = _C.GraphCut(lts, device)
    spmd = _spmd.key_field(cut) if _spmd.active and cut.num_outputs else None
    aliases = tuple(cut.donations()) if _donating() and cut.num_outputs else ()
    key = Key(cut.hash, torch.get_float32_matmul_precision(), cut.device, runtime.platform(), aliases,
              cut.memory_kinds(), spmd, _replicas(cut, spmd) if _collectives else None)
    return Plan(cut, key, checks)


def use_collectives() -> None:
    """Notes that collectives across processes have been traced: from now on
    each cut is asked whether it holds one (GraphCut.collectives)."""
    global _collectives
    _collectives = True


def _replicas(cut, spmd):
    """Key.replicas: a graph holding collectives, with several processes,
    runs as one replica per process (runtime.replica_devices); None
    otherwise (one process: the collectives span one replica)."""
    if runtime.process_count() == 1 or not cut.num_outputs or not cut.collectives():
        return None
    if spmd is not None:
        raise RuntimeError("this graph holds both collectives across processes (all_reduce, all_gather, ... of "
                           "torch_xla_core.distributed or the 'xla' torch.distributed backend) and tensors "
                           "sharded over a mesh (mark_sharding): the two do not mix in one graph. Under SPMD, "
                           "let the mesh do the communication, and use a 'gloo' process group for host values.")
    return runtime.replica_devices(cut.device)


def _bind(p: Plan) -> list:
    """The parameters' device buffers for p's executable: Python numbers as
    buffers on its device; with several devices in use, a value of no fixed
    device (the RNG state) moved to the graph's device when it lies elsewhere;
    for a partitioned graph, inputs laid out on the mesh (_spmd.bind)."""
    cut, key = p.cut, p.key
    params = [runtime.scalar(*a, key.device) if type(a) is tuple else a for a in cut.params()]
    if key.spmd is not None:
        return _spmd.bind(key.spmd, params)
    if _multi:
        for i, d in enumerate(cut.param_devices()):
            if d == _tensor.ANY_DEVICE and runtime.device_index(params[i]) != key.device:
                params[i] = runtime.move(params[i], key.device)
    return params


def donating_variant(p: Plan, outputs) -> concurrent.futures.Future:
    """The Future of p's executable with one more parameter per output in
    `outputs` (after its own), read by nothing and donated to that output:
    a replayed step's old grads, written in place (replay/_compiled.py).
    Compiled in the background (not a recompile of the user's call site)."""
    got = _start(Plan(p.cut, p.key._replace(unread=tuple(outputs)), p.checks), explain=False)
    if isinstance(got, concurrent.futures.Future):
        return got
    done = concurrent.futures.Future()
    done.set_result(got)
    return done


def wait_compiles():
    """Waits for the compiles in flight (donating_variant's, any thread's)."""
    with _cache_lock:
        pending = list(_inflight.values())
    concurrent.futures.wait(pending)


def _start(p: Plan, explain: bool):
    """p's executable if it is cached, else the Future of its compile (one in
    flight, or started now; explain: counted and explained as a compile at
    the user's call site)."""
    key = p.key
    with _cache_lock:
        exe = _cache.get(key)
        if exe is not None:
            _cache.move_to_end(key)
        fut = _inflight.get(key)
    if exe is not None:
        metrics.counter_add("cache_hit")
        return exe
    if fut is None:
        metrics.counter_add("cache_miss")
        if explain:
            recompiles.on_compile(p)  # counts and explains it (TXC_DEBUG=recompiles); may raise past a limit
        with metrics.timed("lower"):
            text = p.stablehlo()
        with _cache_lock:
            fut = _inflight.get(key)  # another thread may have started it meanwhile
            start = fut is None
            if start:
                fut = _inflight[key] = concurrent.futures.Future()
        if start:
            try:
                _workers().submit(_compile_into, fut, key, text)
            except BaseException:
                # Ctrl-C (or a failure) while queueing: a compile that has started goes on and the next
                # sync reuses it; one that has not is cancelled and forgotten
                if fut.cancel():
                    with _cache_lock:
                        if _inflight.get(key) is fut:
                            del _inflight[key]
                raise
    else:
        metrics.counter_add("compile_reused")
    return fut


def executable(p: Plan, explain: bool = True):
    """The compiled executable of a plan: cached, in flight, or compiled now
    (explain: counted and explained as a compile at the user's call site)."""
    fut = _start(p, explain)
    if not isinstance(fut, concurrent.futures.Future):
        return fut
    progress = _Progress(p)
    while True:  # waits in short slices so that Ctrl-C gets through; the compile goes on
        try:
            exe = fut.result(timeout=0.05)
            progress.done()
            return exe
        except concurrent.futures.TimeoutError:
            progress.tick()
            continue
        except concurrent.futures.CancelledError:  # its queueing was interrupted in another thread
            return executable(p, explain)


_before_sync = []  # fn() called at each sync's start: pending.py's flush (before_sync)
before_sync = _before_sync.append


def sync(lts=None, wait=False, read_checks=True) -> None:
    """Computes the pending values of the given LazyTensors' storages (default:
    every live one) in one compiled graph per device; they then hold device
    data. read_checks=False: the deferred checks of earlier syncs are left
    for a later sync or value read (a replay inside a step launching what
    traced ops computed before it)."""
    with _lock:
        for fn in _before_sync:  # (pending.flush: a replay's launch left pending runs first)
            fn()
        if read_checks:
            _checks.verify(block=wait)  # checks computed by earlier syncs that did not wait (the ready ones)
        with metrics.timed("sync"):
            ran = [_run(plan(lts), wait)] if not _multi else [_run(plan(lts, d), wait) for d in _C.pending_devices()]
        growth.note(lts is not None, [r for r in ran if r is not None])  # the trap of reads without syncs
        if wait:
            _checks.verify()


@contextlib.contextmanager
def recording(session):
    """The one hook of a txc.compile recording (torch_xla_core/replay/): while it is under way, session
    sees every sync (session.grab: the executable, its parameters and outputs), every value read on the
    host (session.read: _tracing/tensor.py's materialize) and upload (session.upload: from_cpu), every
    backward pass outside a scan body's trace (session.backward: _ops/engine.py), every LR scheduler step
    (session.scheduler_step: replay/_schedulers.py) and the tensors the "xla" backend's collectives write
    (session.collective_wrote: distributed/backend.py); they ask recording_session(). Process-wide:
    autograd and DDP's reducer may run on other threads."""
    global _session
    saved, _session = _session, session
    try:
        yield session
    finally:
        _session = saved


def recording_session():
    """The txc.compile recording under way (recording()), or None."""
    return _session


# the tracing layer's sync_lazy and uploads run graphs through here; its host reads and uploads ask recording_session()
_tensor.bind_executor(sync, use_devices, recording_session)


def spans_processes(lts=None) -> bool:
    """Whether a sync of these LazyTensors (default: all live) would run a
    graph over other processes' devices too: a collective step every
    process must take (runtime.collective_barrier)."""
    if len(runtime.global_devices()) == runtime.device_count():
        return False
    local = {d.id for d in runtime.devices()}
    with _lock:
        plans = [plan(lts)] if not _multi else [plan(lts, d) for d in _C.pending_devices()]
    return any(p.key.spmd is not None and not set(p.key.spmd.device_ids) <= local for p in plans)


class Launch(collections.namedtuple("Launch", "exe params write checks spmd cut", defaults=(None, None, None, None))):
    """One run of a compiled executable: what a sync and a replay both hand
    to execute(). exe and its bound params; write(outs) puts the outputs
    where they belong (a sync: GraphCut.assign; a replay: its ReplayPlan's
    writes) before anything waits; checks(outs): the deferred checks it
    computed (_checks.computed); spmd: the Key of a graph partitioned over a
    mesh (launched there: _spmd.launch); cut: the GraphCut, which names the
    op at fault and marks its tensors failed when the graph fails."""


@contextlib.contextmanager
def _naming_failures(cut):
    """An error compiling, binding or launching cut's graph becomes the
    GraphError naming the op at fault (its tensors marked failed: _failure);
    errors that say something of their own pass (a recompile limit, an
    unpartitioned annotation, a lost peer), as does any error of a run
    without a cut (a replay's recorded executable)."""
    try:
        yield
    except (recompiles.RecompileLimitError, _spmd.UnpartitionedAnnotation, peers.PeerLostError):
        raise
    except Exception as e:
        peers.explain_failure(e, "running a graph")  # a collective failed on a dead peer's closed connection
        if cut is None:
            raise
        raise _failure(cut, e) from None


def execute(launch: Launch, wait: bool = False, read_checks: bool = False):
    """The one pipeline every graph run takes, a sync's and a replay's:
    launch, write the outputs, (read_checks: read the ready deferred checks
    of earlier runs, verify(block=False)), note the checks, count it, and
    with wait=True wait for the device after that (so the host's work
    overlaps the device's). Returns (outputs, launch time)."""
    global _last
    cut = launch.cut
    with _naming_failures(cut):
        if launch.spmd is not None:
            outs, t0 = _spmd.launch(launch.exe, launch.spmd, launch.params, cut.output_specs())
        else:
            outs, t0 = runtime.launch(launch.exe, launch.params)
    _last = launch.exe
    if launch.write is not None:
        launch.write(outs)
    try:
        if read_checks:  # (before this run's checks are noted: they stay one run in flight, as before)
            _checks.verify(block=False)
    finally:
        if launch.checks is not None:
            _checks.computed(launch.checks(outs))
        metrics.counter_add("execute")
    if wait:
        try:
            runtime.wait_ready(outs, t0)
        except peers.PeerLostError:  # the graph still runs, waiting on a dead process: no failure of its own
            raise
        except Exception as e:
            if cut is None:
                raise
            raise _run_failure(cut, outs, e) from None
    return outs, t0


def run_recorded(launch: Launch, wait: bool = False, read_checks: bool = True):
    """execute() for a replay (torch_xla_core/replay/): a recorded
    executable on new parameters; the ready deferred checks of earlier runs
    are read once it is launched, while the device runs (a sync reads them
    before its launch), so a violation of step N raises in call N+1 after
    that step's launch and writes (read_checks=False: a graph inside the
    user's step, a dynamo graph's, leaves them to the step's sync)."""
    with _lock:
        return execute(launch, wait, read_checks)


def _run(p: Plan, wait: bool):
    """Runs a plan's graph; returns its cut, None when nothing was pending."""
    cut = p.cut
    if cut.num_outputs == 0:
        return None
    for listen in _sync_listeners:
        listen(p)
    with _naming_failures(cut):
        exe = executable(p)
        params = _bind(p)
    # with several devices, a check made on another device waits for that device's graph
    checks = [c for c in p.checks if c[0].is_data] if _multi else p.checks
    launch = Launch(exe, params, write=cut.assign, checks=lambda outs: checks,
                    spmd=p.key if p.key.spmd is not None else None, cut=cut)
    outs, _ = execute(launch, wait)
    session = _session
    if session is not None and p.key.spmd is None:  # txc.compile records this step (torch_xla_core/replay/)
        session.grab(p, exe, params, outs)
    return cut


# --- failures ---------------------------------------------------------------

_OOM = re.compile(r"RESOURCE_EXHAUSTED|out of memory", re.IGNORECASE)
_LINE = re.compile(r"(?:^|[\s(\"])-:(\d+):\d+")


def _first_line(e) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


def _describe(info) -> str:
    made = f"made by {info['origin']}" if info["origin"] else "made inside torch_xla_core (no aten op)"
    return f"core op '{info['op']}' {info['dtype']}{list(info['shape'])}, {made}"


def _failure(cut, e):
    """The error to raise for a failed sync; marks the failed tensors."""
    if _OOM.search(str(e)):
        return _out_of_memory(cut, e)
    metrics.counter_add("graph_failed")
    k = _failing_node(cut, e)
    if k is not None:
        roots = cut.roots_using(k)
        where = _describe(cut.node_info(k))
    else:
        roots = _failing_roots(cut, list(range(cut.num_roots)), e)
        where = "a node the compiler did not locate"
    msg = (f"torch_xla_core: a graph of {cut.num_nodes} nodes failed to compile or run at {where}: "
           f"{_first_line(e)}. The {len(roots)} tensor(s) computed from it hold no value and raise this error "
           f"when used; other pending tensors are unaffected. If the op is a torch op, please report it.")
    cut.poison(roots, msg)
    _checks.discard_failed()
    return GraphError(msg)


def _run_failure(cut, outs, e):
    """The error to raise when a launched graph failed while running (its
    outputs were already handed to their tensors): every tensor it computes
    holds this error instead of a value."""
    metrics.counter_add("graph_failed")
    msg = (f"torch_xla_core: a graph of {cut.num_nodes} nodes failed while running: {_first_line(e)}. The "
           f"{cut.num_roots} tensor(s) it computes hold no value and raise this error when used.")
    cut.poison_assigned(outs, msg)
    _checks.discard_failed()
    return (torch.OutOfMemoryError if _OOM.search(str(e)) else GraphError)(msg)


def _failing_node(cut, e):
    m = _LINE.search(str(e))
    if m is None:
        return None
    k = cut.node_at_line(int(m.group(1)))
    return k if k >= 0 else None


def _compiles(sub) -> bool:
    try:
        runtime.compile_text(sub.lower(torch.get_float32_matmul_precision()))
        return True
    except Exception:
        return False


def _failing_roots(cut, idx, e, depth=0):
    """The roots (indices into cut) that cannot be compiled, by compiling halves.
    Gives up (all of idx) past a few levels: an error path, kept bounded."""
    if len(idx) <= 1 or depth >= 6:
        return idx
    half = len(idx) // 2
    bad = []
    for part in (idx[:half], idx[half:]):
        if not _compiles(cut.subset(part)):
            bad += _failing_roots(cut, part, e, depth + 1)
    return bad or idx  # each half compiles alone: the failure needs both


def _mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def _out_of_memory(cut, e):
    metrics.counter_add("out_of_memory")
    top = cut.largest(5)
    lines = [f"  {_mib(i['bytes'])}: {_describe(i)}" for i in top]
    msg = (f"torch_xla_core: out of device memory running a graph of {cut.num_nodes} nodes "
           f"({_first_line(e)}). Its largest buffers:\n" + "\n".join(lines) +
           "\nFree tensors you no longer need, sync() more often (smaller graphs), or use smaller batches. "
           "The pending tensors are kept: a later sync retries them.")
    return torch.OutOfMemoryError(msg)
