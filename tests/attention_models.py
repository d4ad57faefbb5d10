"""Attention modules and inputs both backends' attention tests use (test_cuda_attention.py, test_cpu_attention.py):
causal, masked and hand-written softmax attention, and queries over a static cache masked past their position, its
query heads one a KV head or several (grouped-query attention)."""

from __future__ import annotations

import math

import torch


class Causal(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class Masked(torch.nn.Module):
    """A float mask added to the scores; keys of other lengths than queries."""

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class HandWritten(torch.nn.Module):
    """softmax(q k^T / sqrt(d) masked) v written out, with a bool padding mask and head dim 24 (padded to 32)."""

    def forward(self, q, k, v, keep):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        scores = scores.masked_fill(keep[:, None, None, :].logical_not(), float("-inf"))
        return scores.softmax(-1) @ v


def qkv(b, h, lq, d, lk=None, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    lk = lq if lk is None else lk
    return [torch.randn(s, generator=g).to(dtype) for s in ((b, h, lq, d), (b, h, lk, d), (b, h, lk, d))]


class CacheAttention(torch.nn.Module):
    """Queries of a dynamic length over a static cache of keys, masked beyond each query's position (a
    transformers static cache's decode step and prefill), the bool mask built from the position as there."""

    @staticmethod
    def keep(q, k, position):
        keys = torch.arange(k.size(2))
        rows = position + torch.arange(q.size(2))
        return keys[None, :] <= rows[:, None]

    def forward(self, q, k, v, position):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.keep(q, k, position))


class GroupedCacheAttention(CacheAttention):
    """CacheAttention with fewer KV heads than query heads, repeated as transformers' ``repeat_kv`` does (an
    expand and a reshape) or, with ``gqa``, by SDPA's own ``enable_gqa``."""

    def __init__(self, gqa: bool = False):
        super().__init__()
        self.gqa = gqa

    def forward(self, q, k, v, position):
        keep = self.keep(q, k, position)
        if self.gqa:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)
        b, hk, n, d = k.shape
        r = q.size(1) // hk
        k, v = (x[:, :, None].expand(b, hk, r, n, d).reshape(b, hk * r, n, d) for x in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def cache_case(lq, position, seed, cache=512, dtype=torch.float32, heads=(3, 3)):
    """Inputs of CacheAttention (``heads``: query heads and KV heads)."""
    q, _, _ = qkv(2, heads[0], lq, 32, lk=cache, seed=seed, dtype=dtype)
    _, k, v = qkv(2, heads[1], lq, 32, lk=cache, seed=seed + 1000, dtype=dtype)
    return [q, k, v, torch.tensor(position)]
