"""The model every golden package is built from: Linear(8, 16) -> GELU -> Linear(16, 4), a dynamic batch.

It follows the model-file convention (``model()``, ``example_inputs()``, ``dynamic_shapes``), so
``tcexport tests/golden/tiny_model.py`` exports it too. Keep it unchanged: tests/golden/expected.json holds its
eager outputs, and every golden package was built from it.
"""

import torch
from torch import nn

SEED = 0
D_IN, D_HIDDEN, D_OUT = 8, 16, 4


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D_IN, D_HIDDEN)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(D_HIDDEN, D_OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def model() -> nn.Module:
    torch.manual_seed(SEED)
    return Tiny().eval()


def example_inputs() -> tuple:
    torch.manual_seed(SEED + 1)
    return (torch.randn(3, D_IN),)


dynamic_shapes = {"x": {0: ("batch", 1, 64)}}


def check_input(batch: int = 5) -> list:
    """The input expected.json stores: x[i][j] = ((i * D_IN + j) % 17 - 8) / 8, exact in float32."""
    return [[((i * D_IN + j) % 17 - 8) / 8 for j in range(D_IN)] for i in range(batch)]
