"""16-bit GEMM tiles from the table measured on a GPU (exporter/cuda/gemm_table.py) and the few-row tiles of a weight
stored [K, N] (cuda/tiles.py FEW_KN_TILE): what a build without a GPU chooses, checked on the configs and on a
package's launches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tcexport.exporter.cuda.gemm_table import TABLE, measured_tiles
from tcexport.exporter.cuda.tiles import FEW_KN_TILE, FEW_TILE, gemm_config


def _tiles(cfg) -> tuple:
    return cfg.bm, cfg.bn, cfg.bk, cfg.num_warps, cfg.num_stages


def test_a_measured_shape_takes_its_tiles_and_a_shape_between_takes_its_nearest():
    assert measured_tiles(False, 2048, 2048, False) == TABLE[("large", 2048, 2048, False)]
    assert measured_tiles(True, 2048, 2048, True) == TABLE[("small", 2048, 2048, True)]
    assert measured_tiles(False, 5120, 1280, True) == TABLE[("large", 4096, 1024, True)]
    # 2048 and 3072 columns over K 1024 took different tiles in the small band; both are within reach of 2400
    # and 2800, each of which takes its nearer one
    assert TABLE[("small", 2048, 1024, False)] != TABLE[("small", 3072, 1024, False)]
    assert measured_tiles(True, 2400, 1024, False) == TABLE[("small", 2048, 1024, False)]
    assert measured_tiles(True, 2800, 1024, False) == TABLE[("small", 3072, 1024, False)]
    assert _tiles(gemm_config("bfloat16", None, 8192, 2048, b_nk=False)) == TABLE[("large", 8192, 2048, False)]
    assert _tiles(gemm_config("float16", 256, 3072, 768, b_nk=True)) == TABLE[("small", 3072, 768, True)]


def test_split_k_slices_and_views_of_unknown_layout_keep_the_heuristics():
    """The table timed whole GEMMs of a known layout: split-K's slices (a batch of them) and an index view do not
    read it."""
    heuristic = gemm_config("bfloat16", 256, 8192, 2048)
    assert _tiles(gemm_config("bfloat16", 256, 8192, 2048, b_nk=False)) == TABLE[("small", 8192, 2048, False)]
    assert _tiles(heuristic) != TABLE[("small", 8192, 2048, False)]
    assert gemm_config("bfloat16", 256, 8192, 2048, b_nk=False, batch=4) == heuristic


@pytest.mark.parametrize("n, k", [(32000, 2048), (50257, 768), (16384, 64), (None, 2048), (2048, None)])
def test_a_shape_out_of_the_grids_reach_keeps_the_heuristics(n, k):
    assert measured_tiles(False, n, k, False) is None
    assert measured_tiles(False, n, k, True) is None


def test_a_vocabulary_over_many_rows_stays_persistent_and_float32_never_reads_the_table():
    for nk in (True, False):
        assert gemm_config("bfloat16", None, 32000, 2048, tma=True, b_nk=nk).persistent
        assert gemm_config("bfloat16", None, 20000, 2048, tma=True, b_nk=nk).persistent  # within reach of 16384
    assert _tiles(gemm_config("float32", None, 2048, 2048)) == (64, 64, 32, 4, 3)


def test_a_few_rows_over_a_wide_weight_stored_kn_take_wider_tiles():
    few = lambda n, k, nk, batch=1: _tiles(gemm_config("bfloat16", 16, n, k, b_nk=nk, batch=batch))  # noqa: E731
    assert few(8192, 2048, False) == FEW_KN_TILE      # 128 programs of 64 columns
    assert few(32000, 2048, False) == FEW_KN_TILE
    assert few(2048, 2048, False, batch=4) == FEW_KN_TILE  # 32 column tiles x 4 slices
    assert few(2048, 2048, False) == FEW_TILE         # 32 programs of 64 would leave the GPU idle
    assert few(8192, 2048, True) == FEW_TILE          # [N, K]: 16 columns are 16 rows of 256 bytes
    assert few(8192, 2048, None) == FEW_TILE          # a view of another layout


def test_a_packages_decode_band_reads_a_wide_kn_weight_with_wide_tiles():
    from tcexport.exporter import export

    m = nn.Linear(64, 8192).to(torch.bfloat16).eval()
    pkg = export(m, (torch.randn(2, 64, dtype=torch.bfloat16),), {"input": {0: ("rows", 1, 512)}},
                 targets=("cuda:sm_90",), build_cubins=False)
    assert sorted(w.name for w in pkg.manifest.weights) == ["bias", "weight.T"]
    blocks = {launch.name: launch.block for launch in pkg.manifest.cuda.launches}
    few = next(b for name, b in blocks.items() if name.endswith("_m16"))
    assert (few["BM"], few["BN"], few["BK"]) == FEW_KN_TILE[:3], blocks
