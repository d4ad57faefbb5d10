"""Marks dim 0 dynamic, but `x.view(4, -1)` fixes it to 4: export must say which dim and why."""

import torch
from torch import nn


class Fixed(nn.Module):
    def forward(self, x):
        return x.view(4, -1) * 2.0


def model():
    return Fixed()


def example_inputs():
    return (torch.randn(4, 6),)


dynamic_shapes = {"x": {0: "batch"}}
