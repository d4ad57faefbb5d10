"""Integer inputs and outputs with two dynamic dims: token ids (int64[batch, seq]) are embedded and averaged,
scaled by a float row (float32[batch, 8]); the ids come back shifted by one (int64[batch, seq]). Used by the
serving tests for int64 datatypes, several inputs and outputs, and a dynamic dim after the batch dim."""

import torch
from torch import nn


class TokenIds(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 8)

    def forward(self, ids, scale):
        return self.embed(ids).mean(dim=1) * scale, ids + 1


def model():
    torch.manual_seed(3)
    return TokenIds()


def example_inputs():
    g = torch.Generator().manual_seed(4)
    return (torch.randint(0, 32, (2, 5), generator=g), torch.randn(2, 8, generator=g))


dynamic_shapes = {"ids": {0: ("batch", 1, 32), 1: ("seq", 1, 64)}, "scale": {0: "batch"}}
