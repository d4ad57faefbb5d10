"""Decoder-style models (our Llama-style example and small `transformers` GPT-2 / Llama / BERT) exported with
dynamic batch and sequence, run torch-free, compared with eager at the range ends and an odd shape."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tcexport.loader as L
from tcexport.formats import errors as E
from packages import EXAMPLES, MODELS, built, load_module

pytestmark = pytest.mark.slow

SHAPES = [(1, 1), (16, 128), (3, 17)]
MODEL_FILES = {
    "decoder": EXAMPLES / "decoder.py",
    "hf_gpt2": MODELS / "hf_gpt2.py",
    "hf_llama": MODELS / "hf_llama.py",
    "hf_bert": MODELS / "hf_bert.py",
}


def _inputs(name: str, batch: int, seq: int) -> list[np.ndarray]:
    rng = np.random.default_rng(batch * 1000 + seq)
    ids = rng.integers(0, 256, size=(batch, seq), dtype=np.int64)
    if name != "hf_bert":
        return [ids]
    mask = np.ones((batch, seq), np.int64)
    mask[0, max(seq // 2, 1):] = 0  # one padded sequence; every row keeps at least one token
    return [ids, mask]


@pytest.mark.parametrize("name", list(MODEL_FILES))
def test_matches_eager(name):
    if name.startswith("hf_"):
        pytest.importorskip("transformers")
    path = MODEL_FILES[name]
    pkg = L.load(built(str(path)))
    module = load_module(path).model().eval()
    for batch, seq in SHAPES:
        xs = _inputs(name, batch, seq)
        got = pkg(*xs)
        with torch.no_grad():
            want = module(*[torch.from_numpy(x) for x in xs]).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4, err_msg=f"{name} at {(batch, seq)}")


@pytest.mark.parametrize("bad", [256, -1])
def test_out_of_range_token_id_is_an_error_not_a_wild_read(bad):
    pkg = L.load(built(str(EXAMPLES / "decoder.py")))
    ids = np.zeros((2, 5), np.int64)
    ids[1, 3] = bad
    with pytest.raises(E.RuntimeKernelError) as info:
        pkg(ids)
    msg = str(info.value)
    assert "out of range" in msg and "w_embed_weight" in msg and "decoder.py" in msg and "self.embed(ids)" in msg
    ids[1, 3] = 7
    assert np.isfinite(pkg(ids)).all()  # the package still works after a failed call
