"""A decoder LM with a static KV cache, exported the way transformers exports LMs for ExecuTorch
(``TorchExportableModuleWithStaticCache``): ``forward(input_ids, cache_position)`` writes the new keys and values
into cache buffers and returns the logits. The package keeps those buffers as its state, so one forward with a
dynamic ``seq`` serves the prompt (seq = its length) and every decode step (seq = 1).

    tcexport examples/lm_cache.py -o gpt2.tcpkg                 # GPT-2 (small config, random weights)
    TCEXPORT_LM=llama tcexport examples/lm_cache.py -o llama.tcpkg   # Llama-style: RoPE, RMSNorm, grouped KV heads
    python examples/generate.py gpt2.tcpkg --prompt 5 6 7 8 --new 64  # generate torch-free

Needs transformers 5 (its static-cache wrapper takes ``batch_size``, ``max_cache_len`` and ``device``).
TCEXPORT_LM_SIZE=full uses GPT-2 small's / a ~1B Llama's real sizes (random weights): what the benchmark measures;
TCEXPORT_LM_CACHE sets the cache length, TCEXPORT_LM_BATCH the batch (both fixed in the package, as in
transformers' static cache).
"""

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

KIND = os.environ.get("TCEXPORT_LM", "gpt2")
FULL = os.environ.get("TCEXPORT_LM_SIZE", "small") == "full"
CACHE = int(os.environ.get("TCEXPORT_LM_CACHE", "1024" if FULL else "128"))
BATCH = int(os.environ.get("TCEXPORT_LM_BATCH", "1"))
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)


def config():
    if KIND == "gpt2":
        sizes = dict(n_layer=12, n_embd=768, n_head=12, vocab_size=50257) if FULL else \
            dict(n_layer=2, n_embd=64, n_head=4, vocab_size=256, initializer_range=0.3)
        return GPT2Config(n_positions=max(CACHE, 1024 if FULL else 128), **sizes, **NO_SPECIAL)
    if KIND == "llama":
        sizes = dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=32000) if FULL else \
            dict(num_hidden_layers=2, hidden_size=64, intermediate_size=172, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, initializer_range=0.3)
        return LlamaConfig(max_position_embeddings=max(CACHE, 128), **sizes, **NO_SPECIAL)
    raise ValueError(f"TCEXPORT_LM={KIND!r}: use 'gpt2' or 'llama'")


def hf_model():
    """The transformers model itself (what ``generate`` is compared with), seeded."""
    torch.manual_seed(0)
    cfg = config()
    lm = (GPT2LMHeadModel if KIND == "gpt2" else LlamaForCausalLM)(cfg).eval()
    return lm


class CachedLM(torch.nn.Module):
    """input ids [batch, seq] and their positions [seq] -> logits [batch, seq, vocab]; the cache is this module's."""

    def __init__(self, lm):
        super().__init__()
        lm.generation_config.use_cache = True
        lm.generation_config.cache_implementation = "static"
        self.lm = TorchExportableModuleWithStaticCache(lm, batch_size=BATCH, max_cache_len=CACHE, device=lm.device)

    def forward(self, input_ids, cache_position):
        return self.lm(input_ids=input_ids, cache_position=cache_position)


def model(device: str = "cpu", dtype: torch.dtype | None = None):
    """The cached LM on ``device`` in ``dtype`` (the cache is made there: moving the module afterwards would
    leave transformers' cache layers behind)."""
    return CachedLM(hf_model().to(device=device, dtype=dtype))


def example_inputs():
    return (torch.tensor([[1, 2, 3]] * BATCH), torch.arange(3))


dynamic_shapes = {"input_ids": {1: ("seq", 1, CACHE)}, "cache_position": {0: "seq"}}
