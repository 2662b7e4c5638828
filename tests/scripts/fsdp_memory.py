"""Run by tests/test_fsdp.py under `torch_xla_core.launch --nproc 2
--devices 1`: the device bytes an FSDP2 training step leaves held, with
FSDP2 freeing the unsharded parameters after use ("freed"), with the
storage functions doing nothing on xla tensors (the unsharded parameters
kept on the device between uses, as before they were freed: "kept"), and
with DDP ("ddp"); "after_forward": the same with a sync between forward
and backward. Each is what txc.memory.live_bytes() reports after each step's
sync, less what it reported before the model was made; "unsharded": the
bytes of the model's whole parameters. Writes OUT/rank{r}.json."""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torch_xla_core as txc
from torch_xla_core.distributed import _fsdp

out_dir = sys.argv[1]
dist.init_process_group("xla", init_method="xla://")
r, n = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("xla", (n,))


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 32)).to("xla")


def sharded():
    model = net()
    for m in (model[0], model[2], model):
        fully_shard(m, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def replicated():
    model = net()
    return torch.nn.parallel.DistributedDataParallel(model), torch.optim.SGD(model.parameters(), lr=0.1)


def held(make, steps=3, sync_forward=False):
    """live_bytes after each step's sync, less before make(); with
    sync_forward, after the sync between forward and backward instead."""
    gc.collect()
    txc.sync()
    base = txc.memory.live_bytes()
    model, opt = make()
    g, out = torch.Generator().manual_seed(2), []
    for _ in range(steps):
        x = torch.randn(8, 64, generator=g)[4 * r:4 * r + 4].to("xla")
        loss = model(x).square().mean()
        if sync_forward:
            txc.sync()
            out.append(txc.memory.live_bytes() - base)
        loss.backward()
        opt.step()
        opt.zero_grad()
        txc.sync()
        del x, loss
        gc.collect()
        if not sync_forward:
            out.append(txc.memory.live_bytes() - base)
    return out


def kept(*args, **kw):
    """held() with FSDP2's storage functions doing nothing on xla tensors."""
    versions = dict(_fsdp._XLA_VERSIONS)
    _fsdp._XLA_VERSIONS.update(free_storage=lambda t: None, alloc_storage=lambda t: None)
    try:
        return held(*args, **kw)
    finally:
        _fsdp._XLA_VERSIONS.update(versions)


res = {"unsharded": sum(p.numel() * p.element_size() for p in net().parameters())}
held(sharded, steps=2)  # the numbers a step uses (lr, ...) are cached buffers: made here, in every base below
for key, sync_forward in (("between_steps", False), ("after_forward", True)):
    res[key] = {"freed": held(sharded, sync_forward=sync_forward), "kept": kept(sharded, sync_forward=sync_forward),
                "ddp": held(replicated, sync_forward=sync_forward)}
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
