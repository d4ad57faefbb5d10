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
from tcexport.exporter.errors import BuildError
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import upper_bound
from tcexport.exporter.ir.kernels import Kernel
from tcexport.exporter.schedule.small_m import SMALL_M


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
    fma: bool = False  # a GEMV: products summed in registers, no tl.dot, so BM may be 1 (gemm.tile_head)


GEMV_ROWS = 4
"""At most this many rows (a decode step at batch 1 to 4), a GEMM is a GEMV: each weight tile is multiplied by the
rows in registers (GemmConfig.fma), since tl.dot would pad the rows to 16 and the weight's bytes are the cost. The
product of a [rows, BK] by a [BK, BN] tile is held whole in registers before its sum, so the tile shrinks as the
rows grow (rows x BN x BK = 8192: 64 registers a thread at 4 warps); more rows take tl.dot. Only with
CudaOptions.gemv: on the H200 a batch-1 decode step was slower with it (GPT-2 0.880 against 0.689 ms, Llama ~1B
2.551 against 1.797 ms; bench/results/h200-decode-*-b1.md, `bench.decode --gemv`): tl.dot's 16-row tiles waste
tensor-core work that a memory-bound step has to spare, while this form's register sum costs issue slots."""
GEMV_PRODUCT = 8192
GEMV_BK, GEMV_WARPS, GEMV_STAGES = 128, 4, 3

TUNABLE = ("gemm", "attention")  # the kernel kinds whose tiles --autotune chooses
ALIGN = 16  # elements: a symbol a kernel's aligned variant knows to be a multiple of (launches.unaligned)


def gemm_config(dtype: str, m_max: int | None, n_max: int | None, k_max: int | None, small_m: bool = False,
                tma: bool = False, gemv: bool = False) -> GemmConfig:
    """Heuristics, from sweeps of this template on an H200 over GPT-2 small's GEMMs (M 128, 1024 and 4096; N 768
    to 50257; K 768, 3072), in CUDA graphs and in the model. 16-bit floats, with many rows: 64x128x64 tiles with
    a 5-stage pipeline (4 warps) up to 1024 columns (the down-projection at 1024 rows: 13.0-14.3 us in the model
    against 14.9-15.5 for 64x64x128 with 3 stages; 64x128x64 with 3 stages took 20.5), the same with 3 up to 16K
    columns, 128x256x64 with 8 warps for a vocabulary-sized N; with at most SMALL_M rows (``small_m``), 64x64x128
    (3 stages) up to 16K columns, which gives such a GEMM twice the programs (GPT-2's MLP up-projection at 128
    rows: 5.6 us against 8.7), and 128x128x64 for a vocabulary. float32 (full-precision dots) takes 64x64x32,
    float64 32x32x16. A small M, N or K shrinks its tile side (tl.dot needs at least 16); BK never exceeds what
    K needs.

    A vocabulary-sized N with many rows, when ``tma`` (both operands can be read through TMA descriptors,
    gemm.tma_views), is persistent: one program per SM walks its tiles and Triton pipelines the next
    tile's loads under this one's epilogue. GPT-2's LM head at 1024 rows, 128x256x64 tiles: in the model 134 us
    with 4 stages, against 175 us one program per tile, and a call 785 against 827 us (python -m
    bench.probes.lm_head); alone 144.5 against 167.5 us, cuBLAS 119 us on a padded N. Without TMA loads, or
    without flattening the tile loop, it was no faster alone (python -m bench.probes.persistent_gemm)."""
    if gemv and small_m and m_max is not None and m_max <= GEMV_ROWS and dtype in (*HALF, "float32"):
        return gemv_config(m_max, n_max, k_max)
    if dtype in HALF:
        if n_max is not None and n_max <= 1024 and not small_m:
            bm, bn, bk, warps, stages = 64, 128, 64, 4, 5
        elif n_max is not None and (n_max <= 1024 or small_m and n_max <= 16384):
            bm, bn, bk, warps, stages = 64, 64, 128, 4, 3
        elif n_max is not None and n_max <= 16384:
            bm, bn, bk, warps, stages = 64, 128, 64, 4, 3
        else:
            bm, bn, bk, warps, stages = (128, 128, 64, 8, 3) if small_m else (128, 256, 64, 8, 3)
            if tma and not small_m:
                return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, 4, persistent=True), m_max, n_max, k_max)
    elif dtype == "float32":
        bm, bn, bk, warps, stages = 64, 64, 32, 4, 3
    else:
        bm, bn, bk, warps, stages = 32, 32, 16, 4, 2
    return fit_gemm(GemmConfig(bm, bn, bk, 8, warps, stages), m_max, n_max, k_max)


