"""Two inputs that share the symbol `batch`, with an elementwise product and a broadcast row sum."""

import torch
from torch import nn


class Mix(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))

    def forward(self, a, b):
        return a * b * self.scale + a.sum(dim=-1, keepdim=True) - torch.tanh(b).amax(dim=-1, keepdim=True)


def model():
    return Mix()


def example_inputs():
    torch.manual_seed(2)
    return (torch.randn(4, 16), torch.randn(4, 16))


dynamic_shapes = {"a": {0: "batch"}, "b": {0: "batch"}}
