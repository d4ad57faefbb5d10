"""Uses an op the lowering does not know yet (sort), to test the error message."""

import torch
from torch import nn


class Sorted(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.sort(y, dim=-1).values  # the line the error must name


def model():
    return Sorted()


def example_inputs():
    return (torch.randn(4, 8),)
