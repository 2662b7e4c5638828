"""torch_xla.utils.serialization (xser): save and load a state dict of xla
tensors. save writes it as xm.save does (process 0 writes, atomically:
txc.save); load gives CPU tensors, as torch_xla's does. The file is
torch.save's format, not torch_xla's tensor-per-file folder."""
import torch

from ...._features import serialization

__all__ = ["save", "load"]


def save(data, path, master_only: bool = True, global_master: bool = False) -> None:
    """Writes `data` (xla tensors written as CPU tensors) to path."""
    serialization.save(data, path, master_only=master_only, global_master=global_master)


def load(path):
    """What save wrote, its tensors on the CPU."""
    return torch.load(path, map_location="cpu", weights_only=False)
