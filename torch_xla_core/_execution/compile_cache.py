"""The persistent compile cache: executables serialized to a directory so
that a second process (or a restarted job) loads instead of compiling.

- Where: TXC_COMPILE_CACHE=DIR, default $XDG_CACHE_HOME/torch_xla_core
  (~/.cache/torch_xla_core); TXC_COMPILE_CACHE=off (or 0, none, "") turns it
  off. The test suite runs with it off (tests/conftest.py) and the tests of
  this module use a temporary directory, so no state is shared through a
  home directory; benchmarks that time compiles turn it off too.
- Key: sha256 of the StableHLO text the executor compiles (which already
  holds the matmul precision, donation and memory kinds), the executor's Key
  fields, runtime.fingerprint() (jaxlib version, platform and its version,
  device kind, compile options, XLA_FLAGS / LIBTPU_INIT_ARGS less dump and
  log flags) and our version and C++ ABI flavor. A stale
  entry (another jaxlib, device or build) has another name and is never
  looked up; it ages out by eviction.
- Graphs partitioned over a mesh (Key.spmd) are kept too: their key holds
  the mesh's device assignment (device ids in mesh order) and every
  parameter's sharding (HloSharding text, tiled over the mesh's shape),
  the StableHLO their shardings and partition count, and the entry name
  adds the SPMD compile options and the process count and index; so
  another mesh (other devices, order or shape) or another layout of the
  inputs never finds this entry. A hit is loaded onto the mesh's devices
  with the options the compile used (_spmd.deserialize).
- Entries: one file per key, a header (magic, format, sha256 of the payload)
  and PJRT's serialized executable (runtime.serialize). Written to a
  temporary file in the same directory and renamed over the entry
  (os.replace is atomic), so concurrent processes writing one key each
  leave a whole file and a reader never sees half of one. A corrupt entry
  (bad header or digest, or one PJRT refuses) is warned about, deleted and
  recompiled, never executed.
- Trust: an entry is native code this process runs, so only its owner
  may feed the cache. The directory is created 0700. A directory that is
  group- or world-writable, owned by another user, or not a directory is
  not used at all (nothing loaded or written; a warning naming it and the
  fix, once per directory; counter "persistent_cache_unsafe"); an entry
  that is not a regular file of this user's, writable by no one else
  (a symlink, another owner, mode g+w/o+w), is never loaded (the same
  warning and counter) and is replaced by the next write.
  trusted_directory() is that rule for any directory code or pickles are
  loaded from. The digest in the header guards against corruption, not
  against a planted file: the owner check is what does.
- Size: at most TXC_COMPILE_CACHE_MAX_BYTES (default 4 GiB); after each
  write the least recently used entries (file mtime; a hit touches it) go
  until the directory fits.
- Metrics: counters "persistent_cache_hit", "persistent_cache_miss",
  "persistent_cache_write", "persistent_cache_corrupt",
  "persistent_cache_evict", "persistent_cache_unsafe"; timers "persistent_cache_load",
  "persistent_cache_write".

jax has a compilation cache of its own (jax._src.compilation_cache), but it
is private, keys on jax's own lowering of jax functions and carries its
settings through jax's config; the part we need — files of serialized
executables — is this short module over jaxlib's public serialize /
deserialize_executable."""
import hashlib
import os
import stat
import tempfile
import warnings

import jax

from . import spmd as _spmd
from .. import config, metrics
from .._runtime import runtime
from .._version import __version__
from .._runtime.build_info import flavor

__all__ = ["directory", "max_bytes", "entry_path", "load", "store", "trusted_directory"]

_MAGIC = b"TXCEXE1\n"
_DIGEST = 32
_unserializable_warned = False


def directory():
    """The cache directory in use, or None when the cache is off."""
    return config.get("TXC_COMPILE_CACHE")  # default $XDG_CACHE_HOME/torch_xla_core; off (0, none, "") -> None


def max_bytes() -> int:
    return config.get("TXC_COMPILE_CACHE_MAX_BYTES")


def _ours() -> str:
    return f"torch_xla_core={__version__};flavor={flavor()}"


def _partitioning(key) -> str:
    """For a graph partitioned over a mesh or run as replicas (collectives):
    the processes (with several, each process's executable is its own)."""
    if key.spmd is None and key.replicas is None:
        return ""
    return f"{_spmd.OPTIONS};processes={jax.process_count()};process={jax.process_index()}"


