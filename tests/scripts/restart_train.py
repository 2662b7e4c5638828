"""Six AdamW steps over a mesh spanning both processes of
`torchrun --nproc-per-node 2 --max-restarts 1` (tests/test_launchers.py),
a torch.distributed.checkpoint save (SPMDSavePlanner) after steps 2 and 4.
First attempt: process 1 SIGKILLs itself after step 3 (after the save of
step 2, before the next). The restarted group loads the last complete save
and runs to step 6, then trains a fresh model six steps without stopping
(the uninterrupted run, same processes) and writes <out>/rank<r>.json: the
step it resumed from, both runs' parameters, their bitwise equality."""
import json, os, signal, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import torch_xla_core as txc, torch_xla_core.sharding as xs
from torch_xla_core.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner

out = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to("xla")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model, opt, i):
    g = torch.Generator().manual_seed(100 + i)  # step i's batch, whichever attempt runs it
    x, y = torch.randn(8, 16, generator=g).to("xla"), torch.randn(8, 8, generator=g).to("xla")
    xs.mark_sharding(x, mesh, ("data", None)); xs.mark_sharding(y, mesh, ("data", None))
    torch.nn.functional.mse_loss(model(x), y).backward(); opt.step(); opt.zero_grad(); txc.sync()


model, opt = make()
saves = sorted(int(d[4:]) for d in os.listdir(out) if d.startswith("step") and
               os.path.exists(os.path.join(out, d, ".metadata"))) if os.path.isdir(out) else []
start = saves[-1] if saves else 0
if start:
    step(model, opt, 0)  # optimizer state to load into (every value is overwritten)
    state = {"model": model.state_dict(), "optim": opt.state_dict()}
    dcp.load(state, checkpoint_id=os.path.join(out, f"step{start}"), planner=SPMDLoadPlanner())
    opt.load_state_dict(state["optim"])
for i in range(start + 1, 7):
    step(model, opt, i)
    if i in (2, 4):
        dcp.save({"model": model.state_dict(), "optim": opt.state_dict()},
                 checkpoint_id=os.path.join(out, f"step{i}"), planner=SPMDSavePlanner())
    if attempt == 0 and i == 3 and rank == 1:
        open(os.path.join(out, "killed"), "w").write(str(i))
        os.kill(os.getpid(), signal.SIGKILL)
resumed = [p.cpu() for p in model.parameters()]
model, opt = make()
for i in range(1, 7):
    step(model, opt, i)
straight = [p.cpu() for p in model.parameters()]
json.dump({"attempt": attempt, "start": start, "equal": all(torch.equal(a, b) for a, b in zip(resumed, straight)),
           "resumed": [p.tolist() for p in resumed], "straight": [p.tolist() for p in straight]},
          open(os.path.join(out, f"rank{rank}.json"), "w"))
dist.destroy_process_group()
