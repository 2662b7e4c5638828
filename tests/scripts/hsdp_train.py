"""Run by tests/test_fsdp.py under `torch_xla_core.launch --nproc 4
--devices 1`: FSDP2 on a 2-D mesh (HSDP: init_device_mesh("xla", (2, 2)),
replicated over dim 0, sharded over dim 1), fully_shard per Linear and on
the root, 3 SGD steps, each rank on its quarter of the batch. Each process
writes OUT/rank{r}.json: the parameters (full tensors), the local shard's
shape, executions per step and the first step's StableHLO collectives."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import torch_xla_core as txc
from torch_xla_core import metrics

out_dir = sys.argv[1]
dist.init_process_group("xla", init_method="xla://")
r = dist.get_rank()
mesh = init_device_mesh("xla", (2, 2), mesh_dim_names=("replicate", "shard"))
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
for m in (net[0], net[2], net):
    fully_shard(m, mesh=mesh)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
g = torch.Generator().manual_seed(2)
execs, hlo = [], ""
for i in range(3):
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
    before = metrics.counter_value("execute") or 0
    ((net(x[2 * r:2 * r + 2].to("xla")) - y[2 * r:2 * r + 2].to("xla")) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()
    if i == 0:
        hlo = txc.debug.stablehlo()
    txc.sync()
    execs.append((metrics.counter_value("execute") or 0) - before)
res = {"params": [p.full_tensor().cpu().tolist() for p in net.parameters()],
       "shard": list(net[0].weight.to_local().shape), "executions": execs,
       "collectives": {op: hlo.count(f'"stablehlo.{op}"') for op in ("all_gather", "reduce_scatter", "all_reduce")}}
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
