"""examples/mlp.py in bfloat16 (weights and input), with its dynamic batch: `tcexport` and `--verify` on a
16-bit float model."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_mlp_example", Path(__file__).resolve().parents[2] / "examples" / "mlp.py")
_mlp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mlp)


def model():
    return _mlp.model().eval().to(torch.bfloat16)


def example_inputs():
    return tuple(x.to(torch.bfloat16) for x in _mlp.example_inputs())


dynamic_shapes = _mlp.dynamic_shapes
