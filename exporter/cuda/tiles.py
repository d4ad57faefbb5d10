"""Tile configs as data: for each kind of kernel, the heuristic that picks its tiles from the shapes it runs over
(documented with the measurements behind it), the variants a GEMM gets per row count, and a tuning's configs
(``--autotune``, manifest ``cuda.tuning``) checked and turned into the same records. Templates read these
records; nothing here renders.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from torch.utils._sympy.functions import FloorDiv

from tcexport.exporter.cuda.exprs import HALF, next_pow2
from tcexport.exporter.cuda.gemm_table import measured_tiles
from tcexport.exporter.errors import BuildError
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import upper_bound
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.small_m import FEW_M, SMALL_M


@dataclass(frozen=True)
class Geometry:
    """How a launch is launched, decided from its config: the grid (three sympy expressions of the shape
    symbols), the constexpr block sizes, warps and pipeline stages."""

    grid: tuple
    constexprs: dict
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class LoopConfig:
    xblock: int
    rblock: int
    persistent: bool
    num_warps: int


def loop_config(rows_max: int | None, inner_static: int | None, inner_max: int | None = None) -> LoopConfig:
    """Heuristics (measured on an H200 with GPT-2 small's rows): a row whose static length fits 4096 elements is
    reduced in one tile (persistent), several rows a program so a program holds about 2048 elements; a row of
    symbolic length loops over 128-wide chunks, 8 rows a program (a 1024-wide tile, one row a program, ran
    GPT-2's 128-long softmax rows 8x slower); one bounded by 128 is persistent at its bound."""
    if inner_static is not None and inner_static <= 4096:
        rblock = next_pow2(inner_static)
        xblock = max(1, min(2048 // rblock, 64))
        if rows_max is not None:
            xblock = min(xblock, next_pow2(rows_max))
        return LoopConfig(xblock, rblock, True, 8 if rblock * xblock >= 4096 else 4)
    if inner_static is None and inner_max is not None and inner_max <= 128:
        rblock = next_pow2(inner_max)
        return LoopConfig(max(1, min(1024 // rblock, 64)), rblock, True, 4)
    if inner_static is None:
        return LoopConfig(8, 128, False, 4)
    return LoopConfig(1, 1024, False, 8)


def loop_tiles(k: Kernel, bounds: dict) -> LoopConfig:
    """A loop kernel's config: ``loop_config`` for a row reduction; an elementwise kernel takes up to 1024
    elements a program (fewer warps for small ones)."""
    rows, inner = ir.product(k.outer), ir.product(k.inner)
    if not k.inner:
        size = upper_bound(rows, bounds)
        xblock = min(1024, next_pow2(size)) if size is not None else 1024
        return LoopConfig(xblock, 1, True, 4 if xblock >= 512 else (2 if xblock >= 128 else 1))
    inner_static = int(inner) if sympy.sympify(inner).is_Integer else None
    return loop_config(upper_bound(rows, bounds), inner_static, upper_bound(inner, bounds))


def loop_geometry(k: Kernel, cfg: LoopConfig) -> Geometry:
    rows = ir.product(k.outer)
    grid = (FloorDiv(rows + cfg.xblock - 1, cfg.xblock), sympy.Integer(1), sympy.Integer(1))
    constexprs = {"XBLOCK": cfg.xblock} | ({"RBLOCK": cfg.rblock} if k.inner else {})
    return Geometry(grid, constexprs, cfg.num_warps, 1)


@dataclass(frozen=True)
class GemmConfig:
    bm: int
    bn: int
    bk: int
    group_m: int
    num_warps: int
    num_stages: int
    persistent: bool = False  # one program per SM walking its tiles, TMA loads (gemm.persistent_head)


FEW_TILE = (16, 16, 128, 2, 5)
"""BM, BN, BK, warps, stages of a GEMM over at most FEW_M rows (a decode step) in 16-bit floats: one 16-row tile
(tl.dot's least) holds the rows, 16 columns a program so that even a 768-wide projection has 48 programs, and a
5-deep pipeline of 128-long K steps (split_k.few_slices splits K for the rest). Swept on an H100 over GPT-2
small's and a ~1B Llama's projections at 1 and 8 rows, each in a CUDA graph of its layers' weights (python -m
bench.probes.decode_gemm; bench/results/nvidia-h100-2026-12-06-decode-gemm.md): within 6% of the best of 80
configs on every one, and 5-30% faster than the 64x64x128 tiles of more rows (Llama's MLP up-projection 14.1
against 18.8 us, its LM head 46 against 59 us; cuBLAS 14.5 and 50). A GEMV without tl.dot (the rows times the
weight tile in registers) was slower in the model (H200, GPT-2 0.880 against 0.689 ms a step): a memory-bound
step has tensor-core work to spare."""

FEW_KN_TILE = (16, 64, 64, 4, 5)
"""FEW_TILE's counterpart for a weight stored [K, N] (front/weights_kn.py) with columns enough for FEW_PROGRAMS
programs of 64: 16 columns of such a weight are 32 bytes a K-row, and a ~1B Llama's LM head took 59.9 us with
FEW_TILE against 45.7-46.7 us with 64 columns (the best of 120 configs; 46.7 with its weight [N, K] and FEW_TILE),
its MLP up-projection 16.0 against 14.4, its down-projection (4 slices) 17.8 against 15.8; a 2048-column projection
keeps FEW_TILE: 7.3 us, as with [N, K] (python -m bench.probes.decode_gemm --layout kn, H100;
bench/results/nvidia-h100-2026-12-07-gemm-table.md)."""
FEW_PROGRAMS = 128  # programs (column tiles times K slices) a decode step's GEMM needs to fill an H100's 132 SMs

VOCABULARY_N = 16384  # columns past which a GEMM over many rows counts as an LM head (persistent with TMA)

TUNABLE = ("gemm", "attention")  # the kernel kinds whose tiles --autotune chooses
ALIGN = 16  # elements: a symbol a kernel's aligned variant knows to be a multiple of (launches.unaligned)


def gemm_config(dtype: str, m_max: int | None, n_max: int | None, k_max: int | None,
                tma: bool = False, b_nk: bool | None = None, batch: int = 1) -> GemmConfig:
    """Heuristics, from sweeps of this template on an H200 over GPT-2 small's GEMMs (M 128, 1024 and 4096; N 768
    to 50257; K 768, 3072), in CUDA graphs and in the model. 16-bit floats, with many rows: 64x128x64 tiles with
    a 5-stage pipeline (4 warps) up to 1024 columns (the down-projection at 1024 rows: 13.0-14.3 us in the model
    against 14.9-15.5 for 64x64x128 with 3 stages; 64x128x64 with 3 stages took 20.5), the same with 3 up to 16K
    columns, 128x256x64 with 8 warps for a vocabulary-sized N; with at most SMALL_M rows, 64x64x128
    (3 stages) up to 16K columns, which gives such a GEMM twice the programs (GPT-2's MLP up-projection at 128
    rows: 5.6 us against 8.7), and 128x128x64 for a vocabulary. float32 (full-precision dots) takes 64x64x32,
    float64 32x32x16. A small M, N or K shrinks its tile side (tl.dot needs at least 16); BK never exceeds what
    K needs. At most FEW_M rows in 16-bit floats: FEW_TILE. ``m_max`` (None: unbounded) says which band of rows
    the GEMM runs for; ``batch``, how many GEMMs one launch runs (the grid's second dim: split-K's slices, a
    batched GEMM's batch); ``b_nk``, whether B is stored [N, K] (True), [K, N] (False) or otherwise (None).

    A vocabulary-sized N with many rows, when ``tma`` (both operands can be read through TMA descriptors,
    gemm.tma_views), is persistent: one program per SM walks its tiles and Triton pipelines the next
    tile's loads under this one's epilogue. GPT-2's LM head at 1024 rows, 128x256x64 tiles: in the model 134 us
    with 4 stages, against 175 us one program per tile, and a call 785 against 827 us (python -m
    bench.probes.lm_head); alone 144.5 against 167.5 us, cuBLAS 119 us on a padded N. Without TMA loads, or
    without flattening the tile loop, it was no faster alone (python -m bench.probes.persistent_gemm).

    Above FEW_M rows, a single 16-bit GEMM (``batch`` 1: the table timed whole GEMMs, not split-K's slices) whose
    weight shape lies near one measured on a GPU takes the measured tiles (cuda/gemm_table.py: per row band, (N, K)
    and the weight's layout), unless it is a vocabulary-sized persistent one; these heuristics are for the rest. A
    few rows over a weight stored [K, N] take FEW_KN_TILE where it leaves enough programs."""
    small_m = m_max is not None and m_max <= SMALL_M
    if dtype in HALF and m_max is not None and m_max <= FEW_M:
        wide = b_nk is False and n_max is not None and -(-n_max // FEW_KN_TILE[1]) * batch >= FEW_PROGRAMS
        bm, bn, bk, warps, stages = FEW_KN_TILE if wide else FEW_TILE
        return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, stages), m_max, n_max, k_max)
    vocabulary = tma and not small_m and (n_max is None or n_max > VOCABULARY_N)
    measured = measured_tiles(small_m, n_max, k_max, b_nk) \
        if dtype in HALF and b_nk is not None and batch == 1 and not vocabulary else None
    if measured is not None:
        bm, bn, bk, warps, stages = measured
        return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, stages), m_max, n_max, k_max)
    if dtype in HALF:
        if n_max is not None and n_max <= 1024 and not small_m:
            bm, bn, bk, warps, stages = 64, 128, 64, 4, 5
        elif n_max is not None and (n_max <= 1024 or small_m and n_max <= 16384):
            bm, bn, bk, warps, stages = 64, 64, 128, 4, 3
        elif n_max is not None and n_max <= VOCABULARY_N:
            bm, bn, bk, warps, stages = 64, 128, 64, 4, 3
        else:
            bm, bn, bk, warps, stages = (128, 128, 64, 8, 3) if small_m else (128, 256, 64, 8, 3)
            if vocabulary:
                return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, 4, persistent=True), m_max, n_max, k_max)
    elif dtype == "float32":
        bm, bn, bk, warps, stages = 64, 64, 32, 4, 3
    else:
        bm, bn, bk, warps, stages = 32, 32, 16, 4, 2
    return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, stages), m_max, n_max, k_max)


