"""A relative-position index built inside forward and edited slice by slice (BEiT's ``relative_position_index``):
the fused body reads a where() over a fixed column, so a comparison of two constants (``0 == 0``) reaches the
CUDA code generator, which must render it as a value Triton can convert."""

import torch
from torch import nn


class PositionIndex(nn.Module):
    def __init__(self, side: int = 4):
        super().__init__()
        self.side = side
        self.table = nn.Parameter(torch.randn((2 * side - 1) ** 2, 8))

    def forward(self, x):
        n = self.side
        coords = torch.stack(torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += n - 1
        rel[:, :, 1] += n - 1
        rel[:, :, 0] *= 2 * n - 1
        bias = self.table[rel.sum(-1)]  # [n*n, n*n, 8]
        return x @ bias.mean(-1)


def model():
    torch.manual_seed(5)
    return PositionIndex()


def example_inputs():
    return (torch.randn(3, 16),)


dynamic_shapes = {"x": {0: ("batch", 1, 64)}}
