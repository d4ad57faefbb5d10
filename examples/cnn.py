"""A small CNN on 3x32x32 images: conv -> BatchNorm -> ReLU -> max pool -> conv -> BatchNorm -> ReLU ->
adaptive average pool -> flatten -> Linear, with a dynamic batch.

    tcexport examples/cnn.py --verify --dump /tmp/cnn

Each conv, its bias, the (eval-mode) batch norm and the ReLU run as one kernel; see kernels.txt in the dump.
"""

import torch
from torch import nn


class CNN(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.relu(self.bn2(self.conv2(x)))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def model() -> nn.Module:
    torch.manual_seed(0)
    m = CNN()
    with torch.no_grad():  # non-trivial running statistics, as a trained model has
        for bn in (m.bn1, m.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.2, 0.2)
    return m.eval()


def example_inputs() -> tuple:
    return (torch.randn(4, 3, 32, 32),)


dynamic_shapes = {"x": {0: ("batch", 1, 64)}}
