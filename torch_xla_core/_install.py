"""Everything importing torch_xla_core installs into torch, in one place and
in order (torch_xla_core/__init__.py calls install() once):

  1. the device: PrivateUse1 renamed "xla", its device module, hooks and
     guard (_tracing/device.py);
  2. the tensor: XlaTensor as the wrapper the C++ core makes (_tracing/tensor.py);
  3. the dispatch table: aten overload -> handler, handed to the C++
     dispatcher (_ops), and every op family's handlers (_ops.load_all);
  4. the autograd engine hook (_ops/engine.py), and autograd on the calling
     thread (TXC_AUTOGRAD_THREADS);
  5. autocast("xla") policies and GradScaler's kernels (_features/amp.py);
  6. torch.save/torch.load, pickling and copying of xla tensors
     (_features/serialization.py);
  7. Module.to("xla") keeping tied parameters tied (_features/tying.py);
  8. torch.compile(backend="torch_xla_core"): installed when torch._dynamo
     is imported (_features/dynamo.py; importing it eagerly costs 1-2 s);
  9. torch.distributed's "xla" backend and xla:// init method, and
     handlers for torch's functional collectives (distributed/);
 10. init_process_group's env:// store per round in a job torchrun
     restarted (_runtime/cluster.py: isolate_restarts);
 11. LRScheduler.step deferred inside a txc.compile recording, and a
     device lr it fills bound to its number's buffer (replay/_schedulers.py).

This module is the top of the layers (ARCHITECTURE.md): it may import any."""
import torch

from ._runtime import cluster as _cluster
from ._tracing import device as _device, tensor as _tensor
from . import _ops, config, distributed
from ._features import tying as _tying, amp, dynamo, serialization
from ._ops import engine
from .replay import _schedulers

_done = False


def install() -> None:
    global _done
    if _done:
        return
    _device.register()
    _tensor.configure(torch.device("xla", 0))
    _ops.install_dispatch()
    engine.install()
    # Autograd would run the backward of xla tensors on a device thread of its
    # own, and every op there re-enters Python from that thread; running it on
    # the calling thread traced the 64-layer MLP's forward+backward ~20% faster
    # (bench/trace_overhead.py). This is per thread (torch's TLS): it applies to
    # the thread that imports torch_xla_core. TXC_AUTOGRAD_THREADS=1 keeps torch's
    # default.
    if not config.get("TXC_AUTOGRAD_THREADS"):
        torch._C._set_multithreading_enabled(False)
    _ops.load_all()
    amp.register_handlers()
    amp.install()
    serialization.register()
    _tying.install()
    dynamo.install_hook()
    distributed.install()
    _cluster.isolate_restarts()
    _schedulers.install()
    _done = True