def gemv_config(m_max: int, n_max: int | None, k_max: int | None) -> GemmConfig:
    rows = next_pow2(min(m_max, GEMV_ROWS))
    bn = max(16, GEMV_PRODUCT // (rows * GEMV_BK))
    return fit_gemm(GemmConfig(rows, bn, GEMV_BK, 1, GEMV_WARPS, GEMV_STAGES, fma=True), rows, n_max, k_max)


def fit_gemm(cfg: GemmConfig, m_max: int | None, n_max: int | None, k_max: int | None) -> GemmConfig:
    """``cfg`` with each tile side cut to what its dim needs (at least 16, tl.dot's minimum)."""
    least = 1 if cfg.fma else 16
    bm, bn, bk = (side if bound is None else min(side, max(least, next_pow2(bound)))
                  for side, bound in ((cfg.bm, m_max), (cfg.bn, n_max), (cfg.bk, k_max)))
    return GemmConfig(bm, bn, bk, cfg.group_m, cfg.num_warps, cfg.num_stages, cfg.persistent, cfg.fma)


def gemm_variants(dtype: str, m, m_max: int | None, n_max: int | None, k_max: int | None,
                  tma: bool = False, m_min: int = 1, gemv: bool = False) -> list:
    """[(suffix, condition, config)]: one config, or, when M is symbolic, one per band of rows it may take: more
    than SMALL_M (large tiles), up to SMALL_M (small tiles), up to GEMV_ROWS with ``gemv`` (CudaOptions.gemv: a
    decode step through the same graph as a prefill). The condition is an integer expression, 1 where its variant
    runs and 0 elsewhere (it multiplies the launch grid; a launch whose grid has a 0 is skipped, SPEC §6a), so the choice is made per
    shape signature without any new manifest field."""
    m = sympy.sympify(m)
    if m.is_Integer:
        return [("", sympy.Integer(1), gemm_config(dtype, m_max, n_max, k_max, small_m=(m_max or 0) <= SMALL_M,
                                                   tma=tma, gemv=gemv))]
    with_gemv = gemv and m_min <= GEMV_ROWS and dtype in (*HALF, "float32")
    bands = []  # (suffix, rows above, rows up to, config); the lowest band starts at 0
    if m_max is None or m_max > SMALL_M:
        bands.append(("", SMALL_M if m_min <= SMALL_M else 0, None,
                      gemm_config(dtype, m_max, n_max, k_max, tma=tma)))
    if m_min <= SMALL_M:
        bands.append((f"_m{SMALL_M}", GEMV_ROWS if with_gemv else 0, SMALL_M,
                      gemm_config(dtype, min(m_max or SMALL_M, SMALL_M), n_max, k_max, small_m=True, gemv=gemv)))
    if with_gemv:
        bands.append((f"_m{GEMV_ROWS}", 0, GEMV_ROWS, gemv_config(min(m_max or GEMV_ROWS, GEMV_ROWS), n_max, k_max)))
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
    least_m = 1 if getattr(cfg, "fma", False) else 16  # a GEMV's rows never reach tl.dot
    if cfg.bm < least_m or cfg.bn < 16 or kind == "gemm" and cfg.bk < 16:
        raise BuildError(f"tuning for kernel {name}: tiles {cfg} have a side below 16, which tl.dot cannot take")
    sides = [cfg.bm, cfg.bn, cfg.bk] if kind == "gemm" else [cfg.bm, cfg.bn]
    if any(s & (s - 1) for s in sides) or cfg.num_warps not in (1, 2, 4, 8, 16):
        raise BuildError(f"tuning for kernel {name}: tiles {sides} and {cfg.num_warps} warps; Triton needs powers "
                         "of two for both (warps at most 16): the tuning is damaged, rebuild it with --autotune")
    return cfg
