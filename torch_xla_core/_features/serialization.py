"""copy.deepcopy, copy.copy, torch.save and torch.load of xla tensors:
XlaTensor's __deepcopy__, __copy__ and __reduce_ex__ delegate here, and register() adds the "xla"
entry of torch.serialization's storage location registry and the set_ kernel
that torch.load's rebuild of an xla tensor calls.

deepcopy: the copy's storage is a new core storage holding the same IR value
(device data stays the same immutable buffer; a pending value is computed
once for both), so nothing moves and nothing runs; in-place writes go to one
storage only. Tensors of one storage (a base and its views) deep-copied with
one memo share one copied storage, as torch's CPU deepcopy does.

torch.save: an xla tensor pickles exactly as a CPU tensor does
(torch._utils._rebuild_tensor_v2 over a storage, offset, size and stride):
the storage is a CPU copy of its core storage's whole value, tagged "xla:N"
by our tagger. Such a checkpoint loads under weights_only=True; with
map_location="cpu" it loads in a process that never imports torch_xla_core.
Tensors of one core storage saved together share one CPU storage (a view
keeps its offset and strides, found by running its view chain on an arange),
so torch.load restores the sharing.

Several processes (torch_xla_core.launch): saving a tensor sharded over
several processes' devices gathers it, a collective every process must take
(torch.save in every process, or save() below: every process calls it, one
writes). A process saving alone raises, after TXC_COLLECTIVE_TIMEOUT
seconds, an error naming the tensor (runtime.collective_barrier) rather
than blocking for good. Tensors held by one process save as usual.
save() writes a path atomically (a temporary file in the same directory,
fsynced, renamed over it: atomic_write), so a process killed mid-save
leaves the previous checkpoint intact.

torch.load: our deserializer hands the storage on as an XlaHostStorage (its
data on the host, its device xla:N); torch's rebuild then runs
torch.empty(device=xla).set_(storage, offset, size, stride), and our set_
uploads each storage once and makes the tensors on it views of that value
(torch's legacy format fills storages after that: XlaHostStorage's
_set_from_file writes the data in then).
"""
import collections
import contextlib
import copy
import io
import math
import os
import secrets
import shutil
import weakref

import jax
import torch

from .. import _ops, config
from .._execution import executor
from .._tracing import tensor as _tensor
from .._runtime import runtime

_SAVING = "torch.save of a sharded xla tensor"
_PRIORITY = 9  # ahead of torch's "cpu" tagger (10): our host storages are CPU storages
_MEMO_KEY = "torch_xla_core.storage"

# Host storages made by torch.save's reduce, alive while a pickler holds them:
# id(storage) -> (weakref to it, location tag, key in _by_value).
_tags = {}
# (core storage id, device buffer) -> id(host storage): one host storage per
# core storage and value while it lives (the entry keeps the buffer alive, so
# neither id is reused meanwhile).
_by_value = {}


# ---- deepcopy -----------------------------------------------------------------

def deepcopy(t, memo):
    """copy.deepcopy of an xla tensor, as torch does on the CPU: a leaf copy
    with the same requires_grad, .grad and __dict__ copied; a Parameter copy
    is a Parameter without .grad or attributes (torch.nn.Parameter.__deepcopy__)."""
    if id(t) in memo:
        return memo[id(t)]
    if not t.is_leaf:
        raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                           "protocol at the moment.  If you were attempting to deepcopy a module, this may be "
                           "because of a torch.nn.utils.weight_norm usage, see "
                           "https://github.com/pytorch/pytorch/pull/103001")
    lt = t._lt
    key = (_MEMO_KEY, lt.storage_id)
    copied = memo.get(key)
    if copied is None:
        copied = memo[key] = (lt.copy_storage(), t)  # t keeps its storage, and so the key, alive
    with torch.no_grad():
        new = _tensor.wrap(lt.rebase(copied[0]))
    if t.__dict__.get("_is_param"):
        new._is_param = True
        new.requires_grad_(t.requires_grad)
    else:
        new.requires_grad_(t.requires_grad)
        if t.grad is not None:
            new.grad = deepcopy(t.grad, memo)
        new.__dict__.update(copy.deepcopy(t.__dict__, memo))
    memo[id(t)] = new
    return new


