"""examples/lm_cache.py's decoder LM (GPT-2, or Llama-style with TCEXPORT_LM=llama) with its static KV cache, as a
package with two methods sharing its weights and its cache (SPEC §2c):

- ``prefill``: the prompt in one call, ``seq`` tokens (dynamic, 1 to the cache length);
- ``decode``: one token, its kernels built for a single row (no dynamic dim).

    tcexport examples/lm_methods.py -o gpt2-methods.tcpkg
    python examples/generate.py gpt2-methods.tcpkg --methods --prompt 5 6 7 8 --new 64

    m = tcexport.loader.load("gpt2-methods.tcpkg")
    s = m.new_session()
    logits = s.methods["prefill"](prompt_ids, np.arange(n))          # [1, n, vocab]; the cache written
    logits = s.methods["decode"](np.array([[tok]]), np.array([n]))   # [1, 1, vocab]; the same cache

The weights are stored once; a session's cache is one set of arrays both methods read and update.
Needs transformers 5, as lm_cache.py does.
"""

import importlib.util
from pathlib import Path

import torch

_spec = importlib.util.spec_from_file_location("_tcexport_lm_cache", Path(__file__).with_name("lm_cache.py"))
lm_cache = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lm_cache)

model = lm_cache.model   # the cached LM (its forward: input_ids [batch, seq], cache_position [seq] -> logits)

_prompt = torch.tensor([[1, 2, 3]] * lm_cache.BATCH)
methods = {
    "prefill": {"example_inputs": (_prompt, torch.arange(3)),
                "dynamic_shapes": {"input_ids": {1: ("seq", 1, lm_cache.CACHE)}, "cache_position": {0: "seq"}}},
    "decode": {"example_inputs": (_prompt[:, :1], torch.tensor([3]))},
}
