"""Run by tests/test_fsdp.py under `torch_xla_core.launch --nproc 2
--devices 1`: FSDP2 (fully_shard per Linear and on the root, on
init_device_mesh("xla", (2,))) and DDP over the "xla" backend, trained
on this rank's half batch; FSDP2 from the same seed in every rank
(fully_shard keeps each rank's chunk of its own copy), DDP from
rank-dependent weights (its broadcast gives rank 0's, the same). Each process writes
OUT/rank{r}.json:
  fsdp / fsdp_keep: parameters (full tensors) after each step, with
    reshard_after_forward True / False, SGD; executions per step; the local
    shard's shape; the step's StableHLO collectives;
  fsdp_adam: parameters after 3 AdamW steps;
  ddp: DDP's parameters after each step (SGD);
  fallbacks: ops that ran on the CPU (metrics.fallbacks())."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import torch_xla_core as txc
from torch_xla_core import metrics

out_dir = sys.argv[1]
dist.init_process_group("xla", init_method="xla://")
r, n = dist.get_rank(), dist.get_world_size()
res = {"rank": r}


def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")


def batches(k):
    g = torch.Generator().manual_seed(2)
    for _ in range(k):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        yield x[4 * r:4 * r + 4].to("xla"), y[4 * r:4 * r + 4].to("xla")


def full(p):
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().tolist()


def train(model, opt, steps=3, hlo_of_first=False):
    out, execs, hlo = [], [], ""
    for i, (xb, yb) in enumerate(batches(steps)):
        before = metrics.counter_value("execute") or 0
        ((model(xb) - yb) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        if i == 0 and hlo_of_first:
            hlo = txc.debug.stablehlo()
        txc.sync()
        execs.append((metrics.counter_value("execute") or 0) - before)
        out.append([full(p) for p in model.parameters()])
    return out, execs, hlo


mesh = init_device_mesh("xla", (n,))
for key, reshard in (("fsdp", True), ("fsdp_keep", False)):
    model = net()
    for m in (model[0], model[2], model):
        fully_shard(m, mesh=mesh, reshard_after_forward=reshard)
    params, execs, hlo = train(model, torch.optim.SGD(model.parameters(), lr=0.1), hlo_of_first=True)
    res[key] = {"params": params, "executions": execs, "shard": list(model[0].weight.to_local().shape),
                "collectives": {op: hlo.count(f'"stablehlo.{op}"') for op in ("all_gather", "reduce_scatter",
                                                                                "all_reduce")}}

model = net()
for m in (model[0], model[2], model):
    fully_shard(m, mesh=mesh)
res["fsdp_adam"] = train(model, torch.optim.AdamW(model.parameters(), lr=0.01))[0][-1]

torch.manual_seed(r)  # rank-dependent: DDP's initial broadcast gives rank 0's
ddp_net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
if r == 0:
    ddp_net.load_state_dict(net().state_dict())
ddp = torch.nn.parallel.DistributedDataParallel(ddp_net)
res["ddp"] = train(ddp, torch.optim.SGD(ddp_net.parameters(), lr=0.1))[0]

res["fallbacks"] = metrics.fallbacks()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