def shallow_copy(t):
    """copy.copy of an xla tensor, as torch's on the CPU (which goes through
    __reduce_ex__): a new leaf sharing t's storage, requires_grad and attributes."""
    with torch.no_grad():
        new = _tensor.wrap(t._lt.alias())
    new.requires_grad_(t.requires_grad)
    new.__dict__.update(t.__dict__)
    return new


# ---- torch.save -----------------------------------------------------------------

def reduce_ex(t, proto):
    """XlaTensor.__reduce_ex__: what torch.save/pickle write for t."""
    hooks = collections.OrderedDict()
    if t.__dict__.get("_is_param"):  # a Parameter: as torch.nn.Parameter.__reduce_ex__
        state = {k: v for k, v in t.__dict__.items() if k != "_is_param"}
        if state:
            return (torch._utils._rebuild_parameter_with_state, (t.detach(), t.requires_grad, hooks, state))
        return (torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, hooks))
    if any(k != "_is_param" for k in t.__dict__):
        _tensor.warn_once("serialization.state", "torch.save drops the Python attributes of xla tensors "
                          "(Parameters keep theirs); set them again after torch.load")
    storage, offset, stride = _host_storage(t)
    typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=t.dtype, _internal=True)
    return (torch._utils._rebuild_tensor_v2, (typed, offset, tuple(t.shape), stride, t.requires_grad, hooks))


def _contiguous(shape):
    stride, s = [], 1
    for d in reversed(shape):
        stride.append(s)
        s *= max(d, 1)
    return tuple(stride[::-1])


def _host_storage(t):
    """(CPU storage, offset, stride) for t: the storage holds the whole value
    of t's core storage, shared with the other tensors of that storage pickled
    meanwhile. A view whose layout is not strided gets a storage of its own."""
    lt = t._lt
    root = lt.copy_storage()
    if not root.is_data:
        # Compute everything pending at once (as txc.sync()): saving a state
        # dict after a step is then one graph, not one per tensor. With
        # several processes that graph may span their devices: then every
        # process must save (runtime.collective_barrier).
        del root
        if executor.spans_processes():
            runtime.collective_barrier(f"torch.save of a pending xla tensor {str(t.dtype)[6:]}{list(t.shape)} "
                                       f"(computing it runs a graph over several processes' devices)")
        _tensor.sync_lazy(None, wait=True)
        root = lt.copy_storage()
    geometry = _geometry(lt, root.shape)
    if geometry is None:  # no strided layout over the storage: save the view's value alone
        return (_tag(runtime.to_host(_tensor.materialize(t), _SAVING).untyped_storage(), t, None), 0,
                _contiguous(t.shape))
    buf = root.data
    key = (lt.storage_id, id(buf))
    known = _by_value.get(key)
    hit = _tags.get(known[0]) if known else None
    storage = hit[0]() if hit else None
    if storage is None:
        storage = _tag(runtime.to_host(buf, _SAVING).untyped_storage(), t, key)
        _by_value[key] = (id(storage), buf)
    return storage, geometry[0], geometry[1]


def _tag(storage, t, key):
    sid = id(storage)

    def forget(_ref):
        _tags.pop(sid, None)
        if key is not None and _by_value.get(key, (None,))[0] == sid:
            del _by_value[key]
    _tags[sid] = (weakref.ref(storage, forget), str(t.device), key)
    return storage


