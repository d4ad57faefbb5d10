"""Two symbols the user declared independent, that the model ties: `x[:, 1:] * y` needs seq == other + 1."""

import torch
from torch import nn


class Tied(nn.Module):
    def forward(self, x, y):
        return x[:, 1:] * y


def model():
    return Tied()


def example_inputs():
    torch.manual_seed(7)
    return (torch.randn(2, 7), torch.randn(2, 6))


dynamic_shapes = {"x": {1: ("seq", 2, 64)}, "y": {1: ("other", 1, 32)}}
