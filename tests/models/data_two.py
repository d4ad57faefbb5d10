"""Two data-dependent lines and one unsupported op: a report must name all three at once."""

import torch
from torch import nn


class TwoProblems(nn.Module):
    def forward(self, x):
        if x.sum() > 0:                      # data-dependent 1
            x = x * 2
        scale = float(x.abs().max().item())  # data-dependent 2
        y = torch.sort(x * scale, dim=-1).values  # unsupported
        return y


def model():
    return TwoProblems()


def example_inputs():
    return (torch.randn(4, 8),)


dynamic_shapes = {"x": {0: "batch"}}
