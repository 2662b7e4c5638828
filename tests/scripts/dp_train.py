"""A data-parallel training step in every process of
`python -m torch_xla_core.launch` (tests/test_multiprocess.py): one global
mesh over all processes' devices; each process writes what it saw to
<out dir>/rank<r>.json (with its compile and persistent-cache hit counts:
tests/test_compile_cache.py). With argv[2] == "die": process 1 exits at once."""
import json, os, sys
import torch, torch_xla_core as txc, torch_xla_core.sharding as xs
if len(sys.argv) > 2 and sys.argv[2] == "die" and os.environ.get("RANK") == "1":
    sys.exit(3)
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
out = {"rank": txc.global_ordinal(), "world": txc.world_size(), "local": txc.local_ordinal(), "devices": n,
       "losses": losses, "params": [p.cpu().tolist() for p in model.parameters()],
       "shards": [list(s.shape) for s in xs.local_shards(x)],
       "compile": txc.metrics.counters().get("compile", 0),
       "hit": txc.metrics.counters().get("persistent_cache_hit", 0)}
json.dump(out, open(os.path.join(sys.argv[1], f"rank{txc.global_ordinal()}.json"), "w"))
