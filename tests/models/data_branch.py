"""`if x.sum() > 0:` in forward: control flow on a tensor's values, which export cannot capture."""

import torch
from torch import nn


class Branchy(nn.Module):
    def forward(self, x):
        h = x * 2
        if h.sum() > 0:  # the line the error must name
            return h + 1
        return h - 1


def model():
    return Branchy()


def example_inputs():
    return (torch.randn(4, 8),)


dynamic_shapes = {"x": {0: "batch"}}