def fit_gemm(cfg: GemmConfig, m_max: int | None, n_max: int | None, k_max: int | None) -> GemmConfig:
    """``cfg`` with each tile side cut to what its dim needs (at least 16, tl.dot's minimum)."""
    bm, bn, bk = (side if bound is None else min(side, max(16, next_pow2(bound)))
                  for side, bound in ((cfg.bm, m_max), (cfg.bn, n_max), (cfg.bk, k_max)))
    return GemmConfig(bm, bn, bk, cfg.group_m, cfg.num_warps, cfg.num_stages, cfg.persistent)


def gemm_variants(dtype: str, m, m_max: int | None, n_max: int | None, k_max: int | None,
                  tma: bool = False, m_min: int = 1, b_nk: bool | None = None, batch: int = 1) -> list:
    """[(suffix, condition, config)]: one config, or, when M is symbolic, one per band of rows it may take between
    ``m_min`` and ``m_max``: more than SMALL_M (large tiles), up to SMALL_M (small tiles), up to FEW_M (a decode
    step's: FEW_TILE), a prefill and a decode step through one graph. The condition is an integer expression, 1
    where its variant runs and 0 elsewhere (it multiplies the launch grid; a launch whose grid has a 0 is
    skipped, SPEC §6a), so the choice is made per shape signature without any new manifest field."""
    m = sympy.sympify(m)
    if m.is_Integer:
        return [("", sympy.Integer(1), gemm_config(dtype, m_max, n_max, k_max, tma=tma, b_nk=b_nk, batch=batch))]
    bands = []  # (suffix, rows above, rows up to, config); the lowest band starts at 0
    if m_max is None or m_max > SMALL_M:
        bands.append(("", SMALL_M if m_min <= SMALL_M else 0, None,
                      gemm_config(dtype, m_max, n_max, k_max, tma=tma, b_nk=b_nk, batch=batch)))
    if m_min <= SMALL_M and (m_max is None or m_max > FEW_M):
        bands.append((f"_m{SMALL_M}", FEW_M if m_min <= FEW_M else 0, SMALL_M,
                      gemm_config(dtype, min(m_max or SMALL_M, SMALL_M), n_max, k_max, b_nk=b_nk, batch=batch)))
    if m_min <= FEW_M:
        bands.append((f"_m{FEW_M}", 0, FEW_M, gemm_config(dtype, min(m_max or FEW_M, FEW_M), n_max, k_max,
                                                           b_nk=b_nk, batch=batch)))
    merged = []  # a band whose config equals the one above it joins it
    for suffix, lo, hi, cfg in bands:
        if merged and merged[-1][3] == cfg:
            merged[-1] = (merged[-1][0], lo, merged[-1][2], cfg)
        else:
            merged.append((suffix, lo, hi, cfg))
    if len(merged) == 1:
        return [("", sympy.Integer(1), merged[0][3])]
    return [(suffix if i else "", _band(m, lo, hi), cfg) for i, (suffix, lo, hi, cfg) in enumerate(merged)]


