"""Three ops the lowering does not know (sort, kthvalue, topk), on three lines: one error must name all three."""

import torch
from torch import nn


class ThreeUnsupported(nn.Module):
    def forward(self, x):
        y = torch.sort(x * 2, dim=-1).values      # unsupported 1
        z = torch.kthvalue(x, 3, dim=-1).values   # unsupported 2
        t = torch.topk(x + 1, 2, dim=-1).values   # unsupported 3
        return y.sum(-1) + z + t.sum(-1) + x.mean(-1)


def model():
    return ThreeUnsupported()


def example_inputs():
    return (torch.randn(4, 8),)


dynamic_shapes = {"x": {0: "batch"}}