def _geometry(lt, root_shape):
    """(offset, stride) of lt's elements in its storage's value laid out
    contiguously, or None where they are not strided."""
    if all(op in ("alias", "reshape") for op in lt.view_ops):
        return 0, _contiguous(lt.shape)
    n = 1
    for d in root_shape:
        n *= d
    index = _tensor.from_cpu(torch.arange(n, dtype=torch.int64).reshape(root_shape))
    try:
        idx = _tensor.to_cpu(_tensor.wrap(lt.rebase(index._lt)))
    except Exception:  # a chain that does not apply to integers
        return None
    if idx.numel() == 0:
        return 0, _contiguous(idx.shape)
    r = idx.dim()
    offset = int(idx[(0,) * r])
    stride = []
    for d in range(r):
        if idx.shape[d] > 1:
            stride.append(int(idx[(0,) * d + (1,) + (0,) * (r - d - 1)]) - offset)
        else:
            stride.append(1)
    if min(stride, default=0) < 0:
        return None
    flat = torch.arange(n, dtype=torch.int64)
    if not torch.equal(flat.as_strided(idx.shape, stride, offset), idx):
        return None
    return offset, tuple(stride)


def _tagger(storage):
    hit = _tags.get(id(storage))
    if hit is not None and hit[0]() is storage:
        return hit[1]
    return None


def save(obj, f, master_only: bool = True, global_master: bool = True) -> None:
    """torch.save for several processes (torch_xla's xm.save): every process
    calls it; tensors sharded over several processes are gathered (a
    collective, so all must take part) and only process 0 writes `f`
    (master_only; global_master=False: the first process of each machine,
    local rank 0; master_only=False: every process writes its own `f`).
    With one process it is torch.save.

    A path is written atomically (atomic_write): a process killed while
    saving leaves the old file or the new one there, never a broken one."""
    runtime.backend()
    if master_only:
        rank = jax.process_index() if global_master else config.get("TXC_LOCAL_RANK")
        write = rank == 0
    else:
        write = True
    if not write:
        # the others pickle too, into a buffer they drop: the gathers of sharded tensors pair up in order
        torch.save(obj, io.BytesIO())
    elif isinstance(f, (str, os.PathLike)):
        atomic_write(f, lambda fh: torch.save(obj, fh))
    else:
        torch.save(obj, f)


_TMP = ".txc-tmp"  # temporary files and directories: <name>.txc-tmp.<pid>.<random>


