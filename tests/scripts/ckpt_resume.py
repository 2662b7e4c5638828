"""Training with txc.checkpoint.CheckpointManager (tests/test_checkpoint_manager.py):
`first DIR K M OUT`: K AdamW steps of a small MLP with dropout (the xla RNG)
on a shuffled DataLoader (torch's RNG) through ResumableLoader(DeviceLoader),
an LR scheduler, an async save at step K, M more steps; `resume DIR K M OUT`:
a fresh process restores the latest step (K) and trains M steps. Both write
the final parameters, optimizer state, losses and scheduler LR to OUT."""
import sys

import torch
import torch_xla_core as txc

mode, folder, k, m, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                            torch.nn.Linear(32, 4)).to("xla")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
data = torch.utils.data.TensorDataset(torch.randn(40, 8, generator=torch.Generator().manual_seed(1)),
                                      torch.randn(40, 4, generator=torch.Generator().manual_seed(2)))
loader = txc.checkpoint.ResumableLoader(
    txc.data.DeviceLoader(torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)))  # 5 batches an epoch
mngr = txc.checkpoint.CheckpointManager(folder, keep=2)
items = dict(model=model, optimizer=opt, scheduler=sched, loader=loader)
step = 0
if mode == "resume":
    step = mngr.restore(**items)
    assert step == k, step
    assert not opt.state or all(v.device.type == ("cpu" if n == "step" else "xla")
                                for s in opt.state.values() for n, v in s.items())
losses = []
stop = k + m
while step < stop:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        txc.sync()
        step += 1
        if step > k:
            losses.append(loss.detach().cpu())
        if mode == "first" and step == k:
            mngr.save(step, **items)  # async: the next steps train while it writes
        if step == stop:
            break
mngr.wait_until_finished()
torch.save({"params": {n: p.detach().cpu() for n, p in model.named_parameters()},
            "avg": [opt.state[p]["exp_avg"].cpu() for p in model.parameters()],
            "losses": losses, "lr": sched.get_last_lr(), "epoch": loader.epoch, "steps": mngr.all_steps()}, out)
