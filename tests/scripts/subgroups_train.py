"""Run by tests/test_subgroups.py under `torch_xla_core.launch --nproc 4
--devices 1`: the default group is "xla"; each sub-group is made twice,
on "xla" and on "gloo", and each collective on it runs twice, on xla
tensors and on the same values as CPU tensors over gloo. Each process
writes OUT/rank{r}.json:
  groups: per sub-group (rows [0,1],[2,3]; columns [0,2],[1,3]; a
    singleton), each collective's xla and gloo results;
  hlo: the replica groups of a row all-reduce's StableHLO;
  mesh: a 2-D DeviceMesh ("dp", "tp") from those groups: its sub-meshes'
    ranks, and DTensor on it (Shard/Replicate per dim, redistribute, a
    matmul) against the full tensors; torch's init_device_mesh("xla");
  hsdp: FSDP2 on that mesh (HSDP), parameters after 3 SGD steps; the
    collectives the DTensor code above left pending run in the first
    step's graph, whose other ops differ by rank (rank 1's shard of w is
    4x1, the others' 4x2): XLA must still take every collective in trace
    order on every rank (it hung when its scheduler reordered them);
  bad: the error of a sub-group whose size does not divide the world."""
import json
import os
import re
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard

import torch_xla_core as txc
from torch_xla_core import distributed as xd
from mlp_job import hsdp_net, hsdp_train

out_dir = sys.argv[1]
dist.init_process_group("xla", init_method="xla://")
r, n = dist.get_rank(), dist.get_world_size()
assert n == 4, n
res = {"rank": r}


def collectives(gs):
    """Every collective of the "xla" backend on group gs["xla"] (this rank a
    member), and the same on CPU tensors over gs["cpu"] (gloo): [xla values],
    [cpu values]."""
    k, me = gs["xla"].size(), dist.get_rank(gs["xla"])
    src = dist.get_global_rank(gs["xla"], k - 1)  # the group's last member

    def run(dev):
        g = gs[dev]
        x = torch.arange(4.0, device=dev) + 10 * r
        s, avg, mx, b = x.clone(), x.clone(), x.clone(), x.clone()
        dist.all_reduce(s, group=g)
        dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=g) if dev == "xla" else (
            dist.all_reduce(avg, group=g), avg.div_(k))  # gloo has no AVG
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=g)
        gl = [torch.zeros(4, device=dev) for _ in range(k)]
        dist.all_gather(gl, x, group=g)
        gt = torch.zeros(4 * k, device=dev)
        dist.all_gather_into_tensor(gt, x, group=g)
        rs = torch.zeros(4 // k if k <= 4 else 1, device=dev)
        dist.reduce_scatter_tensor(rs, x * (me + 1), group=g)
        dist.broadcast(b, src=src, group=g)
        aa = torch.zeros(4, device=dev)
        dist.all_to_all_single(aa, x, group=g)
        return [s, avg, mx, *gl, gt, rs, b, aa]

    return [[t.cpu().tolist() for t in run(dev)] for dev in ("xla", "cpu")]


def new_group(ranks):
    return {"xla": dist.new_group(ranks), "cpu": dist.new_group(ranks, backend="gloo")}


rows = [new_group([0, 1]), new_group([2, 3])]
cols = [new_group([0, 2]), new_group([1, 3])]
single = [new_group([i]) for i in range(n)]
row, col = rows[r // 2]["xla"], cols[r % 2]["xla"]
res["groups"] = {"row": collectives(rows[r // 2]), "col": collectives(cols[r % 2]),
                 "single": collectives(single[r])}

x = torch.arange(4.0, device="xla") + 10 * r
dist.all_reduce(x, group=col)
res["hlo"] = re.findall(r"replica_groups = dense<([^>]*)>", txc.debug.stablehlo([x]))

# --- a 2-D DeviceMesh from the groups: dims ("dp", "tp"), rank = 2 * dp + tp
mesh = xd.device_mesh([col, row], [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))
tp, dp = mesh["tp"], mesh["dp"]
res["mesh"] = {"tp_ranks": tp.mesh.tolist(), "dp_ranks": dp.mesh.tolist(),
               "coordinate": mesh.get_coordinate(), "local_ranks": [mesh.get_local_rank("dp"),
                                                                   mesh.get_local_rank("tp")]}
full = torch.arange(32.0, device="xla").reshape(8, 4)
w = torch.arange(12.0, device="xla").reshape(4, 3) / 10
a = xd.distribute_tensor(full, mesh, [Shard(0), Shard(1)])  # rows over dp, columns over tp
b = xd.distribute_tensor(w, mesh, [Replicate(), Shard(1)])
res["mesh"].update({
    "local": a.to_local().cpu().tolist(),
    "full": a.full_tensor().cpu().tolist(),
    "rows_only": a.redistribute(mesh, [Shard(0), Replicate()]).to_local().cpu().tolist(),
    "mm": (a.redistribute(mesh, [Shard(0), Replicate()]) @ b).full_tensor().cpu().tolist(),
    "sum_tp": a.sum(dim=1).redistribute(mesh, [Shard(0), Replicate()]).to_local().cpu().tolist(),
    "sub_mesh_full": xd.distribute_tensor(full, tp, [Shard(1)]).full_tensor().cpu().tolist(),
})
# torch's own init_device_mesh on "xla": the dims' groups made as for any device
m2 = init_device_mesh("xla", (2, 2), mesh_dim_names=("dp", "tp"))
res["init_device_mesh"] = {"groups": [dist.get_process_group_ranks(m2.get_group(d)) for d in ("dp", "tp")],
                           "full": xd.distribute_tensor(full, m2, [Shard(1), Shard(0)]).full_tensor().cpu().tolist(),
                           "coordinate": m2["tp"].get_coordinate()}

# --- HSDP: FSDP2 on the 2-D mesh (replicated over "dp", sharded over "tp"), 3 SGD steps on this rank's quarter
net = hsdp_net(m2)
hsdp_train(net, r)
res["hsdp"] = [p.full_tensor().cpu().tolist() for p in net.parameters()]

# --- a group of 3 on 4 processes: a clear error on its members
three = dist.new_group([0, 1, 2])
if r < 3:
    try:
        dist.all_reduce(torch.ones(2, device="xla"), group=three)
        res["bad"] = None
    except NotImplementedError as e:
        res["bad"] = str(e)
dist.barrier()
with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
dist.destroy_process_group()
