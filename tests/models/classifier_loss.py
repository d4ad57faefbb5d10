"""A small classifier whose forward returns its training loss: cross-entropy of a two-layer MLP's logits against
integer labels, averaged over a dynamic batch. Used to train torch-free from a --backward package.

    tcexport tests/models/classifier_loss.py --backward
"""

import torch
from torch import nn
from torch.nn import functional as F

FEATURES, HIDDEN, CLASSES = 16, 32, 4


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.fc2(torch.tanh(self.fc1(x)))
        return F.cross_entropy(logits, labels)


def model() -> nn.Module:
    torch.manual_seed(0)
    return Classifier()


def example_inputs() -> tuple:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(8, FEATURES, generator=g), torch.randint(0, CLASSES, (8,), generator=g))


dynamic_shapes = {"x": {0: ("batch", 1, 256)}, "labels": {0: "batch"}}
