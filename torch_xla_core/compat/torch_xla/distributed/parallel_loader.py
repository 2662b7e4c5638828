"""torch_xla.distributed.parallel_loader (pl) over txc.data.DeviceLoader:
MpDeviceLoader moves each batch to the device ahead of use (and lays it out
with input_sharding), syncing once per batch as torch_xla does."""
import torch.utils._pytree as pytree

from ...._features import data
from ..core import xla_model


class MpDeviceLoader(data.DeviceLoader):
    """MpDeviceLoader(loader, device, input_sharding=None, loader_prefetch_size=8,
    device_prefetch_size=4, host_to_device_transfer_threads=1): iterating gives
    the loader's batches on `device`; each next batch first ends the step
    (xm.mark_step)."""

    def __init__(self, loader, device, input_sharding=None, loader_prefetch_size: int = 8,
                 device_prefetch_size: int = 4, host_to_device_transfer_threads: int = 1, **kwargs):
        transform = None
        if input_sharding is not None:
            def transform(batch, _s=input_sharding):
                for t in pytree.tree_leaves(batch):
                    if hasattr(t, "shape") and _s.can_apply(t):
                        _s.apply(t)
                return batch
        super().__init__(loader, prefetch=max(1, device_prefetch_size), device=device, mark_step=False,
                         transform=transform)

    def __iter__(self):
        for batch in super().__iter__():
            xla_model.mark_step()
            yield batch


class ParallelLoader:
    """ParallelLoader(loader, devices): per_device_loader(device) is an
    MpDeviceLoader of that device."""

    def __init__(self, loader, devices, **kwargs):
        self._loader, self._kwargs = loader, kwargs
        self._devices = list(devices)

    def per_device_loader(self, device) -> MpDeviceLoader:
        return MpDeviceLoader(self._loader, device, **self._kwargs)
