"""Attention as one C++ kernel (schedule/cpu.py, cpu/attention.py): block GEMMs and an online softmax, masked
blocks of keys skipped; equal to eager over a static cache at either end of it, for causal and padding masks, in
bfloat16, and with heads too wide for it (the three kernels then)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tcexport.exporter.pipeline import export
from tcexport.loader import load
from tcexport.loader.dtypes import BFLOAT16
from packages import WORK
from attention_models import CacheAttention, Causal, HandWritten, cache_case, qkv

pytestmark = pytest.mark.slow


def _check(module, pkg_path, cases, rtol=1e-5, atol=1e-5):
    m = load(pkg_path)
    for case in cases:
        got = m(*[t.numpy() for t in case])
        with torch.no_grad():
            want = module(*case)
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want.double().numpy(), rtol=rtol, atol=atol,
                                   err_msg=str([tuple(t.shape) for t in case]))


def test_attention_over_a_static_cache_is_one_kernel_and_equals_eager():
    pkg = export(CacheAttention(), cache_case(4, 3, 0), {"q": {2: "seq"}}, name="cpu_cache")
    kernels = pkg.manifest.graphs["inference"].cpu.kernels
    assert [k for k in kernels if k.endswith("_attention")] and not [k for k in kernels if "gemm" in k], kernels
    path = pkg.save(WORK / "cpu-attention-cache.tcpkg")
    cases = [cache_case(lq, pos, seed) for seed, (lq, pos) in
             enumerate([(1, 0), (1, 200), (1, 511), (16, 496), (33, 0), (40, 300), (300, 100)])]
    _check(CacheAttention(), path, cases)


def test_heads_wider_than_the_kernels_blocks_keep_the_three_kernels():
    q, k, v = qkv(1, 2, 8, 160)
    pkg = export(Causal(), (q, k, v), {"q": {2: "seq"}, "k": {2: "seq"}, "v": {2: "seq"}}, name="cpu_wide")
    kernels = pkg.manifest.graphs["inference"].cpu.kernels
    assert not [k for k in kernels if k.endswith("_attention")] and [k for k in kernels if "gemm" in k], kernels
    _check(Causal(), pkg.save(WORK / "cpu-attention-wide.tcpkg"), [qkv(1, 2, n, 160, seed=n) for n in (1, 70)])


@pytest.mark.parametrize("module, inputs, dynamic, cases", [
    (Causal(), qkv(1, 2, 8, 16), {"q": {2: "seq"}, "k": {2: "seq"}, "v": {2: "seq"}},
     [qkv(1, 2, n, 16, seed=n) for n in (1, 31, 33, 64, 65, 300)]),
    (HandWritten(), [*qkv(2, 3, 5, 24), torch.ones(2, 5, dtype=torch.bool)],
     {"q": {2: "seq"}, "k": {2: "seq"}, "v": {2: "seq"}, "keep": {1: "seq"}}, None),
], ids=["causal", "padding-mask"])
def test_self_attention_runs_fused_and_equals_eager(module, inputs, dynamic, cases):
    pkg = export(module, inputs, dynamic, name="cpu_self")
    assert any(k.endswith("_attention") for k in pkg.manifest.graphs["inference"].cpu.kernels)
    if cases is None:  # a padding mask that keeps the first key of every row (an all-masked row is NaN in both)
        cases = []
        for n in (2, 70, 300):
            g = torch.Generator().manual_seed(n)
            keep = torch.rand(2, n, generator=g) > 0.3
            keep[:, 0] = True
            cases.append([*qkv(2, 3, n, 24, seed=n), keep])
    _check(module, pkg.save(WORK / f"cpu-attention-{type(module).__name__}.tcpkg"), cases, rtol=1e-4, atol=1e-5)


def test_bfloat16_cache_attention_matches_eager_within_bf16():
    pkg = export(CacheAttention(), cache_case(4, 3, 0, dtype=torch.bfloat16), {"q": {2: "seq"}}, name="cpu_bf16")
    m = load(pkg.save(WORK / "cpu-attention-bf16.tcpkg"))
    for lq, pos in ((1, 300), (3, 64), (200, 10)):
        case = cache_case(lq, pos, lq, dtype=torch.bfloat16)
        got = m(*[t.view(torch.int16).numpy().view(BFLOAT16) if t.dtype == torch.bfloat16 else t.numpy()
                  for t in case])
        got = torch.from_numpy(np.asarray(got).view(np.int16)).view(torch.bfloat16).double()
        want = CacheAttention()(*[t.double() if t.is_floating_point() else t for t in case])
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-2, atol=2e-2)
