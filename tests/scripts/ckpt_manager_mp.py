"""txc.checkpoint.CheckpointManager in every process of `python -m
torch_xla_core.launch --nproc 2 --devices 2` (tests/test_checkpoint_manager.py):
an MLP sharded over a global 2x2 mesh trains 3 AdamW steps with an async
save after each (keep=2); a fresh model and optimizer sharded the same way
restore the latest step; each process writes what it saw to argv[1]/rank<r>.json."""
import json, os, sys
import torch, torch.distributed as dist
import torch_xla_core as txc, torch_xla_core.sharding as xs
import mlp_job

out = sys.argv[1]
dist.init_process_group("gloo")
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = mlp_job.global_mesh((2, n // 2), ("data", "model"))


def make():
    model = mlp_job.mlp(mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


model, opt = make()
mngr = txc.checkpoint.CheckpointManager(os.path.join(out, "ckpt"), keep=2)
for step, _ in enumerate(mlp_job.train(model, opt, mesh, 3), start=1):
    mngr.save(step, model=model, optimizer=opt)
mngr.wait_until_finished()
saved = {k: v.cpu() for k, v in model.state_dict().items()}
saved_avg = [opt.state[p]["exp_avg"].cpu() for p in model.parameters()]
draws = (torch.randn(3), torch.rand(3, device="xla").cpu())

model2, opt2 = make()  # fresh: other values after a seed change, no optimizer state yet
with torch.no_grad():
    for p in model2.parameters():
        p.mul_(3)
torch.manual_seed(123)
restored = mngr.restore(model=model2, optimizer=opt2)
again = (torch.randn(3), torch.rand(3, device="xla").cpu())
res = {
    "rank": rank, "restored": restored,
    "params_equal": all(torch.equal(v.cpu(), saved[k]) for k, v in model2.state_dict().items()),
    "avg_equal": all(torch.equal(opt2.state[p]["exp_avg"].cpu(), a) for p, a in zip(model2.parameters(), saved_avg)),
    "rng_equal": all(torch.equal(a, b) for a, b in zip(draws, again)),
    "spec": list(xs.get_sharding(opt2.state[model2[0].weight]["exp_avg"]).partition_spec),
}
json.dump(res, open(os.path.join(out, f"rank{rank}.json"), "w"))
dist.destroy_process_group()