def atomic_write(path, write) -> None:
    """Calls write(file) on a temporary file next to `path`, flushes and
    fsyncs it, renames it over `path` and fsyncs the directory: `path` holds
    its old content or the new, whatever moment the process dies at. Stale
    temporary files of `path` left by dead processes are removed first."""
    path = os.fspath(path)
    remove_stale(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def temp_name(path) -> str:
    """A temporary name next to `path` (same directory, so a rename commits it)."""
    path = os.fspath(path)
    return f"{path}{_TMP}.{os.getpid()}.{secrets.token_hex(4)}"


def remove_stale(path, ours: bool = False) -> None:
    """Removes the temporary files or directories of `path` (temp_name) whose
    process is gone on this machine: what a killed save left (ours=True:
    this process's too, what its failed save left)."""
    path = os.path.abspath(os.fspath(path))
    folder, base = os.path.split(path)
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if not name.startswith(base + _TMP + "."):
            continue
        pid = name[len(base + _TMP) + 1:].split(".")[0]
        if not pid.isdigit() or (_alive(int(pid)) and not (ours and int(pid) == os.getpid())):
            continue
        stale = os.path.join(folder, name)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(folder) -> None:
    """Makes a rename or a new entry in `folder` durable (POSIX)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform without directory handles (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---- torch.load -------------------------------------------------------------------

class XlaHostStorage(torch.UntypedStorage):
    """A loaded storage bound for an xla device: its bytes are on the host,
    its device is xla:N, so torch rebuilds its tensors there (see _set)."""

    @property
    def device(self):
        return torch.device("xla", self._txc_index)

    def _set_from_file(self, *args, **kwargs):
        # torch's legacy (non-zip) format fills a storage only after the
        # tensors on it were rebuilt: write the data into them now.
        r = super()._set_from_file(*args, **kwargs)
        for dtype, root in self._txc_roots.items():
            host = torch.empty(0, dtype=dtype).set_(self, 0, (math.prod(root.shape),), (1,)).reshape(root.shape)
            root.assign(_tensor.from_cpu(host)._lt)
        for lt, host in self._txc_copies:
            lt.assign(_tensor.from_cpu(host)._lt)
        return r


def _device_index(location):
    """The device index of an xla location ("xla", "xla:N"), else None."""
    if location == "xla":
        return 0
    if not location.startswith("xla:"):
        return None
    try:
        index = int(location[4:])
    except ValueError:
        raise RuntimeError(f"torch.load: the checkpoint names the storage location {location!r}, which is not "
                           f"'xla' or 'xla:N': the file is corrupt or was not written by torch.save (pass "
                           f"map_location='cpu' to read it elsewhere)") from None
    n = runtime.device_count()
    if not 0 <= index < n:
        raise RuntimeError(f"Attempting to deserialize object on xla device {index} but there are {n} xla "
                           f"device(s) on {runtime.platform()}. Please use torch.load with map_location to map "
                           "your storages to an existing device.")
    return index


def _deserializer(storage, location):
    index = _device_index(location)
    if index is None or storage.device.type != "cpu":
        return None
    storage.__class__ = XlaHostStorage  # the loaded CPU storage is ours alone: retag it in place
    storage._txc_index = index
    storage._txc_roots = {}  # dtype -> the LazyTensor holding the uploaded storage
    storage._txc_copies = []  # (LazyTensor, host view) of tensors whose layout is no core view
    return storage


def _set(self, source, storage_offset=None, size=None, stride=None):
    """aten.set_ of an xla tensor to an XlaHostStorage (torch.load's rebuild)."""
    if not isinstance(source, XlaHostStorage):
        raise RuntimeError(f"set_: an xla tensor can only be set to a storage on xla (got one on {source.device}); "
                           "move the data with .to('xla') instead")
    if size is None:
        storage_offset, size = 0, [source.nbytes() // self.element_size()]
    if not stride:
        stride = _contiguous(size)
    _check_fits(self.dtype, source, storage_offset, size, stride)
    cpu = torch.empty(0, dtype=self.dtype).set_(source, storage_offset, size, stride)
    lt = _shared(source, cpu, storage_offset, tuple(size), tuple(stride))
    with torch.no_grad():
        self.data = _tensor.wrap(lt)  # the wrapper's sizes (it was torch.empty((0,)))
    self._lt = lt
    return self


def _check_fits(dtype, source, offset, size, stride) -> None:
    """A tensor of a loaded checkpoint must lie inside its storage (torch's
    set_ would try to grow the storage: 'Trying to resize storage that is
    not resizable')."""
    n = source.nbytes() // torch.empty(0, dtype=dtype).element_size()
    bad = len(size) != len(stride) or offset < 0 or any(d < 0 for d in size) or any(st < 0 for st in stride)
    if not bad and 0 not in size:
        bad = offset + sum((d - 1) * st for d, st in zip(size, stride)) + 1 > n
    if bad:
        raise RuntimeError(f"torch.load: a {str(dtype).replace('torch.', '')} tensor of the checkpoint (size "
                           f"{list(size)}, stride {list(stride)}, offset {offset}) does not lie inside its storage of "
                           f"{n} elements: the file is corrupt or was not written by torch.save. Nothing of it was "
                           f"loaded")


def _shared(source, cpu, offset, size, stride):
    """The LazyTensor for `cpu` (a tensor on `source`): a view of the storage
    uploaded once per source and dtype, where its layout allows."""
    n = source.nbytes() // cpu.element_size()
    whole = offset == 0 and cpu.numel() == n and stride == _contiguous(size)
    if n == 0:
        return _tensor.from_cpu(cpu)._lt
    root = source._txc_roots.get(cpu.dtype)
    if root is None:
        if whole:
            root = _tensor.from_cpu(cpu)._lt  # the common case: the tensor is its storage
        else:
            root = _tensor.from_cpu(torch.empty(0, dtype=cpu.dtype).set_(source, 0, (n,), (1,)))._lt
        source._txc_roots[cpu.dtype] = root
    if root.shape == size and whole:
        return root.alias()
    view = _strided_view(root, n, offset, size, stride)
    if view is None:
        view = _tensor.from_cpu(cpu)._lt
        source._txc_copies.append((view, cpu))
    return view


def _strided_view(root, n, offset, size, stride):
    """as_strided(root.reshape(-1), size, stride, offset) from the core's view
    ops (reshape, slice, permute, expand), or None when that needs a gather."""
    view, OP = _tensor.lazy_view, _tensor.OP

    def flat():
        return root.alias() if root.shape == (n,) else view(OP.reshape, root, ([n],))
    if 0 in size:
        return None
    moving = [d for d in range(len(size)) if size[d] > 1 and stride[d] > 0]
    order = sorted(moving, key=lambda d: -stride[d])  # outermost first
    if len(order) == 1 and stride[order[0]] > 1:  # one strided dim (a diagonal, x[::k]): a stepped slice
        d = order[0]
        v = view(OP.slice, flat(), (0, offset, offset + (size[d] - 1) * stride[d] + 1, stride[d]))
    else:
        v = _blocked(root, flat, n, offset, [size[d] for d in order], [stride[d] for d in order])
        if v is None:
            return None
    perm = [order.index(d) for d in moving]
    if perm != sorted(perm):
        v = view(OP.permute, v, (perm,))
    squeezed = [size[d] if d in moving else 1 for d in range(len(size))]
    if tuple(v.shape) != tuple(squeezed):
        v = view(OP.reshape, v, (squeezed,))
    if tuple(squeezed) != tuple(size):
        v = view(OP.expand, v, (list(size),))
    return v


def _blocked(root, flat, n, offset, sizes, strides):
    """The elements offset + sum(k_i * strides[i]) (k_i < sizes[i], strides
    descending) as slices of the storage reshaped to blocks whose strides are
    those strides; dims in stride order. None if they do not fit such blocks."""
    view, OP = _tensor.lazy_view, _tensor.OP
    radix = list(strides)
    if not radix or radix[-1] != 1:
        radix.append(1)
    if len(set(radix)) != len(radix) or any(a % b for a, b in zip(radix, radix[1:])):
        return None
    blocks = [n // radix[0]] + [a // b for a, b in zip(radix, radix[1:])]
    starts = [offset // radix[0]] + [offset // r % b for r, b in zip(radix[1:], blocks[1:])]
    lengths = list(sizes) + [1] * (len(radix) - len(sizes))
    if any(s + k > b for s, k, b in zip(starts, lengths, blocks)):
        return None
    if root.shape == tuple(blocks):
        v = root.alias()
    else:
        v = flat()
        if blocks[0] * radix[0] != n:
            v = view(OP.slice, v, (0, 0, blocks[0] * radix[0], 1))
        if len(blocks) > 1:
            v = view(OP.reshape, v, (blocks,))
    for d, (s, k, b) in enumerate(zip(starts, lengths, blocks)):
        if (s, k) != (0, b):
            v = view(OP.slice, v, (d, s, s + k, 1))
    if len(lengths) != len(sizes):
        v = view(OP.reshape, v, (list(sizes),))
    return v


_done = False


def register() -> None:
    """Adds the "xla" tagger/deserializer to torch.serialization, XlaTensor's
    pickling and copy methods, and the set_ kernels torch.load's rebuild calls
    (once; called on import: _install.py)."""
    global _done
    if _done:
        return
    torch.serialization.register_package(_PRIORITY, _tagger, _deserializer)
    _tensor.bind_pickling(reduce_ex, deepcopy, shallow_copy)  # torch.save and pickle, copy.deepcopy, copy.copy
    aten = torch.ops.aten
    _ops.impl(aten.set_.source_Storage_storage_offset, aten.set_.source_Storage)(_set)
    _done = True
