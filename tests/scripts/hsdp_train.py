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

import torch_xla_core as txc
from torch_xla_core import metrics
from mlp_job import hsdp_net, hsdp_train

out_dir = sys.argv[1]
dist.init_process_group("xla", init_method="xla://")
r = dist.get_rank()
mesh = init_device_mesh("xla", (2, 2), mesh_dim_names=("replicate", "shard"))
net = hsdp_net(mesh)
execs, hlo, done = [], [""], [metrics.counter_value("execute") or 0]


def after_step(i):
    """Keeps the first step's StableHLO and counts each step's executions."""
    if i == 0:
        hlo[0] = txc.debug.stablehlo()
    txc.sync()
    now = metrics.counter_value("execute") or 0
    execs.append(now - done[0])
    done[0] = now


hsdp_train(net, r, after_step)
hlo = hlo[0]
res = {"params": [p.full_tensor().cpu().tolist() for p in net.parameters()],
       "shard": list(net[0].weight.to_local().shape), "executions": execs,
       "collectives": {op: hlo.count(f'"stablehlo.{op}"') for op in ("all_gather", "reduce_scatter", "all_reduce")}}
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
