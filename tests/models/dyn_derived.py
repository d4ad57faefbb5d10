"""Derived dims: `pairs` has 2*seq rows and `prev` seq-1 rows, both tied to `x`'s seq."""

import torch
from torch import nn


class Derived(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, 8))

    def forward(self, x, pairs, prev):
        doubled = torch.cat([x, x * 0.5], dim=1)              # [batch, 2*seq, 8]
        deltas = x[:, 1:] - x[:, :-1]                          # [batch, seq-1, 8]
        return doubled * pairs + self.w, torch.tanh(deltas + prev)


def model():
    return Derived()


def example_inputs():
    torch.manual_seed(5)
    return (torch.randn(2, 6, 8), torch.randn(2, 12, 8), torch.randn(2, 5, 8))


dynamic_shapes = {"x": {0: ("batch", 1, 16), 1: ("seq", 2, 64)}, "pairs": {0: "batch", 1: "2*seq"},
                  "prev": {0: "batch", 1: "seq-1"}}
