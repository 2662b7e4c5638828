"""A data-parallel step over a mesh spanning every process, in each process
of a job started by torchrun, srun or a PyTorchJob with no TXC_* variable
(tests/test_launchers.py); then torch.distributed's gloo process group over
the same processes (init_process_group joins the store the runtime met
through). Each process writes <out>/rank<r>.json."""
import json, os, sys
import torch, torch.distributed as dist, torch_xla_core as txc
from jax._src import distributed
from torch_xla_core import runtime
import mlp_job
model, mesh = mlp_job.mlp(), mlp_job.global_mesh()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = [loss.item() for loss, _ in mlp_job.train(model, opt, mesh, 3)]
params = [p.cpu().tolist() for p in model.parameters()]
if "MASTER_ADDR" in os.environ:  # torch's own process group beside ours
    dist.init_process_group("gloo", rank=txc.global_ordinal(), world_size=txc.world_size())
    t = torch.tensor([txc.global_ordinal() + 1.0])
    dist.all_reduce(t)
    pg = t.item()
    dist.destroy_process_group()
else:
    pg = None
out = {"rank": txc.global_ordinal(), "world": txc.world_size(), "local": txc.local_ordinal(), "devices": mesh.size(),
       "launcher": runtime._job.launcher, "coordinator": distributed.global_state.coordinator_address,
       "losses": losses, "params": params, "pg": pg}
json.dump(out, open(os.path.join(sys.argv[1], f"rank{txc.global_ordinal()}.json"), "w"))
