"""Split-K on the GPU backend (exporter/schedule/split_k.py): a long-K GEMM with few rows runs as K slices plus a summing
kernel that applies its epilogue. Checked without a GPU: exactly one path runs for every shape, the slices
build as sm_90 cubins, and Triton's interpreter matches eager on both sides of the row threshold."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from tcexport.exporter.schedule.small_m import FEW_M, SMALL_M  # noqa: E402
from tcexport.exporter.front.model_file import load_model_file  # noqa: E402
from tcexport.exporter.pipeline import export  # noqa: E402
from tcexport.exporter.schedule.split_k import few_slices, slices  # noqa: E402
from tcexport.exporter.check.interpret import run_interpreted  # noqa: E402
from tcexport.formats import expr as ex  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from tcexport.loader.dtypes import numpy_dtype  # noqa: E402
from packages import MODELS, WORK  # noqa: E402

LONG_K = MODELS / "long_k.py"


def _package(tmp_path, name, module=None, dynamic=True, build_cubins=False, dtype=torch.float32):
    spec = load_model_file(LONG_K)
    module = (module or spec.module).to(dtype)
    xs = tuple(x.to(dtype) for x in spec.example_inputs)
    pkg = export(module, xs, spec.dynamic_shapes if dynamic else None, "cuda:sm_90", name="long_k",
                 cache_dir=WORK / "cache-split-k", build_cubins=build_cubins)
    return pkg.save(tmp_path / f"{name}.tcpkg")


def test_slices():
    # up to SMALL_M rows: enough columns x slices for the SMs, whole slices of at least 256 (K 1024: at most 4)
    assert [slices(64, k) for k in (768, 1000, 1024, 2048, 3072, 4096, 5000)] == [1, 1, 4, 8, 4, 8, 1]
    small = {(768, 3072): 4, (2048, 2048): 4, (3072, 2048): 4, (2048, 8192): 4, (8192, 2048): 1, (32000, 2048): 1,
             (4096, 4096): 2}
    assert {nk: slices(*nk) for nk in small} == small
    # a decode step's: enough columns x slices for the SMs, slices of 512..2048 where K allows (the probe's best)
    shapes = {(2304, 768): 1, (768, 768): 1, (768, 3072): 4, (50257, 768): 1, (2048, 2048): 1, (512, 2048): 4,
              (8192, 2048): 1, (2048, 8192): 4, (64, 2048): 4, (64, 1000): 1}
    assert {nk: few_slices(*nk) for nk in shapes} == shapes


def test_exactly_one_path_runs_for_every_shape(tmp_path):
    """The down-projection (N 64, K 2048) at 8 rows a batch: batch 1-2 (up to FEW_M rows) on 4 slices, 3-32 (up to
    SMALL_M) on 8, the one GEMM above; the up-projection (K 64) is one GEMM with a variant per band."""
    m = open_archive(_package(tmp_path, "paths", build_cubins=True)).manifest
    names = [l.name for l in m.cuda.launches]
    one = next(n for n in names if n.endswith("_gemm_epilogue") and f"{n}_slices" in names)
    paths = {"few": (f"{one}_slices_m{FEW_M}", f"{one}_sum_m{FEW_M}"), "small": (f"{one}_slices", f"{one}_sum"),
             "large": (one,)}
    grids = {l.name: l.grid for l in m.cuda.launches}
    blocks = {l.name: l.block for l in m.cuda.launches}
    assert blocks[paths["few"][0]]["BM"] == 16 and blocks[paths["small"][0]]["BM"] == 64
    for batch in range(1, 65):
        rows = 8 * batch
        want = "few" if rows <= FEW_M else "small" if rows <= SMALL_M else "large"
        for path, launches in paths.items():
            for n in launches:
                assert all(ex.evaluate(g, {"batch": batch}) > 0 for g in grids[n]) == (path == want), (batch, n)
    # the slices' buffers are sized for at most their band's rows, whatever the batch
    assert ex.evaluate(m.cuda.workspace_bytes, {"batch": 64}) < ex.evaluate(m.workspace_bytes, {"batch": 64}) + \
        (8 * SMALL_M + 4 * FEW_M) * 64 * 4 + 4096


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_both_paths_match_eager_in_the_interpreter(tmp_path, dtype):
    path = _package(tmp_path, f"interp-{str(dtype)[6:]}", dtype=dtype)
    module = load_model_file(LONG_K).module
    g = torch.Generator().manual_seed(3)
    # 8 rows a batch: 32 is the last batch on the split path (256 rows), 33 the first on the one GEMM
    xs = [torch.randn(b, 8, 64, generator=g).to(dtype) for b in (1, 3, 32, 33)]
    bf16 = numpy_dtype("bfloat16")
    args = [[x.view(torch.int16).numpy().view(bf16) if dtype == torch.bfloat16 else x.numpy()] for x in xs]
    with torch.no_grad():
        wants = [module.double()(x.double()) for x in xs]
    for x, (got,), want in zip(xs, run_interpreted(path, args), wants):
        got = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16) if dtype == torch.bfloat16 else \
            torch.from_numpy(got)
        # 16-bit floats round the inputs, weights and hidden activations: their tolerance there
        tol = {torch.bfloat16: 3e-2, torch.float16: 5e-3}.get(dtype, 1e-4)
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol, msg=f"batch {x.shape[0]}")


def test_static_rows_drop_the_one_gemm(tmp_path):
    m = open_archive(_package(tmp_path, "static", dynamic=False)).manifest
    names = [l.name for l in m.cuda.launches]
    assert any(n.endswith("_slices") for n in names) and any(n.endswith("_sum") for n in names)
    assert not any(n.endswith("_gemm_epilogue") and f"{n}_slices" in names for n in names)
    assert all(ex.evaluate(g, {}) > 0 for l in m.cuda.launches for g in l.grid)


def test_a_dynamic_row_count_runs_exactly_one_band_and_each_matches_eager(tmp_path):
    """Rows as a dynamic dim (a decode step and a prefill through one graph): each GEMM and each split-K path has
    a variant per band of rows (16-row tiles up to FEW_M, small tiles up to SMALL_M, large tiles above), exactly
    one runs at every row count, and each matches eager in the interpreter."""
    module = load_model_file(LONG_K).module.to(torch.bfloat16)
    x = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(7))
    pkg = export(module, (x.to(torch.bfloat16),), {"x": {1: ("rows", 1, 300)}}, "cuda:sm_90", name="bands",
                 cache_dir=WORK / "cache-split-k", build_cubins=False)
    path = pkg.save(tmp_path / "bands.tcpkg")
    launches = open_archive(path).manifest.cuda.launches
    gemms = [l for l in launches if "BM" in l.block]
    families = {}
    for l in gemms:
        families.setdefault(l.name.split("_")[0], []).append(l)  # k1: its GEMM and its slices, in bands
    assert any(l.name.endswith(f"_m{FEW_M}") for l in gemms)
    for rows in range(1, 301):
        for family, variants in families.items():
            running = [l.name for l in variants if all(ex.evaluate(g, {"rows": rows}) > 0 for g in l.grid)]
            assert len(running) == 1, (rows, family, running)
            few = any(l.name == running[0] and l.block["BM"] == 16 for l in variants)
            assert few == (rows <= FEW_M), (rows, running)
    g = torch.Generator().manual_seed(8)
    xs = [torch.randn(1, r, 64, generator=g).to(torch.bfloat16) for r in (1, 3, FEW_M, FEW_M + 1, 257)]
    bf16 = numpy_dtype("bfloat16")
    with torch.no_grad():
        wants = [copy.deepcopy(module).double()(x.double()) for x in xs]
    args = [[x.view(torch.int16).numpy().view(bf16)] for x in xs]
    for x, (got,), want in zip(xs, run_interpreted(path, args), wants):
        got = torch.from_numpy(got.view(np.int16)).view(torch.bfloat16)
        torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2, msg=f"{x.shape[1]} rows")
