"""The xla device's random-number state. It is a lazy tensor, int64[2] =
[seed, counter], uploaded as device data (a graph parameter, so a new seed
never recompiles). Each random op takes the current state as an operand and
the state moves on in the IR (`rng_advance`: counter + 1), so two draws in
one graph differ, successive steps differ, and the state is computed at
sync like any other live tensor. torch.manual_seed / torch.seed reach
manual_seed() here through the device module (torch.xla.manual_seed_all)."""
import torch

_MASK = (1 << 64) - 1
_seed = None   # the seed as an unsigned 64-bit int; None: torch.initial_seed() at first use
_state = None  # the current state (a _C.LazyTensor), or None: upload [seed, 0] at first use


def manual_seed(seed: int) -> None:
    """Seeds the xla RNG (torch.manual_seed(seed) calls this too)."""
    global _seed, _state
    _seed = int(seed) & _MASK
    _state = None


def initial_seed() -> int:
    return _seed if _seed is not None else torch.initial_seed()


def seed() -> int:
    """Seeds the xla RNG with a non-deterministic number; returns it."""
    import os
    s = int.from_bytes(os.urandom(8), "little") >> 1
    manual_seed(s)
    return s


def _upload(seed: int, counter: int = 0):
    from . import _tensor
    s = seed & _MASK
    if s >= 1 << 63:
        s -= 1 << 64
    return _tensor.from_cpu(torch.tensor([s, counter], dtype=torch.int64))._lt


def _make_advance():
    from . import _tensor
    return _tensor._make, _tensor.OP.rng_advance


_adv = None


def state(generator=None):
    """The state for one draw (a LazyTensor); the device state moves on. With
    a (CPU) torch.Generator, a fresh state seeded from that generator instead."""
    global _state, _adv
    if generator is not None:
        s = torch.empty((), dtype=torch.int64).random_(generator=generator).item()
        return _upload(s)
    s = _state
    if s is None:
        s = _upload(initial_seed())
    if _adv is None:
        _adv = _make_advance()
    _state = _adv[0](_adv[1], (s,), ())
    return s


def get_rng_state() -> torch.Tensor:
    """The xla RNG state as a CPU int64 tensor (computes pending draws)."""
    global _state
    from . import _tensor
    if _state is None:
        _state = _upload(initial_seed())
    return _tensor.to_cpu(_tensor.wrap(_state))


def set_rng_state(new_state: torch.Tensor) -> None:
    global _state
    from . import _tensor
    if new_state.dtype != torch.int64 or tuple(new_state.shape) != (2,):
        raise RuntimeError(f"set_rng_state: expected an int64 tensor of shape [2], got {new_state.dtype} "
                           f"{list(new_state.shape)}")
    _state = _tensor.from_cpu(new_state.detach().cpu().clone())._lt
