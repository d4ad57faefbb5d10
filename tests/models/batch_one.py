"""A model with nothing wrong, but an example batch of 1 for a dim declared dynamic."""

import torch
from torch import nn


class Scale(nn.Module):
    def forward(self, x):
        return x * 2 + 1


def model():
    return Scale()


def example_inputs():
    return (torch.randn(1, 8),)


dynamic_shapes = {"x": {0: "batch"}}
