"""Generate tokens from a stateful LM package, torch-free: numpy and the tcexport loader only.

    python examples/generate.py gpt2.tcpkg --prompt 5 6 7 8 --new 64                # greedy
    python examples/generate.py gpt2.tcpkg --prompt 5 6 7 8 --top-k 20 --top-p 0.9 --seed 1
    python examples/generate.py gpt2-methods.tcpkg --methods --prompt 5 6 7 8   # examples/lm_methods.py

The package is one built from a model file like examples/lm_cache.py: ``(input_ids [1, seq], cache_position
[seq]) -> logits [1, seq, vocab]``, its KV cache kept as the package's state. The prompt goes in as one call
(prefill), then one call per new token (decode); each generation runs in its own session, so several can run
at once over one loaded model. With ``--methods`` the package is one built from examples/lm_methods.py: the prompt
goes through its ``prefill`` method and each new token through ``decode`` (kernels built for one token), both
reading and writing the one cache of the session.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def next_token(logits: np.ndarray, rng: np.random.Generator | None, top_k: int | None = None,
               top_p: float | None = None, temperature: float = 1.0) -> int:
    """Greedy (``rng`` None) or sampled from the softmax over the ``top_k`` most likely tokens whose cumulative
    probability first reaches ``top_p`` (the smallest such set, as transformers' TopPLogitsWarper keeps)."""
    logits = logits.astype(np.float64)
    if rng is None:
        return int(np.argmax(logits))
    logits = logits / temperature
    order = np.argsort(-logits, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    probs = np.exp(logits[order] - logits[order[0]])
    probs /= probs.sum()
    if top_p is not None:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep] / probs[:keep].sum()
    return int(order[rng.choice(len(order), p=probs)])


def generate(model, prompt, new_tokens: int, *, top_k: int | None = None, top_p: float | None = None,
             temperature: float = 1.0, seed: int | None = None, session=None, methods: bool = False) -> list[int]:
    """``new_tokens`` token ids after ``prompt``; sampling when ``seed`` is given, else greedy. Runs in
    ``session`` (default: a new one of ``model``), whose cache must be empty; ``methods``: the prompt through the
    package's ``prefill`` method, the new tokens through ``decode`` (else both through its one forward)."""
    session = session if session is not None else model.new_session()
    prefill, decode = (session.methods["prefill"], session.methods["decode"]) if methods else (session, session)
    rng = np.random.default_rng(seed) if seed is not None else None
    ids = np.asarray(prompt, dtype=np.int64).reshape(1, -1)
    logits = prefill(ids, np.arange(ids.shape[1], dtype=np.int64))
    out = [next_token(np.asarray(logits)[0, -1], rng, top_k, top_p, temperature)]
    position = ids.shape[1]
    for _ in range(new_tokens - 1):
        logits = decode(np.array([[out[-1]]], dtype=np.int64), np.array([position], dtype=np.int64))
        out.append(next_token(np.asarray(logits)[0, -1], rng, top_k, top_p, temperature))
        position += 1
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("package")
    p.add_argument("--prompt", type=int, nargs="+", required=True, help="token ids")
    p.add_argument("--new", type=int, default=32, help="tokens to generate (default 32)")
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, help="sample with this seed (default: greedy)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--methods", action="store_true", help="the package has prefill and decode methods "
                   "(examples/lm_methods.py): the prompt through prefill, each new token through decode")
    a = p.parse_args(argv)
    from tcexport.loader import load

    model = load(a.package, device=a.device)
    sample = a.seed is not None or a.top_k is not None or a.top_p is not None
    tokens = generate(model, a.prompt, a.new, top_k=a.top_k, top_p=a.top_p, temperature=a.temperature,
                      seed=(a.seed if a.seed is not None else 0) if sample else None, methods=a.methods)
    print(" ".join(map(str, tokens)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
