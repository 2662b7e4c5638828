"""Registers the `xla` device with PyTorch: PrivateUse1 renamed to "xla",
with a device module (torch.xla), hooks and a device guard, so that
torch.device("xla"), tensor.to("xla") and module.to("xla") work and reach
our kernels. The generated Tensor.is_xla helper would collide with torch's
own, so the pieces are registered one by one."""
import contextlib
import functools
import operator

import torch

from . import random as _random
from .._runtime import runtime

_done = False


class _DeviceModule:
    """torch.xla: what PyTorch asks of a backend's device module."""

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return runtime.device_count()

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        _random.manual_seed(seed)

    @staticmethod
    def manual_seed(seed: int) -> None:
        _random.manual_seed(seed)

    @staticmethod
    def get_rng_state(device="xla"):
        return _random.get_rng_state()

    @staticmethod
    def set_rng_state(state, device="xla"):
        _random.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported() -> bool:
        return True

    # Streams and events, as torch.distributed.checkpoint's writer and
    # FSDP2 ask of a device module: an xla device runs its graphs in order,
    # as one stream, so every Stream is that stream and waits are no-ops
    # (a collective's data moves inside the graph that needs it).
    @staticmethod
    def current_stream(device=None):
        return _default_stream(index(device) or 0)

    @staticmethod
    def default_stream(device=None):
        return _default_stream(index(device) or 0)

    @staticmethod
    def Stream(device=None, priority=0, **kwargs):  # noqa: N802 (torch's name)
        return _Stream(index(device) or 0)

    @staticmethod
    def Event(enable_timing=False, blocking=False, interprocess=False):  # noqa: N802 (torch's name)
        return _Event()

    @staticmethod
    def stream(s):
        return contextlib.nullcontext(s)

    @staticmethod
    def synchronize(device=None) -> None:
        runtime.wait_all()


class _Stream:
    """A stream of an xla device, which runs everything in order as one
    stream: synchronize() waits for every launched graph and transfer. Each
    Stream() is an object of its own (FSDP2 keys events by stream); current
    and default streams are one per device. Its fields are torch.Stream's (FSDP2 on
    torch 2.15 passes them to torch.ops.fsdp.record_grad_output_stream):
    stream 0 of the device, whose type is an int, PrivateUse1's (the
    device type "xla" is PrivateUse1 renamed)."""

    stream_id = 0
    device_type = int(torch._C._autograd.DeviceType.PrivateUse1)

    def __init__(self, device_index: int = 0):
        self.device_index = device_index

    @property
    def device(self) -> torch.device:
        return torch.device("xla", self.device_index)

    def synchronize(self) -> None:
        _DeviceModule.synchronize()

    def wait_stream(self, other) -> None:
        pass  # one stream: already ordered

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event or _Event()

    def query(self) -> bool:
        return True


@functools.cache
def _default_stream(device_index: int) -> "_Stream":
    return _Stream(device_index)


class _Event:
    """An event on the one stream: recorded work is ordered already;
    synchronize() waits for every launched graph."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        _DeviceModule.synchronize()


def index(device):
    """The xla device index a device argument names: None for None, other
    device types and a bare "xla" (the default device, xla:0); an index that
    is no device raises, naming it and the count (TXC_NUM_CPU_DEVICES sets
    how many CPU devices there are)."""
    if device is None:
        return None
    d = device if isinstance(device, torch.device) else torch.device(device)
    if d.type != "xla" or d.index is None:
        return None
    n = runtime.device_count()
    if not 0 <= d.index < n:
        hint = (" (set TXC_NUM_CPU_DEVICES=N before the first xla op for N CPU devices)"
                if runtime.platform() == "cpu" else "")
        raise RuntimeError(f"xla:{d.index} is not a device: this process has {n} xla device{'s' if n != 1 else ''} "
                           f"({runtime.platform()}), xla:0 to xla:{n - 1}{hint}")
    return d.index


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1


class _Guard(torch._C._acc.DeviceGuard):
    """torch's Python guard asks type_() on every device/stream query, and
    autograd makes several per op (~2 per traced op in a backward step), each
    through a pybind11 override lookup. The instance attribute below answers
    without a bound method or a Python frame (a C-level partial)."""

    def __init__(self):
        super().__init__()
        self.type_ = functools.partial(operator.itemgetter(0), (_PRIVATEUSE1,))


def register() -> None:
    global _done
    if _done:
        return
    if torch._C._get_privateuse1_backend_name() != "xla":
        torch.utils.rename_privateuse1_backend("xla")
    torch._register_device_module("xla", _DeviceModule())
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    _done = True
