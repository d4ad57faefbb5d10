"""A vocabulary-sized bfloat16 LM head (weight [N, K] with an odd N, as GPT-2's 50257) and a projection by a
[K, N] parameter with a GELU. Over 256 rows the GPU runs both as persistent GEMMs reading through TMA
descriptors (exporter/cuda/gemm.py persistent_head); up to 256 rows as one program per tile."""

import torch
from torch import nn


class Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 16411)
        self.w = nn.Parameter(torch.randn(64, 16400) * 0.05)

    def forward(self, x):
        return self.head(x), nn.functional.gelu(x @ self.w)


def model():
    torch.manual_seed(0)
    return Heads().to(torch.bfloat16)


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 8, 64).to(torch.bfloat16),)


dynamic_shapes = {"x": {0: ("batch", 1, 16), 1: ("seq", 1, 64)}}
