"""A small MLP: Linear -> LayerNorm -> GELU -> Linear -> softmax, with a dynamic batch.

    tcexport examples/mlp.py --verify
"""

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, d_hidden: int = 256, d_out: int = 32):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.norm = nn.LayerNorm(d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.gelu(self.norm(self.fc1(x)))
        return torch.softmax(self.fc2(h), dim=-1)


def model() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def example_inputs() -> tuple:
    return (torch.randn(8, 64),)


dynamic_shapes = {"x": {0: ("batch", 1, 1024)}}
