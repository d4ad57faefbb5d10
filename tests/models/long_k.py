"""A transformer MLP block with a long hidden dim (K = 2048 in its down-projection) over [batch, 8, 64]: at most
SMALL_M rows take the GPU's split-K path (exporter/schedule/split_k.py), more rows the one GEMM."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 2048)
        self.down = nn.Linear(2048, 64)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


def model():
    torch.manual_seed(0)
    return Block()


def example_inputs():
    torch.manual_seed(1)
    return (torch.randn(2, 8, 64),)


dynamic_shapes = {"x": {0: ("batch", 1, 64)}}
