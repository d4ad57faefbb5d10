"""transformers Llama (LlamaForCausalLM) with a small config and random (seeded) weights; input ids -> logits."""

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


class Logits(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids).logits


def model():
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=172, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=128, use_cache=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None, attn_implementation="sdpa")
    return Logits(LlamaForCausalLM(config).eval()).eval()


def example_inputs():
    return (torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1)),)


dynamic_shapes = {"input_ids": {0: ("batch", 1, 16), 1: ("seq", 1, 128)}}
