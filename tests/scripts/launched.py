"""A data-parallel step over a mesh spanning every process, in each process
of a job started by torchrun, srun or a PyTorchJob with no TXC_* variable
(tests/test_launchers.py); then torch.distributed's gloo process group over
the same processes (init_process_group joins the store the runtime met
through). Each process writes <out>/rank<r>.json."""
import json, os, sys
import torch, torch.distributed as dist, torch_xla_core as txc, torch_xla_core.sharding as xs
from jax._src import distributed
from torch_xla_core import runtime
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to("xla")
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
losses = []
for _ in range(3):
    x, y = torch.randn(8, 16, generator=g).to("xla"), torch.randn(8, 8, generator=g).to("xla")
    xs.mark_sharding(x, mesh, ("data", None)); xs.mark_sharding(y, mesh, ("data", None))
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad(); txc.sync()
    losses.append(loss.item())
params = [p.cpu().tolist() for p in model.parameters()]
if "MASTER_ADDR" in os.environ:  # torch's own process group beside ours
    dist.init_process_group("gloo", rank=txc.global_ordinal(), world_size=txc.world_size())
    t = torch.tensor([txc.global_ordinal() + 1.0])
    dist.all_reduce(t)
    pg = t.item()
    dist.destroy_process_group()
else:
    pg = None
out = {"rank": txc.global_ordinal(), "world": txc.world_size(), "local": txc.local_ordinal(), "devices": n,
       "launcher": runtime._job.launcher, "coordinator": distributed.global_state.coordinator_address,
       "losses": losses, "params": params, "pg": pg}
json.dump(out, open(os.path.join(sys.argv[1], f"rank{txc.global_ordinal()}.json"), "w"))
