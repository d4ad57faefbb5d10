"""Two methods, one of which the lowering cannot build (torch.sort): ``tcexport --report`` names that method."""

import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        return self.proj(x).relu()

    def rank(self, x):
        return torch.sort(self.proj(x), dim=-1).values  # unsupported in rank


def model():
    torch.manual_seed(0)
    return Ranker().eval()


methods = {
    "forward": {"example_inputs": (torch.randn(4, 8),), "dynamic_shapes": {"x": {0: "batch"}}},
    "rank": {"example_inputs": (torch.randn(4, 8),), "function": "rank"},
}
