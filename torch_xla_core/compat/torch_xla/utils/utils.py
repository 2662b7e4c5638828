"""torch_xla.utils.utils (xu): the small helpers torch_xla's scripts use
(environment lookups of the caller's own variables, list coercion,
synthetic data loaders, timing, a temporary folder, pytree walks)."""
import copy
import shutil
import sys
import tempfile
import time

import torch

from .... import config as _config  # (private: xu has no `config`)


def as_list(t):
    """t itself when it is a list or tuple, else [t]."""
    return t if isinstance(t, (list, tuple)) else [t]


def getenv_as(name: str, type, defval=None):
    """The caller's environment variable `name` converted with `type` (bool:
    an integer, nonzero is True), defval when unset."""
    v = _config.caller_variable(name)
    if v is None:
        return defval
    return bool(int(v)) if type is bool else type(v)


def check_env_flag(name: str, default: str = "") -> bool:
    """True when `name` is 'true' or a positive integer."""
    v = _config.caller_variable(name, default)
    return v == "true" or (v.isdigit() and int(v) > 0)


class SampleGenerator:
    """A loader stand-in that yields `data` sample_count times."""

    def __init__(self, data, sample_count: int):
        self._data, self._n = data, sample_count

    def __len__(self):
        return self._n

    def __iter__(self):
        return iter([self._data] * self._n)


class FnDataGenerator:
    """A loader stand-in: batches of random inputs (batch_size x shape) and
    their targets func(inputs), count of them."""

    def __init__(self, func, batch_size: int, gen_tensor, dims=None, count: int = 1):
        self._func, self._batch_size, self._gen = func, batch_size, gen_tensor
        self._dims, self._count = list(dims) if dims else [batch_size], count

    def __len__(self):
        return self._count

    def __iter__(self):
        for _ in range(self._count):
            data = self._gen(*self._dims)
            yield data, self._func(data)


class DataWrapper:
    """Base for user batch classes: get_tensors() lists the tensors a loader
    moves, from_tensors(tensors) rebuilds the batch from the moved ones."""

    def get_tensors(self):
        raise NotImplementedError("DataWrapper subclasses define get_tensors()")

    def from_tensors(self, tensors):
        raise NotImplementedError("DataWrapper subclasses define from_tensors(tensors)")


class TmpFolder:
    """A temporary directory (`name`), removed with the object."""

    def __init__(self):
        self.name = tempfile.mkdtemp()

    def __del__(self):
        shutil.rmtree(self.name, ignore_errors=True)


def timed(fn, msg: str = "", printfn=None):
    """fn(), printing how long it took (msg first) to stderr or with printfn."""
    t0 = time.time()
    out = fn()
    (printfn or _eprint)(f"{msg}{1000.0 * (time.time() - t0):.3f}ms")
    return out


class TimedScope:
    """Prints the time a with-block took (msg first)."""

    def __init__(self, msg: str = "", printfn=None):
        self._msg, self._print = msg, printfn or _eprint

    def __enter__(self):
        self._t0 = time.time()
        return self

    def __exit__(self, *exc):
        self._print(f"{self._msg}{1000.0 * (time.time() - self._t0):.3f}ms")


def _eprint(*args):
    print(*args, file=sys.stderr)


def _visit(value, select_fn, fn, seen):
    """for_each_instance's walk: each object once (by id), dict keys
    included, into containers and objects' attributes."""
    if id(value) in seen:
        return
    seen[id(value)] = value
    if select_fn(value):
        fn(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            _visit(k, select_fn, fn, seen)
            _visit(v, select_fn, fn, seen)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            _visit(v, select_fn, fn, seen)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.Tensor)):
        for v in list(vars(value).values()):
            _visit(v, select_fn, fn, seen)


def _rewrite(value, select_fn, fn, seen):
    """for_each_instance_rewrite's walk: the same order as _visit; containers
    and objects are rebuilt (objects as copy.copy with their attributes
    rewritten), each object once, cycles kept."""
    if id(value) in seen:
        return seen[id(value)]
    if select_fn(value):
        out = seen[id(value)] = fn(value)
    elif isinstance(value, dict):
        out = seen[id(value)] = type(value)()
        for k, v in value.items():
            k = _rewrite(k, select_fn, fn, seen)
            out[k] = _rewrite(v, select_fn, fn, seen)
    elif isinstance(value, set):
        out = seen[id(value)] = type(value)()
        for v in value:
            out.add(_rewrite(v, select_fn, fn, seen))
    elif isinstance(value, (list, tuple)):
        items = [_rewrite(v, select_fn, fn, seen) for v in value]
        out = type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        seen[id(value)] = out
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.Tensor)):
        out = seen[id(value)] = copy.copy(value)
        for k, v in list(vars(out).items()):
            setattr(out, k, _rewrite(v, select_fn, fn, seen))
    else:
        out = seen[id(value)] = value
    return out


def for_each_instance(value, select_fn, fn) -> None:
    """Calls fn on every object inside `value` (lists, tuples, sets, dicts'
    keys and values, objects' attributes) for which select_fn is true, once
    per object (by identity), as torch_xla does."""
    _visit(value, select_fn, fn, {})


def for_each_instance_rewrite(value, select_fn, fn):
    """`value` rebuilt with every object select_fn picks replaced by fn(object)."""
    return _rewrite(value, select_fn, fn, {})
