"""Uses an op the lowering does not know yet (cumsum), to test the error message."""

import torch
from torch import nn


class Running(nn.Module):
    def forward(self, x):
        y = x * 2
        return torch.cumsum(y, dim=-1)  # the line the error must name


def model():
    return Running()


def example_inputs():
    return (torch.randn(4, 8),)
