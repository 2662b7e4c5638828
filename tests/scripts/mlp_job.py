"""What the multi-process test scripts share (dp_train.py, launched.py,
dcp_ckpt.py, ckpt_manager_mp.py, restart_train.py): the seeded 16-32-8 MLP
they train, the mesh over every process's devices, and the AdamW step on
batches sharded over its "data" axis (the tests compare with CPU eager:
tests/test_multiprocess.py's _reference); and the HSDP training of
hsdp_train.py and subgroups_train.py (tests/test_fsdp.py's _whole_batch is
its reference). The scripts import it by name: a script's folder is first
on sys.path."""
import torch
from torch.distributed.fsdp import fully_shard

import torch_xla_core as txc
import torch_xla_core.sharding as xs


def global_mesh(shape=None, names=("data",)):
    """A mesh over every process's devices (default: 1-D, "data")."""
    n = len(txc.runtime.global_devices())
    return xs.Mesh(range(n), shape or (n,), names)


def mlp(mesh=None):
    """The MLP on xla from seed 0; with a mesh, tensor-parallel over its
    "model" axis (the first layer's rows, the second's columns)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to("xla")
    if mesh is not None:
        xs.mark_sharding(model[0].weight, mesh, ("model", None))
        xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    return model


def batch(g, mesh):
    """An (8, 16) input and (8, 8) target drawn from generator g, split over the mesh's "data" axis."""
    x, y = torch.randn(8, 16, generator=g).to("xla"), torch.randn(8, 8, generator=g).to("xla")
    xs.mark_sharding(x, mesh, ("data", None))
    xs.mark_sharding(y, mesh, ("data", None))
    return x, y


def step(model, opt, x, y):
    """One MSE training step, ended by txc.sync(); returns the loss."""
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    txc.sync()
    return loss


def train(model, opt, mesh, steps):
    """`steps` steps on the batches of generator seed 1; yields (loss, input) after each."""
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x, y = batch(g, mesh)
        yield step(model, opt, x, y), x


def hsdp_net(mesh):
    """The seeded 8-16-4 MLP under FSDP2 on a 2-D mesh: fully_shard per Linear and on the root."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
    for m in (net[0], net[2], net):
        fully_shard(m, mesh=mesh)
    return net


def hsdp_train(net, rank, after_step=None):
    """3 SGD steps (lr 0.1) of hsdp_net's model, each of 4 ranks on its
    quarter of the batches of generator seed 2; each step ends with
    after_step(i), which syncs (default: txc.sync())."""
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(2)
    for i in range(3):
        x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
        ((net(x[2 * rank:2 * rank + 2].to("xla")) - y[2 * rank:2 * rank + 2].to("xla")) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
        txc.sync() if after_step is None else after_step(i)
