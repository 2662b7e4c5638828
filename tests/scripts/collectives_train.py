"""Run by tests/test_collectives.py under `torch_xla_core.launch --nproc 2
--devices 1`: each process writes OUT/rank{r}.json with what it computed.
  collectives: xm-style collectives on rank-dependent values;
  example: issue 42's txc.optimizer_step loop on this rank's half batch
    (weights, executions per step, the step's StableHLO);
  replayed: the same loop under txc.compile (weights, replay counters);
  replayed_donated: zero_grad first under txc.compile, the old grads donated on
    rank 0 and held (so not donated) on rank 1 (weights, grad addresses);
  ddp: DistributedDataParallel over the "xla" backend from rank-dependent
    initial weights, small buckets (weights, executions per step);
  ddp_txc, ddp_dynamo: the DDP step under txc.compile (small buckets) and
    torch.compile(backend="torch_xla_core") (one bucket: dynamo's DDP
    optimizer wants the first bucket no larger than the others), 6 steps
    (weights, executions per step, counters); ddp_dynamo_ca: the same under
    torch.compile with compiled autograd and optimize_ddp="python_reducer"
    (torch's way to trace DDP's reducer into the backward graph);
  dist: dist.* collectives, funcol and DTensor;
  host: rendezvous and mesh_reduce;
  cpu, mixed: CPU tensors' collectives (all_reduce, all_gather_object,
    gather, send/recv) and an xla all_reduce, on the "xla" group and after
    init_process_group("cpu:gloo,xla:xla")."""
import json
import os
import sys

import torch
import torch.distributed as dist

import torch_xla_core as txc
from torch_xla_core import distributed as xd
from torch_xla_core import executor, metrics

out_dir = sys.argv[1]
r, n = txc.global_ordinal(), txc.world_size()
res = {"rank": r, "world": n}


def cpu(t):
    return t.detach().cpu().tolist()


def batches(k, rows, cols_in, cols_out, seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(k):
        x, y = torch.randn(rows, cols_in, generator=g), torch.randn(rows, cols_out, generator=g)
        h = rows // n
        yield x[h * r:h * (r + 1)].to("xla"), y[h * r:h * (r + 1)].to("xla")


def executions(fn):
    before = metrics.counter_value("execute") or 0
    fn()
    return (metrics.counter_value("execute") or 0) - before


# --- collectives
x = torch.arange(4.0, device="xla") + 10 * r
res["collectives"] = {
    "sum": cpu(xd.all_reduce("sum", x)), "max_scaled": cpu(xd.all_reduce("max", x, scale=0.5)),
    "gather": cpu(xd.all_gather(x)), "gather_dim1": cpu(xd.all_gather(x.reshape(2, 2), dim=1)),
    "scatter": cpu(xd.reduce_scatter("sum", x, 1.0, 0, n)), "to_all": cpu(xd.all_to_all(x, 0, 0, n)),
    "permute": cpu(xd.collective_permute(x, [[0, 1], [1, 0]])),
}
pair = [torch.full((2,), float(r + 1), device="xla"), torch.full((3,), 10.0 * (r + 1), device="xla")]
xd.all_reduce("sum", pair)
res["collectives"]["list_in_place"] = [cpu(t) for t in pair]

# --- issue 42's example
torch.manual_seed(0)
m = torch.nn.Linear(8, 1).to("xla")
opt = torch.optim.SGD(m.parameters(), lr=0.1)
execs, hlo = [], ""
for i, (xb, yb) in enumerate(batches(3, 8, 8, 1, seed=1)):
    ((m(xb) - yb) ** 2).mean().backward()
    if i == 0:
        xd.reduce_gradients(opt)
        opt.step()
        hlo = txc.debug.stablehlo()
        execs.append(executions(txc.sync))
    else:
        execs.append(executions(lambda: txc.optimizer_step(opt, barrier=True)))
    opt.zero_grad()
res["example"] = {"params": [cpu(p) for p in m.parameters()], "executions": execs,
                  "all_reduce": hlo.count("stablehlo.all_reduce"), "replicas": "mhlo.num_replicas = 2" in hlo}

# --- the same loop under txc.compile
torch.manual_seed(0)
m = torch.nn.Linear(8, 1).to("xla")
opt = torch.optim.SGD(m.parameters(), lr=0.1)


@txc.compile
def step(xb, yb):
    ((m(xb) - yb) ** 2).mean().backward()
    txc.optimizer_step(opt)
    opt.zero_grad()


metrics.clear()
execs = [executions(lambda: (step(xb, yb), txc.sync())) for xb, yb in batches(6, 8, 8, 1, seed=1)]
res["replayed"] = {"params": [cpu(p) for p in m.parameters()], "counters": metrics.counters(), "executions": execs}

# --- zero_grad first, so that each replay hands the old grads to its launch donated (once that executable,
# compiled in the background, is done); rank 1 holds its weight's grads, so its replays free and make them with
# the recorded executable: the two ranks run different executables around the same all-reduce
torch.manual_seed(0)
m = torch.nn.Linear(8, 1).to("xla")
opt = torch.optim.SGD(m.parameters(), lr=0.1)


@txc.compile
def step_zero_first(xb, yb):
    opt.zero_grad()
    ((m(xb) - yb) ** 2).mean().backward()
    txc.optimizer_step(opt)


metrics.clear()
held, memory, execs = [], [], []
for i, (xb, yb) in enumerate(batches(6, 8, 8, 1, seed=1)):
    execs.append(executions(lambda: (step_zero_first(xb, yb), txc.sync())))
    if i == 2:
        executor.wait_compiles()
    memory.append(m.weight.grad._lt.data.unsafe_buffer_pointer())
    if r == 1:
        held.append((m.weight.grad, cpu(m.weight.grad)))
res["replayed_donated"] = {"params": [cpu(p) for p in m.parameters()], "counters": metrics.counters(),
                           "executions": execs, "grad_memory": memory,
                           "held_kept": all(cpu(g) == v for g, v in held)}

# --- DDP over the "xla" backend
dist.init_process_group("xla", init_method="xla://")
torch.manual_seed(r)  # rank-dependent: DDP's initial broadcast makes every rank start from rank 0's
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.0002)  # ~200 bytes: several buckets
opt = torch.optim.SGD(net.parameters(), lr=0.1)
execs = []
for xb, yb in batches(3, 8, 8, 4, seed=2):
    ((ddp(xb) - yb) ** 2).mean().backward()
    opt.step()
    opt.zero_grad()
    execs.append(executions(txc.sync))
