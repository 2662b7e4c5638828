"""The xla device's random-number state. It is a lazy tensor, int64[2] =
[seed, counter], uploaded as device data (a graph parameter, so a new seed
never recompiles). A draw takes two operands (see csrc/ops/random.cpp): a
base state and its stream, a Python number (a scalar graph parameter)
made from the draw's offset from the base (stream()), and draws stream
counter + offset. The base is the state as
it was last computed (device data, after a sync) or set; the offsets count
the draws since, 0, 1, 2, ..., the same at every step, so a training step's
graph (and its hash) stays the same, and the pending state is always one
op, `rng_advance(base, offsets used)`, never a chain that grows with the
number of draws or of steps. The state is computed at every sync, partial
ones included (roots()), like any other live tensor. torch.manual_seed /
torch.seed reach manual_seed() here through the device module
(torch.xla.manual_seed_all).

`_state` is the current state as a LazyTensor; after a scan loop it is the
loop's final state, which starts a new base. Inside a scan body being traced
(_trace_context), draws chain from the body's own state (a few per
iteration) and leave _state/_base/_last alone: a body value held here would
stay live outside the body."""
import contextlib
import os

import torch

from .._runtime import dtypes as _dtypes
from . import tensor as _tensor, trace_context as _trace_context

_MASK = (1 << 64) - 1
_seed = None   # the seed as an unsigned 64-bit int; None: torch.initial_seed() at first use
_state = None  # the current state (a _C.LazyTensor), or None: upload [seed, 0] at first use
_base = None   # the state the pending draws are offsets from
_n = 0         # offsets used since _base: the current state is _base + [0, _n]
_last = None   # the _state this module made last (another value in _state: a new base)


def manual_seed(seed: int) -> None:
    """Seeds the xla RNG (torch.manual_seed(seed) calls this too)."""
    global _seed, _state
    _seed = int(seed) & _MASK
    _state = None


def initial_seed() -> int:
    return _seed if _seed is not None else torch.initial_seed()


def seed() -> int:
    """Seeds the xla RNG with a non-deterministic number; returns it."""
    s = int.from_bytes(os.urandom(8), "little") >> 1
    manual_seed(s)
    return s


def _upload(seed: int, counter: int = 0):
    s = _int64(seed & _MASK)
    # joins graphs on any device
    return _tensor.from_cpu(torch.tensor([s, counter], dtype=torch.int64), _tensor.ANY_DEVICE)._lt


_I64 = _dtypes.code(torch.int64)  # a stream is the scalar operand (stream(n), _I64)
_GOLDEN = 11400714819323198485  # G of csrc/ops/random.cpp


def stream(offset: int) -> int:
    """The stream operand of a draw at `offset` from its state:
    (offset * 2^40) * G mod 2^64 as a signed int64 (csrc/ops/random.cpp's
    draw_bits adds it to the state's key)."""
    return _int64(((offset << 40) * _GOLDEN) & _MASK)


def _int64(u: int) -> int:
    """An unsigned 64-bit value as the int64 with its bits."""
    return u - (1 << 64) if u >= 1 << 63 else u


def _advance(state, n: int):
    """The state n draws on from `state` (a LazyTensor)."""
    return _tensor.lazy_op(_tensor.OP.rng_advance, (state, (n, _I64)), ())


def draw(generator=None):
    """The operands of one draw, (state, (stream, int64)); the device state
    moves on by one. With a (CPU) torch.Generator, a fresh state seeded from
    that generator instead."""
    base, n = _next(generator)
    return base, (stream(n), _I64)


def _next(generator):
    """(the state of the next draw, its offset from that state)."""
    global _state, _base, _n, _last
    if generator is not None:
        s = torch.empty((), dtype=torch.int64).random_(generator=generator).item()
        return _upload(s), 0
    trace = _trace_context.current()
    if trace is not None:  # in a scan body: chain from the body's state
        s = trace.rng_state
        trace.rng_state = _advance(s, 1)
        return s, 0
    s = _state
    if s is None or s is not _last or s.is_data:
        # First use, seeded or set anew, swapped by scan, or computed by a
        # sync: draws count from here.
        if s is None:
            s = _upload(initial_seed())
        _base, _n = s, 0
    n = _n
    _n = n + 1
    _state = _last = _advance(_base, _n)
    return _base, n


def state(generator=None):
    """The state for one draw as a tensor (a LazyTensor): a draw from it at
    offset 0 is the draw draw() would give; the device state moves on."""
    base, n = _next(generator)
    if n == 0:
        return base
    return _advance(base, n)


def set_state(lt) -> None:
    """Makes lt (a LazyTensor) the current state: the loop's final state after
    a scan, or the state a txc.compile replay computed (a new base for the
    draws that follow)."""
    global _state
    _state = lt


def peek_state():
    """The current state as held (a LazyTensor), or None before the first
    draw or after a seed: draws nothing, uploads nothing."""
    return _state


def current_state():
    """The current state (a LazyTensor), [seed, 0] uploaded if there is none
    yet: draws nothing."""
    global _state
    if _state is None:
        _state = _upload(initial_seed())
    return _state


@contextlib.contextmanager
def replaying(lt):
    """Draws inside come from lt (a scan backward re-running an iteration's
    forward: the same draws); the state is restored after."""
    global _state
    trace = _trace_context.current()
    if trace is not None:
        saved, trace.rng_state = trace.rng_state, lt
        try:
            yield
        finally:
            trace.rng_state = saved
        return
    saved, _state = _state, lt
    try:
        yield
    finally:
        _state = saved


def roots():
    """The pending state, for a partial sync to compute too (an empty list
    when it is device data): the next step's draws then count from device
    data again, whatever the sync computed."""
    s = _state
    if s is None or s.is_data:
        return []
    return [s]


def get_rng_state() -> torch.Tensor:
    """The xla RNG state as a CPU int64 tensor (computes pending draws)."""
    return _tensor.to_cpu(_tensor.wrap(current_state()))


def set_rng_state(new_state: torch.Tensor) -> None:
    global _state
    if new_state.dtype != torch.int64 or tuple(new_state.shape) != (2,):
        raise RuntimeError(f"set_rng_state: expected an int64 tensor of shape [2], got {new_state.dtype} "
                           f"{list(new_state.shape)}")
    _state = _tensor.from_cpu(new_state.detach().cpu().clone(), _tensor.ANY_DEVICE)._lt
