"""torch.save of tensors sharded over two processes (tests/test_multiprocess.py),
in every process of `python -m torch_xla_core.launch`: txc.save in every
process (process 0 writes <out>/ckpt.pt), torch.save in every process, then
torch.save in process 0 alone of a sharded tensor and of a pending sharded
value: each must raise an error naming the tensor, not block. Each process
writes <out>/save<r>.json."""
import io, json, os, sys
import torch, torch_xla_core as txc, torch_xla_core.sharding as xs
out_dir = sys.argv[1]
rank = txc.global_ordinal()
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))
w = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)).to("xla")
xs.mark_sharding(w, mesh, ("data", None))
p = w * 2  # pending, computed over both processes' devices
txc.save({"w": w, "p": p, "step": 3}, os.path.join(out_dir, "ckpt.pt"))
buf = io.BytesIO()
torch.save(w, buf)  # every process: fine
every = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")
errors = []
if rank == 0:  # alone: the gather would block for good
    for what in (lambda: w, lambda: w + 1):
        try:
            torch.save(what(), io.BytesIO())
        except RuntimeError as e:
            errors.append(str(e))
json.dump({"every": every.tolist(), "errors": errors}, open(os.path.join(out_dir, f"save{rank}.json"), "w"))
