"""Six AdamW steps over a mesh spanning both processes of
`torchrun --nproc-per-node 2 --max-restarts 1` (tests/test_launchers.py),
saved by txc.checkpoint.CheckpointManager (async) after steps 2 and 4.
First attempt: process 1 SIGKILLs itself after step 3 (once the save of
step 2 is on disk, before the next). The restarted group restores the latest
complete save and runs to step 6, then trains a fresh model six steps
without stopping (the uninterrupted run, same processes) and writes
<out>/rank<r>.json: the step it resumed from, both runs' parameters, their
bitwise equality. torch's gloo group is init_process_group's plain
env:// one: a restarted round meets in the store the last round used."""
import json, os, signal, sys
import torch, torch.distributed as dist
import torch_xla_core as txc
import mlp_job

out = sys.argv[1]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo")
rank = txc.global_ordinal()
mesh = mlp_job.global_mesh()


def make():
    model = mlp_job.mlp()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def step(model, opt, i):
    g = torch.Generator().manual_seed(100 + i)  # step i's batch, whichever attempt runs it
    mlp_job.step(model, opt, *mlp_job.batch(g, mesh))


model, opt = make()
mngr = txc.checkpoint.CheckpointManager(os.path.join(out, "ckpt"), keep=2)
start = mngr.restore(model=model, optimizer=opt) or 0  # the latest complete save; None on the first attempt
for i in range(start + 1, 7):
    step(model, opt, i)
    if i in (2, 4):
        mngr.save(i, model=model, optimizer=opt)
    if attempt == 0 and i == 3:
        mngr.wait_until_finished()  # every process: the step-2 save is committed, the kill loses step 3 only
        if rank == 1:
            open(os.path.join(out, "killed"), "w").write(str(i))
            os.kill(os.getpid(), signal.SIGKILL)
mngr.wait_until_finished()
resumed = [p.cpu() for p in model.parameters()]
model, opt = make()
for i in range(1, 7):
    step(model, opt, i)
straight = [p.cpu() for p in model.parameters()]
json.dump({"attempt": attempt, "start": start, "steps": mngr.all_steps(),
           "equal": all(torch.equal(a, b) for a, b in zip(resumed, straight)),
           "resumed": [p.tolist() for p in resumed], "straight": [p.tolist() for p in straight]},
          open(os.path.join(out, f"rank{rank}.json"), "w"))
mngr.close()
dist.destroy_process_group()
