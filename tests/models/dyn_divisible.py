"""A reshape that needs seq divisible by 4: export demands `seq = 4*_seq`; the package guards seq % 4 == 0."""

import torch
from torch import nn


class Pool4(nn.Module):
    def forward(self, x):
        b, seq, d = x.shape
        groups = x.view(b, seq // 4, 4, d)
        return groups.mean(dim=2) * 2.0


def model():
    return Pool4()


def example_inputs():
    torch.manual_seed(6)
    return (torch.randn(2, 8, 16),)


dynamic_shapes = {"x": {0: ("batch", 1, 8), 1: ("seq", 1, 64)}}
