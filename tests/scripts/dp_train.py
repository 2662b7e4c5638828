"""A data-parallel training step in every process of
`python -m torch_xla_core.launch` (tests/test_multiprocess.py): one global
mesh over all processes' devices; each process writes what it saw to
<out dir>/rank<r>.json (with its compile and persistent-cache hit counts:
tests/test_compile_cache.py). With argv[2] == "die": process 1 exits at once."""
import json, os, sys
import torch, torch_xla_core as txc, torch_xla_core.sharding as xs
import mlp_job
if len(sys.argv) > 2 and sys.argv[2] == "die" and os.environ.get("RANK") == "1":
    sys.exit(3)
model, mesh = mlp_job.mlp(), mlp_job.global_mesh()
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
losses = []
for loss, x in mlp_job.train(model, opt, mesh, 3):
    losses.append(loss.item())
out = {"rank": txc.global_ordinal(), "world": txc.world_size(), "local": txc.local_ordinal(), "devices": mesh.size(),
       "losses": losses, "params": [p.cpu().tolist() for p in model.parameters()],
       "shards": [list(s.shape) for s in xs.local_shards(x)],
       "compile": txc.metrics.counters().get("compile", 0),
       "hit": txc.metrics.counters().get("persistent_cache_hit", 0)}
json.dump(out, open(os.path.join(sys.argv[1], f"rank{txc.global_ordinal()}.json"), "w"))
