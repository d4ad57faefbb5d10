"""tiny_model.py's network with state (SPEC §2b): a call counter its forward adds to, which the output does not read,
so every call of the golden check gives tiny_model's output. The model of the 1.9 golden package; keep it unchanged."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_golden_tiny_model", Path(__file__).with_name("tiny_model.py"))
tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tiny)


class TinyState(tiny.Tiny):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return super().forward(x)


def model():
    torch.manual_seed(tiny.SEED)
    return TinyState().eval()


example_inputs = tiny.example_inputs
dynamic_shapes = tiny.dynamic_shapes
check_input = tiny.check_input
