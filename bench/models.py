"""The models a benchmark suite runs: each builds the module, its inputs at a batch size, and its dynamic dims."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class BenchModel:
    name: str
    build: Callable[[], torch.nn.Module]   # a fresh, seeded module in eval mode
    inputs: Callable[[int], tuple]         # example inputs at a batch size (CPU tensors)
    dynamic_shapes: dict
    dtype: torch.dtype = torch.float32
    family: str = ""                    # the suite report's grouping ("CNN", "decoder LM", ...)


def _model_file(path: Path):
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _file_model(name: str, path: Path) -> BenchModel:
    mod = _model_file(path)
    example = mod.example_inputs()

    def inputs(batch: int) -> tuple:
        g = torch.Generator().manual_seed(batch)
        out = []
        for t in example:
            shape = (batch, *t.shape[1:])
            if t.is_floating_point():
                out.append(torch.randn(shape, generator=g, dtype=t.dtype))
            else:
                out.append(torch.randint(0, int(t.max()) + 1, shape, generator=g, dtype=t.dtype))
        return tuple(out)

    return BenchModel(name, lambda: mod.model().eval(), inputs, dict(mod.dynamic_shapes))


class _Logits(torch.nn.Module):
    """transformers' GPT-2 as a plain tensor-in, tensor-out module (no cache, no dict outputs)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False, return_dict=False)[0]


def gpt2(name: str, seq: int, **config) -> BenchModel:
    def build():
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        cfg = GPT2Config(**config)
        return _Logits(GPT2LMHeadModel(cfg)).eval()

    vocab = config.get("vocab_size", 50257)

    def inputs(batch: int) -> tuple:
        g = torch.Generator().manual_seed(batch)
        return (torch.randint(0, vocab, (batch, seq), generator=g),)

    positions = config.get("n_positions", 1024)
    return BenchModel(name, build, inputs, {"input_ids": {0: ("batch", 1, 64), 1: ("seq", 1, positions)}})


def get(name: str) -> BenchModel:
    if name == "mlp":
        return _file_model("mlp", ROOT / "examples" / "mlp.py")
    if name == "decoder":
        return _file_model("decoder", ROOT / "examples" / "decoder.py")
    if name == "gpt2-tiny":
        return gpt2("gpt2-tiny", 32, n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=128)
    if name == "gpt2-small":
        return gpt2("gpt2-small", 128, n_layer=12, n_embd=768, n_head=12)
    from .zoo import MODELS

    if name in MODELS:
        return MODELS[name]()
    raise KeyError(f"unknown benchmark model {name!r}")
