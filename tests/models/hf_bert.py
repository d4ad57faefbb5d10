"""transformers BertModel with a small config and random (seeded) weights; (input ids, attention mask) ->
last hidden state."""

import torch
from torch import nn
from transformers import BertConfig, BertModel


class Hidden(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def model():
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        vocab_size=256, max_position_embeddings=128, attn_implementation="sdpa")
    return Hidden(BertModel(config, add_pooling_layer=False).eval()).eval()


def example_inputs():
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 12, dtype=torch.int64)
    mask[1, 9:] = 0
    return ids, mask


dynamic_shapes = {"input_ids": {0: ("batch", 1, 16), 1: ("seq", 1, 128)},
                  "attention_mask": {0: ("batch", 1, 16), 1: ("seq", 1, 128)}}
