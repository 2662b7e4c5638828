"""torch.func transforms on xla tensors match CPU, with no CPU fallback:
vmap (batching rules over our ops), grad / vjp / jacrev (reverse mode),
jvp / jacfwd / hessian (forward mode: dual tensors), per-sample gradients
with functional_call, and activation checkpointing."""
import pytest
import torch
from torch.func import functional_call, grad, hessian, jacfwd, jacrev, jvp, vjp, vmap

import torch_xla_core as txc

G = torch.Generator().manual_seed(0)
X = torch.randn(5, 3, generator=G)
W = torch.randn(4, 3, generator=G)
LIN = torch.nn.Linear(3, 4)


def _per_sample_grads(d):
    m = LIN.to(d)
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, x, y):
        return torch.nn.functional.mse_loss(functional_call(m, p, (x,)), y)
    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, X.to(d).unsqueeze(1), torch.ones(5, 1, 4, device=d))
    return list(grads.values())


def _checkpoint(d):
    x = X.to(d).clone().requires_grad_()
    w = W.to(d)
    torch.utils.checkpoint.checkpoint(lambda a: (a @ w.T).relu().sum(), x, use_reentrant=False).backward()
    return x.grad


CASES = {
    "vmap_matmul": lambda d: vmap(lambda x: W.to(d) @ x)(X.to(d)),
    "vmap_norms": lambda d: vmap(lambda x: torch.nn.functional.layer_norm(x.softmax(-1), (3,)))(X.to(d)),
    "vmap_index": lambda d: vmap(lambda x, i: x[i])(X.to(d), torch.tensor([0, 1, 2, 0, 1], device=d)),
    "vmap_conv": lambda d: vmap(lambda x: torch.nn.functional.conv1d(x[None, None], torch.ones(1, 1, 2, device=d)))(
        X.to(d)),
    "grad": lambda d: grad(lambda w: (X.to(d) @ w.T).tanh().sum())(W.to(d)),
    "vjp": lambda d: vjp(lambda x: x.exp(), X.to(d))[1](torch.ones(5, 3, device=d))[0],
    "jacrev": lambda d: jacrev(lambda x: (W.to(d) @ x).sin())(X[0].to(d)),
    "jvp": lambda d: jvp(lambda x: x.sin() * x, (X.to(d),), (torch.ones(5, 3, device=d),))[1],
    "jacfwd": lambda d: jacfwd(lambda x: (W.to(d) @ x).sin())(X[0].to(d)),
    "hessian": lambda d: hessian(lambda x: (W.to(d) @ x).sin().sum())(X[0].to(d)),
    "per_sample_grads": _per_sample_grads,
    "checkpoint": _checkpoint,
}


@pytest.mark.parametrize("name", list(CASES))
def test_transform_matches_cpu_without_fallback(name, dev):
    want = CASES[name]("cpu")
    before = dict(txc.metrics.fallbacks())
    got = CASES[name](dev)
    want, got = ([want], [got]) if torch.is_tensor(want) else (want, got)
    for w, g in zip(want, got):
        assert g.device.type == "xla"
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-5)
    assert dict(txc.metrics.fallbacks()) == before, f"{name}: ops fell back to the CPU"
