"""A peer dies mid-step (tests/test_multiprocess.py), in each process of
`python -m torch_xla_core.launch --nproc 2`: both take a step over a mesh
spanning both processes, then process 1 ends with os._exit(3) while
process 0 is in the next step's collective. Process 0 catches
PeerLostError around the step, writes <out>/survivor.json (the error, the
seconds it waited, what it saved from the host) and exits through
peers.exit(5)."""
import json, os, sys, time
import torch, torch_xla_core as txc, torch_xla_core.sharding as xs
from torch_xla_core import peers
out_dir = sys.argv[1]
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))
w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).to("xla")
xs.mark_sharding(w, mesh, ("data", None))
losses = [(w * 2).sum().item()]  # step 1: a collective over both processes
if rank == int(sys.argv[2]):
    time.sleep(0.5)
    os._exit(3)
t0 = time.monotonic()
try:
    losses.append((w * 3).sum().item())  # step 2 waits on the other process, which is gone
    result = {"error": None}
except peers.PeerLostError as e:
    result = {"error": str(e), "type": type(e).__name__, "peer": e.peer, "status": e.status}
result.update(waited=time.monotonic() - t0, losses=losses)
with open(os.path.join(out_dir, "survivor.json"), "w") as f:
    json.dump(result, f)
peers.exit(5)