def entry_name(key, text: str) -> str:
    h = hashlib.sha256()
    for part in (_MAGIC, repr(key._replace(graph=0)).encode(), runtime.fingerprint(key.device).encode(),
                 _partitioning(key).encode(), _ours().encode(), text.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest() + ".xexe"


def entry_path(key, text: str):
    """The file that holds (or would hold) this graph's executable; None when off."""
    d = directory()
    return None if d is None else os.path.join(d, entry_name(key, text))


def _untrusted(st, what: str):
    """Why a file or directory with this stat may not feed this process
    code, or None: it must be this user's and writable by no one else."""
    me = os.geteuid()
    if st.st_uid != me:
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "everyone" if st.st_mode & stat.S_IWOTH else "its group"
        return f"{what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def trusted_directory(path: str, create: bool = False):
    """None when `path` is a directory only this user can write (created
    0700 when missing and `create`), else why it is not: the rule for any
    directory torch_xla_core loads executables, code or pickles from."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return f"{path} does not exist"
        os.makedirs(path, mode=0o700, exist_ok=True)  # the leaf 0700 (the umask may only take bits away)
        st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return _untrusted(st, path)


_warned = set()


def _usable(d: str, create: bool) -> bool:
    """Whether the cache directory may be used; warns once per directory."""
    try:
        why = trusted_directory(d, create)
    except OSError as e:
        why = f"{d} cannot be created ({e})"
    if why is None:
        return True
    if why.endswith("does not exist"):
        return False  # nothing cached yet: a plain miss
    metrics.counter_add("persistent_cache_unsafe")
    if (d, why) not in _warned:
        _warned.add((d, why))
        warnings.warn(f"torch_xla_core: the persistent compile cache directory is not used: {why}. Its entries are "
                      f"native code this process would run, so another user able to write there could run code "
                      f"as you. Fix: chmod 700 {d} (as its owner), or set TXC_COMPILE_CACHE to a directory of "
                      f"your own (default ~/.cache/torch_xla_core), or TXC_COMPILE_CACHE=off", RuntimeWarning,
                      stacklevel=4)
    return False


def _open_entry(path):
    """The bytes of an entry this user owns and no one else can write; None
    (and a warning) for any other file. The checks are made on the open
    file (fstat), not on the name, and a symbolic link is not followed."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))  # a FIFO: no wait
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        why = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else _untrusted(st, "it")
        if why is not None:
            metrics.counter_add("persistent_cache_unsafe")
            warnings.warn(f"torch_xla_core: persistent compile cache entry {path} is never loaded: {why}, so it "
                          f"may have been planted by someone else (its name is a hash anyone can compute). "
                          f"Compiling instead; the next write replaces it. Delete it if you do not know where it "
                          f"came from", RuntimeWarning, stacklevel=4)
            return None
        return f.read()


def _corrupt(path, why):
    metrics.counter_add("persistent_cache_corrupt")
    warnings.warn(f"torch_xla_core: persistent compile cache entry {path} is unusable ({why}); it is ignored, "
                  f"deleted and the graph recompiled", RuntimeWarning, stacklevel=3)
    try:
        os.unlink(path)
    except OSError:
        pass


def load(key, text: str):
    """The cached executable of this graph, or None (a miss, the cache off, or
    an entry that could not be used)."""
    path = entry_path(key, text)
    if path is None or not _usable(os.path.dirname(path), create=False):
        if path is not None:
            metrics.counter_add("persistent_cache_miss")
        return None
    with metrics.timed("persistent_cache_load"):
        try:
            blob = _open_entry(path)
        except FileNotFoundError:
            metrics.counter_add("persistent_cache_miss")
            return None
        except OSError as e:  # ELOOP: a symbolic link (O_NOFOLLOW)
            if os.path.islink(path):
                metrics.counter_add("persistent_cache_unsafe")
                warnings.warn(f"torch_xla_core: persistent compile cache entry {path} is a symbolic link; it is "
                              f"never followed or loaded. Compiling instead; the next write replaces it",
                              RuntimeWarning, stacklevel=2)
                metrics.counter_add("persistent_cache_miss")
                return None
            warnings.warn(f"torch_xla_core: cannot read the compile cache entry {path} ({e}); compiling instead",
                          RuntimeWarning, stacklevel=2)
            metrics.counter_add("persistent_cache_miss")
            return None
        if blob is None:  # not this user's own file
            metrics.counter_add("persistent_cache_miss")
            return None
        head = len(_MAGIC) + _DIGEST
        if len(blob) <= head or not blob.startswith(_MAGIC):
            _corrupt(path, "bad header")
            metrics.counter_add("persistent_cache_miss")
            return None
        payload = blob[head:]
        if hashlib.sha256(payload).digest() != blob[len(_MAGIC):head]:
            _corrupt(path, "checksum mismatch")
            metrics.counter_add("persistent_cache_miss")
            return None
        try:
            exe = (_spmd.deserialize(payload, text, key) if key.spmd is not None else
                   runtime.deserialize_on(payload, *runtime.replicated(key.replicas)) if key.replicas else
                   runtime.deserialize(payload, key.device))
        except Exception as e:  # PJRT refused it (another build wrote the same name?)
            _corrupt(path, f"PJRT could not load it: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}")
            metrics.counter_add("persistent_cache_miss")
            return None
    try:
        os.utime(path)  # recently used
    except OSError:
        pass
    metrics.counter_add("persistent_cache_hit")
    return exe


def store(key, text: str, exe) -> None:
    """Writes the executable (atomically), then evicts beyond max_bytes()."""
    global _unserializable_warned
    d = directory()
    if d is None or not _usable(d, create=True):
        return
    path = os.path.join(d, entry_name(key, text))
    with metrics.timed("persistent_cache_write"):
        try:
            payload = runtime.serialize(exe)
        except Exception as e:
            if not _unserializable_warned:
                _unserializable_warned = True
                warnings.warn(f"torch_xla_core: this platform's executables cannot be serialized ({e}); the "
                              f"persistent compile cache stores nothing", RuntimeWarning, stacklevel=2)
            return
        try:
            fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".xexe")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            warnings.warn(f"torch_xla_core: cannot write the compile cache entry {path} ({e}); set "
                          f"TXC_COMPILE_CACHE to a writable directory or to off", RuntimeWarning, stacklevel=2)
            return
    metrics.counter_add("persistent_cache_write")
    _evict(d, keep=path)


def _evict(d, keep):
    """Deletes the least recently used entries until the directory fits."""
    limit = max_bytes()
    entries = []
    total = 0
    for e in os.scandir(d):
        if not e.name.endswith(".xexe") or e.name.startswith(".tmp-"):
            continue
        try:
            st = e.stat()
        except OSError:
            continue
        entries.append((st.st_mtime, st.st_size, e.path))
        total += st.st_size
    entries.sort()
    for _, size, path in entries:
        if total <= limit:
            break
        if path == keep:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        total -= size
        metrics.counter_add("persistent_cache_evict")