def _band(m, lo: int, hi: int | None):
    """1 when lo < m <= hi, else 0 (m >= 1)."""
    above = sympy.Integer(1) if lo == 0 else sympy.Min(1, sympy.Max(0, m - lo))
    return above if hi is None else above * sympy.Min(1, sympy.Max(0, hi + 1 - m))


@dataclass(frozen=True)
class AttentionConfig:
    bm: int
    bn: int
    bd: int
    bdv: int
    num_warps: int
    num_stages: int


def attention_config(dtype: str, d: int, dv: int, m_max: int | None) -> AttentionConfig:
    """Flash-attention tiles: 64 query rows a program and 64 keys a step, 4 warps, 2 stages (the best overall of
    13 configs swept on an H200 over GPT-2 small's heads at 12, 96 and 384 of them: within 8% of each one's best),
    the head dims padded to a power of two (at least 16, what tl.dot needs); float32 steps by 32 keys (its tiles
    take twice the registers). Few query rows shrink the row block."""
    bm, bn = 64, (64 if dtype in HALF else 32)
    if m_max is not None:
        bm = min(bm, max(16, next_pow2(m_max)))
    return AttentionConfig(bm, bn, max(16, next_pow2(d)), max(16, next_pow2(dv)), 4, 2)


def tuned_config(name: str, kind: str, chosen: dict, heuristic):
    """A config recorded by ``--autotune`` (manifest ``cuda.tuning.configs[name]``: the launch's block sizes,
    ``num_warps`` and ``num_stages``) as the dataclass the template takes. Head dims (attention's BD, BDV) are
    the model's, not tunable."""
    fields = ({"BM": "bm", "BN": "bn", "BK": "bk", "GROUP_M": "group_m"} if kind == "gemm"
              else {"BM": "bm", "BN": "bn", "BD": "bd", "BDV": "bdv"})
    fields |= {"num_warps": "num_warps", "num_stages": "num_stages"}
    values = dict(vars(heuristic))
    for key, value in chosen.items():
        if key not in fields or isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BuildError(f"tuning for kernel {name}: {key}={value!r} is not a {kind} setting (expected "
                             f"positive integers for {sorted(fields)}); rebuild the tuning with --autotune")
        values[fields[key]] = value
    cfg = type(heuristic)(**values)
    if kind == "attention" and (cfg.bd, cfg.bdv) != (heuristic.bd, heuristic.bdv):
        raise BuildError(f"tuning for kernel {name}: head blocks BD={cfg.bd}, BDV={cfg.bdv}, but this model's "
                         f"heads need {heuristic.bd}, {heuristic.bdv}; the tuning is from another model")
    if cfg.bm < 16 or cfg.bn < 16 or kind == "gemm" and cfg.bk < 16:
        raise BuildError(f"tuning for kernel {name}: tiles {cfg} have a side below 16, which tl.dot cannot take")
    sides = [cfg.bm, cfg.bn, cfg.bk] if kind == "gemm" else [cfg.bm, cfg.bn]
    if any(s & (s - 1) for s in sides) or cfg.num_warps not in (1, 2, 4, 8, 16):
        raise BuildError(f"tuning for kernel {name}: tiles {sides} and {cfg.num_warps} warps; Triton needs powers "
                         "of two for both (warps at most 16): the tuning is damaged, rebuild it with --autotune")
    return cfg
