"""Single-head attention written with matmuls (bmm after export), dynamic batch and sequence."""

import math

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d: int = 16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.d = d

    def forward(self, x):
        q, k, v = self.qkv(x).split(self.d, dim=-1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        return self.out(torch.softmax(scores, dim=-1) @ v)


def model():
    torch.manual_seed(3)
    return Attention()


def example_inputs():
    return (torch.randn(2, 6, 16),)


dynamic_shapes = {"x": {0: ("batch", 1, 16), 1: ("seq", 1, 64)}}
