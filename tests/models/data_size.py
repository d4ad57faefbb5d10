"""`x[x > 0]`: an output whose size depends on the data, which no package shape can describe."""

import torch
from torch import nn


class Positive(nn.Module):
    def forward(self, x):
        kept = x[x > 0]  # the line the error must name
        return kept * 2


def model():
    return Positive()


def example_inputs():
    return (torch.randn(4, 8),)


dynamic_shapes = {"x": {0: "batch"}}
