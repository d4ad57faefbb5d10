"""A small Llama-style decoder-only transformer (random, seeded weights), dynamic batch and sequence.

Token embedding (vocab 256, width 64) → 2 × [RMSNorm → causal self-attention with rotary position embeddings
(4 heads, `scaled_dot_product_attention(..., is_causal=True)`) → residual; RMSNorm → SwiGLU MLP → residual]
→ final RMSNorm → LM head. Input: token ids ``ids`` int64 [batch, seq]; output: logits float32 [batch, seq, 256].

    tcexport examples/decoder.py --verify
"""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, D, HEADS, LAYERS, HIDDEN, MAX_SEQ = 256, 64, 4, 2, 172, 128


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.v = nn.Linear(D, D, bias=False)
        self.o = nn.Linear(D, D, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = (proj(x).view(b, s, HEADS, D // HEADS).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, D))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, HIDDEN, bias=False)
        self.up = nn.Linear(D, HIDDEN, bias=False)
        self.down = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = RMSNorm(D), Attention()
        self.norm2, self.mlp = RMSNorm(D), MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = RMSNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        head_dim = D // HEADS
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(MAX_SEQ).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids):
        s = ids.shape[1]
        cos, sin = self.cos[:s], self.sin[:s]
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))


def model() -> nn.Module:
    torch.manual_seed(0)
    return Decoder().eval()


def example_inputs() -> tuple:
    return (torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1)),)


dynamic_shapes = {"ids": {0: ("batch", 1, 16), 1: ("seq", 1, 128)}}
