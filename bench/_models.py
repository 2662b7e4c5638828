"""Benchmark models and the aten-level op counter shared by bench/ programs.

Owns: the two models that bench/trace_overhead.py traces (a 64-layer residual
MLP and a small GPT-style decoder), their inputs and losses, and
`count_aten_ops`, which counts the calls that reach the aten dispatcher when a
step runs on CPU eager. Plain torch only: the same code runs under our
interpreter (torch 2.13) and the peer's (torch 2.9.1), so nothing here may
import a backend.
"""

import copy
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


# ----------------------------------------------------------------- the models

class ResidualBlock(nn.Module):
    """x + Linear(GELU(Linear(x))): 6 aten ops forward (t, addmm, gelu, t, addmm, add)."""

    def __init__(self, width: int):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(x)))


class ResidualMLP(nn.Module):
    def __init__(self, layers: int = 64, width: int = 256):
        super().__init__()
        self.layers = nn.ModuleList(ResidualBlock(width) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class RMSNorm(nn.Module):
    """Written out in basic ops so both torch versions dispatch the same ops."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        q = q * cos + _rotate_half(q) * sin          # rotary position embedding
        k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class DecoderBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = RMSNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = RMSNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.fc2(F.silu(self.fc1(self.norm2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 256, dim: int = 128, layers: int = 4, heads: int = 4,
                 max_seq: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(DecoderBlock(dim, heads) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(max_seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        t = tokens.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


# ------------------------------------------------------------------ the cases

@dataclass
class Case:
    """A model with its inputs and loss. `inputs` live on CPU until `to(device)`."""

    name: str
    description: str
    model: nn.Module
    inputs: List[torch.Tensor]
    loss: Callable                       # loss(model, inputs) -> 0-d tensor
    grad_inputs: List[int] = field(default_factory=list)   # inputs that require grad

    def to(self, device) -> "Case":
        inputs = [x.to(device) for x in self.inputs]
        for i in self.grad_inputs:
            inputs[i] = inputs[i].detach().requires_grad_(True)
        return Case(self.name, self.description, self.model.to(device), inputs, self.loss,
                    self.grad_inputs)

    def clone(self) -> "Case":
        return Case(self.name, self.description, copy.deepcopy(self.model),
                    [x.clone() for x in self.inputs], self.loss, list(self.grad_inputs))

    # One step of each kind; the caller sets grads to None before a backward step.
    def forward(self):
        with torch.no_grad():
            return self.model(self.inputs[0])

    def forward_backward(self):
        loss = self.loss(self.model, self.inputs)
        loss.backward()
        return loss

    def clear_grads(self):
        self.model.zero_grad(set_to_none=True)
        for i in self.grad_inputs:
            self.inputs[i].grad = None

    def live_outputs(self):
        """Tensors a training step would materialize: the grads."""
        return [p.grad for p in self.model.parameters() if p.grad is not None]


def _mlp_case() -> Case:
    model = ResidualMLP(layers=64, width=256)
    x = torch.randn(8, 256)
    # x requires grad and the loss is a plain sum: this is the step whose aten
    # count is 2053 under torch 2.9.1 (see README: 1796 under torch 2.13).
    return Case("mlp", "64-layer residual MLP, width 256, batch 8; loss = out.sum()",
                model, [x], lambda m, inp: m(inp[0]).sum(), grad_inputs=[0])


def _decoder_case(layers: int = 4) -> Case:
    vocab, seq, batch = 256, 64, 4
    model = TinyGPT(vocab=vocab, dim=128, layers=layers, heads=4, max_seq=seq)
    data = torch.randint(0, vocab, (batch, seq + 1))
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def loss(m, inp):
        logits = m(inp[0])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inp[1].reshape(-1))

    return Case("decoder" if layers == 4 else f"decoder{layers}",
                f"GPT-style decoder: {layers} layers, width 128, 4 heads, RMSNorm, rotary, "
                "causal SDPA, SiLU MLP; batch 4 x seq 64, vocab 256; cross-entropy",
                model, [tokens, targets], loss)


# decoder100: the decoder at 100 layers, the depth of the model whose trace
# torch-xla's assume_pure cut from 140 to 24 ms (the seed's figure): a
# tracing-bound step (7.8k aten ops forward, 20.9k forward + backward, then AdamW)
CASES: Dict[str, Callable[[], Case]] = {"mlp": _mlp_case, "decoder": _decoder_case,
                                        "decoder100": lambda: _decoder_case(100)}


def train_step(model, opt, inputs, loss_fn, opt_step=None):
    """One training step as the step benchmarks time it (replay.py, dynamo.py,
    trace_overhead.py): zero_grad + forward + loss + backward + optimizer step,
    the batch passed as arguments. Returns the detached loss."""
    opt.zero_grad()
    loss = loss_fn(model, inputs)
    loss.backward()
    (opt_step or opt.step)()
    return loss.detach()


def make_case(name: str, seed: int = 0) -> Case:
    if name not in CASES:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(CASES)}")
    torch.manual_seed(seed)
    return CASES[name]()


# --------------------------------------------------------------- op counting

class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.total = 0
        self.by_op: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        key = str(func)
        self.by_op[key] = self.by_op.get(key, 0) + 1
        return func(*args, **(kwargs or {}))


def _math_sdpa():
    """On CPU, SDPA would dispatch one fused flash kernel; a lazy backend sees the
    math decomposition. Count the math path so the count matches what is traced."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.MATH])
    except Exception:  # older torch
        import contextlib
        return contextlib.nullcontext()


def count_aten_ops(case: Case) -> Dict[str, object]:
    """Count aten calls of one forward (no_grad) and one forward+backward step
    (grads None before it, as in the benchmark) on a CPU copy of the case."""
    cpu = case.clone().to("cpu")
    with _math_sdpa():
        with _CountOps() as fwd:
            cpu.forward()
        cpu.clear_grads()
        with _CountOps() as fb:
            loss = cpu.forward_backward()
    return {"forward": fwd.total, "forward_backward": fb.total,
            "forward_by_op": dict(sorted(fwd.by_op.items())),
            "forward_backward_by_op": dict(sorted(fb.by_op.items())),
            "cpu_loss": float(loss.detach())}
