"""Small models shared by tests and benchmarks: an MLP, a GPT-style decoder and a tiny Mixtral."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.GELU(), nn.Linear(d_hidden, d_hidden), nn.SiLU(),
                                 nn.Linear(d_hidden, d_out))

    def forward(self, x):
        return self.net(x)


def rotary(x, pos):
    # x: [B, H, T, Dh]; rotate pairs by position-dependent angles.
    d = x.shape[-1] // 2
    freqs = 1.0 / (10000 ** (torch.arange(d, device=x.device, dtype=torch.float32) / d))
    ang = pos[:, None].float() * freqs[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :d], x[..., d:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, d=64, heads=4, norm="layer"):
        super().__init__()
        self.heads = heads
        self.n1 = nn.LayerNorm(d) if norm == "layer" else nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.n2 = nn.RMSNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        pos = torch.arange(T, device=x.device)
        q, k = rotary(q, pos), rotary(k, pos)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.gelu(self.up(self.n2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=97, d=64, layers=2, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads, "layer" if i % 2 == 0 else "rms") for i in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x))


def tiny_mixtral(transformers):
    """The kernels issue's Mixtral-style MoE decoder from `transformers`, random
    weights: 8 experts, top-2, GQA attention, tiny widths, experts through
    F.grouped_mm (shared by tests/test_moe.py and bench/kernels.py)."""
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
                                     num_experts_per_tok=2, max_position_embeddings=64, router_jitter_noise=0.0,
                                     attn_implementation="sdpa", experts_implementation="grouped_mm")
    return transformers.MixtralForCausalLM(cfg)
