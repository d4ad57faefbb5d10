"""tests/models/kv_cache.py's attention over a static KV cache (and its step counter) with two methods sharing
the weights and the three buffers of state: ``prefill`` (forward, over a dynamic ``seq``) and ``decode`` (``step``,
one position)."""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_kv_cache_for_methods", Path(__file__).with_name("kv_cache.py"))
kv_cache = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kv_cache)


class TwoMethods(kv_cache.CachedAttention):
    def step(self, x_one, pos_one):
        """One position: the decode step (its own graph, its own kernels, no dynamic dim)."""
        return self.forward(x_one, pos_one)


def model():
    torch.manual_seed(0)
    return TwoMethods().eval()


methods = {
    "prefill": {"example_inputs": (torch.randn(1, 3, 32), torch.arange(3)),
                "dynamic_shapes": {"x": {1: ("seq", 1, 16)}, "pos": {0: "seq"}}},
    "decode": {"example_inputs": (torch.randn(1, 1, 32), torch.tensor([3])), "function": "step"},
}
