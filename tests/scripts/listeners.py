"""Every listener of a job up, then held (tests/test_multiprocess.py): in
each process of `python -m torch_xla_core.launch --nproc 2`, a collective
step over a mesh spanning both processes (jax's coordination service and
gloo collectives), torch.distributed.init_process_group("gloo") and a
barrier (the launcher's store, torch's gloo), then <out>/ready<r> and a wait
for <out>/release (while the test lists the sockets the job listens on)."""
import os, sys, time
import torch, torch.distributed as dist, torch_xla_core as txc, torch_xla_core.sharding as xs
out_dir = sys.argv[1]
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))
w = torch.ones(8, 4).to("xla")
xs.mark_sharding(w, mesh, ("data", None))
assert (w * 2).sum().item() == 64.0
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
open(os.path.join(out_dir, f"ready{rank}"), "w").close()
t0 = time.monotonic()
while not os.path.exists(os.path.join(out_dir, "release")) and time.monotonic() - t0 < 120:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