res["ddp"] = {"params": [cpu(p) for p in net.parameters()], "executions": execs}

# --- the DDP step under txc.compile and under torch.compile (the dynamo route)
for route in ("txc", "dynamo", "dynamo_ca"):
    ca = route == "dynamo_ca"
    torch._dynamo.reset()  # as a fresh process: nothing compiled under the other route's settings
    patch = torch._dynamo.config.patch(compiled_autograd=ca, optimize_ddp="python_reducer" if ca else True)
    patch.__enter__()
    torch.manual_seed(r)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).to("xla")
    ddp = torch.nn.parallel.DistributedDataParallel(net, bucket_cap_mb=0.0002 if route == "txc" else 25)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)

    def ddp_step(xb, yb):
        ((ddp(xb) - yb) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()

    step = txc.compile(ddp_step) if route == "txc" else torch.compile(ddp_step, backend="torch_xla_core")
    metrics.clear()
    execs = [executions(lambda: (step(xb, yb), txc.sync())) for xb, yb in batches(6, 8, 8, 4, seed=2)]
    res[f"ddp_{route}"] = {"params": [cpu(p) for p in net.parameters()], "executions": execs,
                           "counters": metrics.counters()}
    patch.__exit__(None, None, None)

# --- dist.*, funcol, DTensor
t = torch.arange(3.0, device="xla") + 10 * r
a = t.clone()
dist.all_reduce(a)
avg = t.clone()
dist.all_reduce(avg, op=dist.ReduceOp.AVG)
gl = [torch.zeros(3, device="xla") for _ in range(n)]
dist.all_gather(gl, t)
gt = torch.zeros(3 * n, device="xla")
dist.all_gather_into_tensor(gt, t)
rs = torch.zeros(2, device="xla")
dist.reduce_scatter_tensor(rs, torch.arange(4.0, device="xla") * (r + 1))
b = t.clone()
dist.broadcast(b, src=1)
aa = torch.zeros(4, device="xla")
dist.all_to_all_single(aa, torch.arange(4.0, device="xla") + 10 * r)
dist.barrier()
import torch.distributed._functional_collectives as fc  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402

mesh = xd.device_mesh()
full = torch.arange(8.0, device="xla").reshape(4, 2)
dt = xd.distribute_tensor(full, mesh, [Shard(0)])
w = xd.distribute_tensor(torch.arange(6.0, device="xla").reshape(2, 3), mesh, [Replicate()])
res["dist"] = {
    "all_reduce": cpu(a), "avg": cpu(avg), "all_gather": [cpu(g) for g in gl], "into_tensor": cpu(gt),
    "reduce_scatter": cpu(rs), "broadcast": cpu(b), "all_to_all": cpu(aa),
    "funcol": cpu(fc.all_reduce(t, "sum", dist.group.WORLD)),
    "funcol_gather": cpu(fc.all_gather_tensor(t, 0, dist.group.WORLD)),
    "dtensor_local": cpu(dt.to_local()), "dtensor_full": cpu(dt.redistribute(mesh, [Replicate()]).to_local()),
    "dtensor_mm": cpu((dt @ w).full_tensor()),
}

# --- host meeting points
res["host"] = {"rendezvous": [p.decode() for p in xd.rendezvous("t", f"r{r}".encode())],
               "mesh_reduce": xd.mesh_reduce("m", r + 1.5, sum)}

# --- CPU tensors on the "xla" group (its gloo backend), then init_process_group("cpu:gloo,xla:xla")
def cpu_collectives():
    c = torch.arange(3.0) + 10 * r
    s = c.clone()
    dist.all_reduce(s)
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r})
    got = [torch.zeros(3) for _ in range(n)] if r == 0 else None
    dist.gather(c, got, dst=0)
    if r == 0:
        dist.send(c * 2, dst=1)
        recv = None
    else:
        recv = torch.zeros(3)
        dist.recv(recv, src=0)
    x = torch.ones(2, device="xla") * (r + 1)
    dist.all_reduce(x)
    try:  # the same on xla tensors: refused, naming it
        dist.gather(x, [torch.zeros(2, device="xla") for _ in range(n)] if r == 0 else None, dst=0)
        refused = None
    except NotImplementedError as e:
        refused = str(e)
    return {"sum": cpu(s), "objects": objs, "gather": [cpu(g) for g in got] if got else None,
            "recv": cpu(recv) if recv is not None else None, "xla": cpu(x), "refused": refused}


res["cpu"] = cpu_collectives()
dist.destroy_process_group()
dist.init_process_group("cpu:gloo,xla:xla", init_method="xla://")
res["mixed"] = cpu_collectives()

with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
    json.dump(res, f)
