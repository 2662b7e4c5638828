"""A sharded checkpoint in every process of `python -m torch_xla_core.launch
--nproc 2 --devices 2` (tests/test_sharded_checkpoint.py): two AdamW steps
of a data- and tensor-parallel MLP on one global 2x2 mesh, dcp.save with
SPMDSavePlanner into argv[1]/ckpt, torch.save of the full state dict, then
dcp.load into a model sharded another way (a 1-D mesh over the devices in
another order); each process writes what it saw to argv[1]/rank<r>.json."""
import json, os, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import torch_xla_core as txc, torch_xla_core.sharding as xs
from torch_xla_core import metrics
from torch_xla_core.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
import mlp_job

out = sys.argv[1]
dist.init_process_group("gloo")
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = mlp_job.global_mesh((2, n // 2), ("data", "model"))
model = mlp_job.mlp(mesh)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in mlp_job.train(model, opt, mesh, 2):
    pass

metrics.clear()
dcp.save({"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=os.path.join(out, "ckpt"),
         planner=SPMDSavePlanner())
written = metrics.counters().get("checkpoint_write_piece", 0)
torch.save(model.state_dict(), os.path.join(out, f"full{rank}.pt"))  # every process: the gather is collective
saved = {k: v.cpu() for k, v in model.state_dict().items()}
saved_avg = [opt.state[p]["exp_avg"].cpu() for p in model.parameters()]

# load into a model laid out another way: a 1-D mesh, devices reversed, other specs
model2 = mlp_job.mlp()
mesh2 = xs.Mesh(list(reversed(range(n))), (n,), ("x",))
xs.mark_sharding(model2[0].weight, mesh2, (None, "x"))
xs.mark_sharding(model2[2].weight, mesh2, ("x", None))
xs.mark_sharding(model2[2].bias, mesh2, ("x",))
opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
x = torch.randn(8, 16).to("xla")
xs.mark_sharding(x, mesh2, ("x", None))
model2(x).sum().backward(); opt2.step(); opt2.zero_grad(); txc.sync()  # optimizer state to load into
state = {"model": model2.state_dict(), "optim": opt2.state_dict()}
metrics.clear()
dcp.load(state, checkpoint_id=os.path.join(out, "ckpt"), planner=SPMDLoadPlanner())
opt2.load_state_dict(state["optim"])
read = metrics.counters().get("checkpoint_read_piece", 0)
res = {
    "rank": rank, "written": written, "read": read,
    "model_equal": all(torch.equal(v.cpu(), saved[k]) for k, v in model2.state_dict().items()),
    "avg_equal": all(torch.equal(opt2.state[p]["exp_avg"].cpu(), a) for p, a in zip(model2.parameters(), saved_avg)),
    "step": [float(opt2.state[p]["step"]) for p in model2.parameters()],
    "spec": list(xs.get_sharding(model2[0].weight).partition_spec),
    "local": [[s.device, list(s.shape)] for s in xs.local_shards(model2[0].weight)],
}
json.dump(res, open(os.path.join(out, f"rank{rank}.json"), "w"))
dist.destroy_process_group()
