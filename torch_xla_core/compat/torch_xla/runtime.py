"""torch_xla.runtime (xr) over torch_xla_core: the platform, device counts,
process ordinals, SPMD mode."""
import os

import jax

from ... import config
from ..._runtime import runtime

_spmd = False


def set_device_type(pjrt_device: str) -> None:
    """Chooses the platform (PJRT_DEVICE: CPU, CUDA, TPU); as in torch_xla it
    takes effect only before the runtime starts (the first xla op)."""
    os.environ["PJRT_DEVICE"] = pjrt_device.upper()


def device_type() -> str:
    """'CPU', 'CUDA' or 'TPU': the platform the xla devices are on."""
    return runtime.platform().upper()


def is_bf16_supported() -> bool:
    """True: every platform computes bfloat16."""
    return True


def local_process_count() -> int:
    """Processes on this machine (TXC_NUM_PROCESSES when started by hand, else 1)."""
    return config.get("TXC_NUM_PROCESSES") if config.get("TXC_COORDINATOR") else 1


def global_device_count() -> int:
    """Every device of every process."""
    return len(runtime.global_devices())


def world_size() -> int:
    """Processes in the job; 1 under SPMD (one process drives every device), as torch_xla."""
    if _spmd:
        return 1
    runtime.backend()
    return jax.process_count()


def local_device_count() -> int:
    """Devices this process drives."""
    return runtime.device_count()


def addressable_device_count() -> int:
    """Devices this process drives; 1 under SPMD (the virtual device xla:0), as torch_xla."""
    return 1 if _spmd else runtime.device_count()


def global_ordinal() -> int:
    """This process's rank in the job."""
    runtime.backend()
    return jax.process_index()


def local_ordinal() -> int:
    """This process's rank on its machine (TXC_LOCAL_RANK)."""
    return config.get("TXC_LOCAL_RANK")


def process_index() -> int:
    """This process's rank in the job (global_ordinal())."""
    return global_ordinal()


def process_count() -> int:
    """Processes in the job."""
    runtime.backend()
    return jax.process_count()


def host_index() -> int:
    """This process's rank in the job (global_ordinal())."""
    return global_ordinal()


def global_runtime_device_count() -> int:
    """Every physical device of every process (the size of a full mesh)."""
    return len(runtime.global_devices())


def addressable_runtime_device_count() -> int:
    """Physical devices this process drives."""
    return runtime.device_count()


def runtime_device_attributes(device) -> dict:
    """name, platform and id of an xla device ('xla:1' or torch.device)."""
    index = int(str(device).split(":")[1]) if ":" in str(device) else 0
    d = runtime.devices()[index]
    return {"name": str(d), "platform": device_type(), "id": int(d.id)}


def global_runtime_device_attributes() -> list:
    """name, platform and id of every device of every process."""
    return [{"name": str(d), "platform": device_type(), "id": int(d.id)} for d in runtime.global_devices()]


def use_spmd(auto: bool = False) -> None:
    """SPMD mode: tensors live on xla:0, mark_sharding lays them out over a
    mesh. torch_xla_core partitions any graph with sharded values without
    this call; it only changes what world_size() and
    addressable_device_count() report, as in torch_xla. auto=True (XLA's
    auto-sharding) is not supported."""
    global _spmd
    if auto:
        raise NotImplementedError("use_spmd(auto=True): XLA auto-sharding is not supported by torch_xla_core; "
                                  "lay tensors out with xs.mark_sharding")
    _spmd = True
    os.environ["XLA_USE_SPMD"] = "1"  # as torch_xla sets it (its scripts read and unset it); we do not read it


def is_spmd() -> bool:
    """Whether use_spmd() was called."""
    return _spmd


def initialize_cache(path: str, readonly: bool = False) -> None:
    """The persistent compile cache's directory (TXC_COMPILE_CACHE); call it
    before the first compile. readonly is not supported: entries are written."""
    if readonly:
        raise NotImplementedError("initialize_cache(readonly=True): torch_xla_core's compile cache always writes "
                                  "new entries; point TXC_COMPILE_CACHE at a copy instead")
    os.environ["TXC_COMPILE_CACHE"] = path
