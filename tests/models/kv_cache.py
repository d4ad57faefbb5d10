"""Attention over a static KV cache the forward writes at ``pos`` (index_copy_), plus a step counter it adds to:
three buffers of state, two written in place, one not."""

import torch
import torch.nn.functional as F
from torch import nn


class CachedAttention(nn.Module):
    def __init__(self, d=32, heads=4, cache=16):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.register_buffer("k_cache", torch.zeros(1, heads, cache, d // heads))
        self.register_buffer("v_cache", torch.zeros(1, heads, cache, d // heads))
        self.register_buffer("steps", torch.full((), 7, dtype=torch.int64))  # not zeros: stored in the package

    def forward(self, x, pos):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        self.steps.add_(1)
        mask = torch.arange(self.k_cache.shape[2])[None, :] <= pos[:, None]
        y = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, d)) + self.steps.float()


def model(cache=16):
    torch.manual_seed(0)
    return CachedAttention(cache=cache).eval()


def example_inputs():
    return (torch.randn(1, 3, 32), torch.arange(3))


dynamic_shapes = {"x": {1: ("seq", 1, 16)}, "pos": {0: "seq"}}
