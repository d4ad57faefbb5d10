"""transformers GPT-2 with a small config and random (seeded) weights; input ids -> logits."""

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel


class Logits(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids).logits


def model():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=128, use_cache=False,
                        bos_token_id=None, eos_token_id=None,
                        attn_implementation="sdpa")
    return Logits(GPT2LMHeadModel(config).eval()).eval()


def example_inputs():
    return (torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1)),)


dynamic_shapes = {"input_ids": {0: ("batch", 1, 16), 1: ("seq", 1, 128)}}
