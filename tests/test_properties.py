"""Property tests: any valid shape inside the ranges matches eager; any invalid shape raises a GuardError.

Never a crash, never garbage: the guards stand between a request and the kernels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tcexport.loader as L
from tcexport.formats.errors import GuardError
from packages import MODELS, built, load_module

pytestmark = pytest.mark.slow
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def block():
    return L.load(built(str(MODELS / "block3d.py"))), load_module(MODELS / "block3d.py").model().eval()


@pytest.fixture(scope="module")
def mix():
    return L.load(built(str(MODELS / "two_inputs.py"))), load_module(MODELS / "two_inputs.py").model().eval()


@SETTINGS
@given(batch=st.integers(1, 64), seq=st.integers(1, 128), seed=st.integers(0, 2**16))
def test_valid_shapes_match_eager(block, batch, seq, seed):
    pkg, module = block
    x = np.random.default_rng(seed).standard_normal((batch, seq, 32), dtype=np.float32)
    got = pkg(x)
    with torch.no_grad():
        want = module(torch.from_numpy(x))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), atol=3e-5, rtol=1e-4)


@SETTINGS
@given(shape=st.lists(st.integers(0, 200), min_size=0, max_size=4),
       dtype=st.sampled_from([np.float32, np.float64, np.int64, np.float16]))
def test_invalid_shapes_raise_guard_errors(block, shape, dtype):
    pkg, _ = block
    valid = (len(shape) == 3 and 1 <= shape[0] <= 64 and 1 <= shape[1] <= 128 and shape[2] == 32
             and dtype == np.float32)
    x = np.zeros(shape, dtype)
    if valid:
        out = pkg(x)
        assert out[0].shape == tuple(shape)
    else:
        with pytest.raises(GuardError) as info:
            pkg(x)
        assert info.value.input == "x" or info.value.input is None


@SETTINGS
@given(a_batch=st.integers(1, 40), b_batch=st.integers(1, 40))
def test_shared_symbol_must_agree(mix, a_batch, b_batch):
    pkg, module = mix
    a = np.ones((a_batch, 16), np.float32)
    b = np.full((b_batch, 16), 0.5, np.float32)
    if a_batch == b_batch:
        with torch.no_grad():
            want = module(torch.from_numpy(a), torch.from_numpy(b)).numpy()
        np.testing.assert_allclose(pkg(a, b), want, atol=1e-5, rtol=1e-5)
    else:
        with pytest.raises(GuardError):
            pkg(a, b)
