"""Flash attention with segment ids run per shard over two processes' devices
(tests/test_multiprocess.py), in every process of `python -m
torch_xla_core.launch`: batch split over a 1-D mesh of all devices, a
pending value annotated by mark_sharding (its mesh ordinals become PJRT
device ids in the key); each process writes <out>/flash<r>.json with the
output, q/k/v gradients and its local shard shapes."""
import json, os, sys
import torch, torch_xla_core as txc, torch_xla_core.sharding as xs
from torch_xla_core import kernels
n = len(txc.runtime.global_devices())
mesh = xs.Mesh(range(n), (n,), ("data",))
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(8, 2, 16, 8, generator=g) for _ in range(3))
seg = torch.randint(0, 3, (8, 16), generator=g).sort(1).values
Q, K, V = (t.to("xla").requires_grad_() for t in (q, k, v))
S = seg.to("xla")
o = kernels.flash_attention(Q, K, V, causal=True, q_segment_ids=S, kv_segment_ids=S,
                            partition_spec=("data", None, None, None), mesh=mesh)
p = o * 2
xs.mark_sharding(p, mesh, ("data", None, None, None))  # a pending value's annotation
(p * o).sum().backward()
txc.sync()
out = {"out": o.cpu().tolist(), "grads": [t.grad.cpu().tolist() for t in (Q, K, V)],
       "shards": [list(s.shape) for s in xs.local_shards(o)]}
json.dump(out, open(os.path.join(sys.argv[1], f"flash{txc.global_ordinal()}.json"), "w"))
