"""The GPU backend's own kernel list: attention fused into one flash-attention kernel (exporter/schedule/attention.py),
and GEMMs with a small-M launch variant. Checked without a GPU: the manifest's launches, and the kernels run in
Triton's interpreter against eager PyTorch at lengths around the key block (64)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tcexport.exporter.pipeline import export  # noqa: E402
from tcexport.exporter.check.interpret import run_interpreted  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from packages import MODELS, WORK  # noqa: E402
from attention_models import (CacheAttention, Causal, GroupedCacheAttention, HandWritten, Masked,  # noqa: E402
                              cache_case, qkv)

pytestmark = pytest.mark.slow

SEQ = {2: "seq"}


def _export(module, inputs, dynamic, name):
    pkg = export(module, inputs, dynamic, "cuda:sm_90", name=name, build_cubins=False)
    path = WORK / f"attention-{name}.tcpkg"
    pkg.save(path)
    return path


def _launch_names(path) -> list[str]:
    return [launch.name for launch in open_archive(path).manifest.cuda.launches]


def _check(path, module, cases, rtol=1e-5, atol=1e-5):
    got = run_interpreted(path, [[t.numpy() for t in case] for case in cases])
    for case, outs in zip(cases, got):
        with torch.no_grad():
            want = module(*case)
        np.testing.assert_allclose(np.asarray(outs[0], dtype=np.float64), want.double().numpy(), rtol=rtol,
                                   atol=atol, err_msg=str([tuple(t.shape) for t in case]))


def test_causal_sdpa_is_one_kernel_and_matches_eager():
    path = _export(Causal(), qkv(1, 2, 8, 16), {"q": SEQ, "k": SEQ, "v": SEQ}, "causal")
    names = _launch_names(path)
    assert [n for n in names if n.endswith("_attention")] and not [n for n in names if "reduce_max" in n], names
    m = open_archive(path).manifest
    env = {"seq": 100}
    from tcexport.formats import expr as ex
    # the scores and probabilities are never written, on the GPU as on the CPU (cpu/attention.py): each arena is
    # smaller than one head's float32 scores
    assert max(ex.evaluate(m.cuda.workspace_bytes, env), ex.evaluate(m.workspace_bytes, env)) < 4 * 100 * 100
    _check(path, Causal(), [qkv(1, 2, n, 16, seed=n) for n in (1, 3, 64, 65, 130)])


def test_masked_sdpa_with_other_key_length_matches_eager():
    kv = {2: "keys"}
    q, k, v = qkv(2, 2, 4, 32, lk=6)
    mask = torch.randn(2, 1, 4, 6)
    path = _export(Masked(), (q, k, v, mask), {"q": SEQ, "k": kv, "v": kv, "mask": {2: "seq", 3: "keys"}}, "masked")
    assert any(n.endswith("_attention") for n in _launch_names(path))
    cases = []
    for lq, lk in ((1, 1), (5, 70), (67, 3)):
        q, k, v = qkv(2, 2, lq, 32, lk=lk, seed=lq)
        cases.append([q, k, v, torch.randn(2, 1, lq, lk)])
    _check(path, Masked(), cases)


def test_a_mask_with_rows_of_a_symbolic_length_gets_an_aligned_variant():
    """The mask's row stride is the key length, unknown at build time, so its loads cannot be vectorised; a
    second cubin of the attention kernel is compiled knowing ``keys`` a multiple of 16, and exactly one of the
    two runs for any binding (the query length ``seq`` scales no row, so it needs no variant)."""
    from tcexport.formats import expr as ex

    kv = {2: "keys"}
    q, k, v = qkv(1, 2, 4, 32, lk=16)
    pkg = export(Masked(), (q, k, v, torch.randn(1, 1, 4, 16)), {"q": SEQ, "k": kv, "v": kv,
                 "mask": {2: "seq", 3: "keys"}}, "cuda:sm_90", name="aligned", cache_dir=WORK / "cache")
    launches = [l for l in pkg.manifest.cuda.launches if "_attention" in l.name]
    assert [l.name.endswith("_a16") for l in launches] == [False, True], [l.name for l in launches]
    for seq, keys in ((1, 1), (4, 16), (5, 16), (3, 17), (32, 48), (16, 20)):
        env = {"seq": seq, "keys": keys}
        runs = [min(ex.evaluate(g, env) for g in l.grid) > 0 for l in launches]
        assert runs == [keys % 16 != 0, keys % 16 == 0], (env, runs)
    path = WORK / "attention-aligned.tcpkg"
    pkg.save(path)
    archive = open_archive(path)
    (bundle,) = archive.manifest.kernels
    cubins = {c.kernel: archive.read(c.file) for c in archive.manifest.cubins(bundle.isa)}
    assert cubins[launches[0].name] != cubins[launches[1].name]  # one source (run below), two compilations
    cases = [[*qkv(1, 2, lq, 32, lk=lk, seed=lk), torch.randn(1, 1, lq, lk)] for lq, lk in ((3, 16), (5, 33))]
    _check(path, Masked(), cases)


def test_hand_written_attention_with_padding_mask_matches_eager():
    q, k, v = qkv(2, 3, 5, 24)
    keep = torch.ones(2, 5, dtype=torch.bool)
    path = _export(HandWritten(), (q, k, v, keep), {"q": SEQ, "k": SEQ, "v": SEQ, "keep": {1: "seq"}}, "hand")
    assert any(n.endswith("_attention") for n in _launch_names(path))
    cases = []
    for n in (2, 66):
        q, k, v = qkv(2, 3, n, 24, seed=n)
        keep = torch.rand(2, n, generator=torch.Generator().manual_seed(n)) > 0.3
        keep[:, 0] = True  # every row keeps a key (an all-masked row is NaN in both)
        cases.append([q, k, v, keep])
    _check(path, HandWritten(), cases)


def test_bfloat16_attention_matches_eager_within_bf16():
    inputs = qkv(1, 2, 8, 64, dtype=torch.bfloat16)
    path = _export(Causal(), inputs, {"q": SEQ, "k": SEQ, "v": SEQ}, "causal_bf16")
    assert any(n.endswith("_attention") for n in _launch_names(path))
    got = run_interpreted(path, [[t.view(torch.uint16).numpy() for t in qkv(1, 2, 70, 64, seed=1, dtype=torch.bfloat16)]])
    out = torch.from_numpy(np.asarray(got[0][0]).view(np.uint16).astype(np.int32)).to(torch.int16).view(torch.bfloat16)
    want = Causal()(*[t.double() for t in qkv(1, 2, 70, 64, seed=1, dtype=torch.bfloat16)])
    np.testing.assert_allclose(out.double().numpy(), want.numpy(), rtol=2e-2, atol=2e-2)


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(128, 1536)  # over 1024 columns: small-M and large tiles differ

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_gemm_small_m_variant_and_large_one_each_run_alone():
    torch.manual_seed(0)
    model = Linear().to(torch.bfloat16)
    x = torch.randn(4, 128).to(torch.bfloat16)
    pkg = export(model, (x,), {"x": {0: ("rows", 1, 4096)}}, "cuda:sm_90", name="variants", build_cubins=False)
    path = WORK / "attention-variants.tcpkg"
    pkg.save(path)
    launches = open_archive(path).manifest.cuda.launches
    gemms = [launch for launch in launches if "gemm" in launch.name]
    assert [g.name[-5:] for g in gemms] == [gemms[0].name[-5:], "_m256", "e_m16"]  # large, small, a decode step's
    assert len({str(g.block) for g in gemms}) == 3 and gemms[2].block["BM"] == 16
    from tcexport.formats import expr as ex
    for rows in (1, 16, 17, 256, 257, 600):  # exactly one variant has a grid without a 0
        assert sum(min(ex.evaluate(g, {"rows": rows}) for g in launch.grid) > 0 for launch in gemms) == 1
    cases = [torch.randn(rows, 128).to(torch.bfloat16) for rows in (3, 20, 300)]
    got = run_interpreted(path, [[c.view(torch.uint16).numpy()] for c in cases])
    for c, outs in zip(cases, got):
        out = torch.from_numpy(np.asarray(outs[0]).view(np.uint16).astype(np.int32)).to(torch.int16)
        with torch.no_grad():
            want = model.double()(c.double())
            model.to(torch.bfloat16)
        np.testing.assert_allclose(out.view(torch.bfloat16).double().numpy(), want.numpy(), rtol=2e-2, atol=2e-2)


def test_heads_of_a_fused_projection_are_read_in_place_without_divisions():
    """GPT-2's attention reads q, k and v as views of one projection; the K^T view simplifies, knowing each
    coordinate's range, to plain strides: the attention kernel's key load divides only the program's (batch,
    head) index, never per element (fuse.simplify_in_ranges)."""
    from tcexport.exporter.front.model_file import load_model_file

    spec = load_model_file(str(MODELS / "hf_gpt2.py"))
    pkg = export(spec.module.to(torch.bfloat16), spec.example_inputs, spec.dynamic_shapes, "cuda:sm_90",
                 name="gpt2_tiny", build_cubins=False)
    path = WORK / "attention-gpt2-tiny.tcpkg"
    pkg.save(path)
    source = open_archive(path).read("src/cuda/model_triton.py").decode()
    kernel = source[source.index("_attention("):]
    lines = [line.strip() for line in kernel.splitlines()]
    key_load = next(line for line in lines if line.startswith("kt = tl.load("))
    batch = {line.split(" = ")[0] for line in lines if line.endswith(" = bid")}  # the program's (batch, head)
    divided = [left.lstrip("(") for left in re.findall(r"(\S+) // ", key_load)]
    assert divided and set(divided) <= batch, key_load  # only the per-program head index is split


class ReturnsWeights(torch.nn.Module):
    """Attention that also returns its probabilities (output_attentions): they must be written, so no fusion."""

    def forward(self, q, k, v):
        p = (q @ k.transpose(-2, -1) * 0.25).softmax(-1)
        return p @ v, p


def test_probabilities_returned_as_an_output_are_not_fused_away():
    inputs = qkv(1, 2, 8, 16)
    path = _export(ReturnsWeights(), inputs, {"q": SEQ, "k": SEQ, "v": SEQ}, "returns_weights")
    assert not any(n.endswith("_attention") for n in _launch_names(path))
    case = qkv(1, 2, 9, 16, seed=3)
    got = run_interpreted(path, [[t.numpy() for t in case]])[0]
    for g, w in zip(got, ReturnsWeights()(*case)):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-5)


def test_few_query_rows_over_a_static_cache_split_the_keys_and_skip_empty_blocks():
    """Up to 16 query rows (a decode step) the keys of a static 512-key cache split over 4 programs a head, whose
    partial results a combining kernel merges (schedule/split_kv.py); more rows run the one attention kernel.
    Exactly one path runs per length; blocks of keys past the position are all -inf and skipped. Both equal
    eager at lengths on either side of the split and with the position at either end of the cache."""
    from tcexport.formats import expr as ex

    path = _export(CacheAttention(), cache_case(4, 3, 0), {"q": SEQ}, "cache_split")
    launches = [l for l in open_archive(path).manifest.cuda.launches if "attention" in l.name]
    names = [l.name.rsplit("_attention", 1)[1] for l in launches]
    assert names == ["", "_split", "_combine"], [l.name for l in launches]
    assert launches[1].block["SPLITS"] == 4 and str(launches[1].grid[2]) == "4"
    for seq in (1, 16, 17, 64):
        runs = [min(ex.evaluate(g, {"seq": seq}) for g in l.grid) > 0 for l in launches]
        assert runs == [seq > 16, seq <= 16, seq <= 16], (seq, runs)
    cases = [cache_case(lq, pos, seed) for seed, (lq, pos) in
             enumerate([(1, 0), (1, 200), (1, 511), (5, 130), (16, 496), (17, 0), (40, 300)])]
    _check(path, CacheAttention(), cases)


@pytest.mark.parametrize("gqa", [False, True], ids=["repeat_kv", "enable_gqa"])
def test_query_heads_sharing_a_kv_head_take_one_program_of_the_split(gqa):
    """Grouped-query attention, 16 query heads over 2 KV heads, repeated the way transformers does or by SDPA's
    enable_gqa: each split program takes the 8 heads of a group as rows, reading their keys and values once
    (schedule/split_kv.kv_group), so 2 x 16 heads run 4 programs a slice, and the 512 keys split 8 ways (one
    64-key block a slice) instead of 4. Equal to eager on either side of the split, a group's rows spanning
    two programs' row blocks (16 rows x 8 heads) included."""
    from tcexport.formats import expr as ex

    module = GroupedCacheAttention(gqa)
    path = _export(module, cache_case(4, 3, 0, heads=(16, 2)), {"q": SEQ}, f"cache_gqa_{gqa}")
    split = next(l for l in open_archive(path).manifest.cuda.launches if l.name.endswith("_split"))
    assert split.block["SPLITS"] == 8 and ex.evaluate(split.grid[1], {"seq": 1}) == 4, (split.grid, split.block)
    assert [ex.evaluate(split.grid[0], {"seq": seq}) for seq in (1, 16)] == [1, 2], split.grid
    cases = [cache_case(lq, pos, seed, heads=(16, 2)) for seed, (lq, pos) in
             enumerate([(1, 0), (1, 300), (5, 130), (16, 496), (17, 20)])]
    _check(path, module, cases)


def test_a_bfloat16_decode_step_over_a_split_cache_matches_eager_within_bf16():
    path = _export(CacheAttention(), cache_case(4, 3, 0, dtype=torch.bfloat16), {"q": SEQ}, "cache_split_bf16")
    for lq, pos in ((1, 300), (3, 64)):
        case = cache_case(lq, pos, lq, dtype=torch.bfloat16)
        got = run_interpreted(path, [[t.view(torch.uint16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
                                      for t in case]])
        out = torch.from_numpy(np.asarray(got[0][0]).view(np.uint16).astype(np.int32)).to(torch.int16)
        want = CacheAttention()(*[t.double() if t.is_floating_point() else t for t in case])
        np.testing.assert_allclose(out.view(torch.bfloat16).double().numpy(), want.numpy(), rtol=2e-2, atol=2e-2)
