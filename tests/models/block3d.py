"""A pre-norm residual MLP block over (batch, seq, d), returning a tuple: block output and its mean over seq."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        y = x + self.down(torch.relu(self.up(self.norm(x))))
        return y, y.mean(dim=1)


def model():
    torch.manual_seed(1)
    return Block()


def example_inputs():
    return (torch.randn(3, 5, 32),)


dynamic_shapes = {"x": {0: ("batch", 1, 64), 1: ("seq", 1, 128)}}
