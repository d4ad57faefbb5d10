"""Attention as one C++ kernel where it pays (schedule/cpu.py, cpu/attention.py): long scores and few query rows
over a static cache run the fused kernel, other shapes the scores GEMM, softmax and PV GEMM; exactly one path
runs for any shape, and both equal eager at lengths on either side of the switch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tcexport.exporter.pipeline import export
from tcexport.loader import load
from tcexport.loader.dtypes import BFLOAT16
from packages import WORK
from test_cuda_attention import CacheAttention, Causal, HandWritten, _cache_case, _qkv

pytestmark = pytest.mark.slow


def _check(module, pkg_path, cases, rtol=1e-5, atol=1e-5):
    m = load(pkg_path)
    for case in cases:
        got = m(*[t.numpy() for t in case])
        with torch.no_grad():
            want = module(*case)
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want.double().numpy(), rtol=rtol, atol=atol,
                                   err_msg=str([tuple(t.shape) for t in case]))


def test_few_rows_over_a_static_cache_and_long_prompts_run_the_fused_kernel():
    pkg = export(CacheAttention(), _cache_case(4, 3, 0), {"q": {2: "seq"}}, name="cpu_cache")
    kernels = pkg.manifest.graphs["inference"].cpu.kernels
    fused = [k for k in kernels if k.endswith("_attention")]
    assert len(fused) == 1 and any("gemm" in k for k in kernels), kernels
    source = pkg.members["src/cpu/model.cpp"].decode()
    assert f") {fused[0]}(f);" in source and "_gemm(f);" in source  # both paths kept, a factor picks one
    path = pkg.save(WORK / "cpu-attention-cache.tcpkg")
    cases = [_cache_case(lq, pos, seed) for seed, (lq, pos) in
             enumerate([(1, 0), (1, 200), (1, 511), (16, 496), (17, 0), (40, 300), (127, 5), (128, 0), (300, 100)])]
    _check(CacheAttention(), path, cases)


def test_the_switch_between_paths_is_exact(tmp_path):
    """The fused kernel runs for [seq <= 16] or [seq * 512 >= 65536], the three kernels for every other seq."""
    import re

    import sympy

    export(CacheAttention(), _cache_case(4, 3, 0), {"q": {2: "seq"}}, name="cpu_cache_when", dump=tmp_path)
    text = (tmp_path / "plan.txt").read_text()
    when = sympy.sympify(re.search(r"_attention \[attention\].* when=(.*)", text).group(1))
    seq = next(iter(when.free_symbols))
    for n in (1, 16, 17, 127, 128, 4096):
        assert int(when.subs(seq, n)) == (n <= 16 or n >= 128), n


@pytest.mark.parametrize("module, inputs, dynamic, cases", [
    (Causal(), _qkv(1, 2, 8, 16), {"q": {2: "seq"}, "k": {2: "seq"}, "v": {2: "seq"}},
     [_qkv(1, 2, n, 16, seed=n) for n in (1, 63, 256, 300)]),
    (HandWritten(), [*_qkv(2, 3, 5, 24), torch.ones(2, 5, dtype=torch.bool)],
     {"q": {2: "seq"}, "k": {2: "seq"}, "v": {2: "seq"}, "keep": {1: "seq"}}, None),
], ids=["causal", "padding-mask"])
def test_long_self_attention_runs_fused_and_equals_eager(module, inputs, dynamic, cases):
    pkg = export(module, inputs, dynamic, name="cpu_self")
    assert any(k.endswith("_attention") for k in pkg.manifest.graphs["inference"].cpu.kernels)
    if cases is None:  # a padding mask that keeps the first key of every row (an all-masked row is NaN in both)
        cases = []
        for n in (2, 70, 300):
            g = torch.Generator().manual_seed(n)
            keep = torch.rand(2, n, generator=g) > 0.3
            keep[:, 0] = True
            cases.append([*_qkv(2, 3, n, 24, seed=n), keep])
    _check(module, pkg.save(WORK / f"cpu-attention-{type(module).__name__}.tcpkg"), cases, rtol=1e-4, atol=1e-5)


def test_bfloat16_cache_attention_matches_eager_within_bf16():
    pkg = export(CacheAttention(), _cache_case(4, 3, 0, dtype=torch.bfloat16), {"q": {2: "seq"}}, name="cpu_bf16")
    m = load(pkg.save(WORK / "cpu-attention-bf16.tcpkg"))
    for lq, pos in ((1, 300), (3, 64), (200, 10)):
        case = _cache_case(lq, pos, lq, dtype=torch.bfloat16)
        got = m(*[t.view(torch.int16).numpy().view(BFLOAT16) if t.dtype == torch.bfloat16 else t.numpy()
                  for t in case])
        got = torch.from_numpy(np.asarray(got).view(np.int16)).view(torch.bfloat16).double()
        want = CacheAttention()(*[t.double() if t.is_floating_point() else t for t in case])
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-2, atol=2e-2)
