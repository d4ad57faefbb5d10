"""The CPU's kernel list: the shared list, with attention fused into one kernel (cpu/attention.py) for the shapes
where that pays. The three kernels of an attention (scores GEMM, softmax, PV GEMM) use the tuned GEMM, which beats
the fused kernel's loops while the scores stay in cache; the fused kernel wins where the scores matrix is large
(softmax's three sweeps stream it through memory: a 1024-token prefill's [4, 1024, 1088] scores per layer took
38% of the call) or where masked blocks of keys can be skipped (a decode step or a short prompt over a static KV
cache reads only the filled part). Both paths are kept and a 0/1 factor of the shapes picks one per call
(``Kernel.when``, as the GPU's split-K does).
"""

from __future__ import annotations

import dataclasses

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, verify_kernels
from tcexport.exporter.schedule.attention import attention_triples, skips_masked_keys

LARGE_SCORES = 65536   # rows x keys of one head from which the scores stop fitting a core's L2 (256 KB)
FEW_ROWS = 16          # query rows up to which a static cache of at least CACHE_KEYS keys is read in blocks
CACHE_KEYS = 256


def _at_least(e, bound: int):
    """1 where the integer ``e`` >= bound, else 0."""
    return sympy.Min(1, sympy.Max(0, sympy.sympify(e) - bound + 1))


def fused_when(prog: ir.Program, k: Kernel, supported) -> sympy.Expr:
    """The 0/1 factor of the shapes for which the fused attention kernel ``k`` runs (0: never)."""
    g1 = k.stages[0].node.gemm
    if not supported(prog, k):
        return sympy.Integer(0)
    large = _at_least(g1.m * g1.n, LARGE_SCORES)
    keys = sympy.sympify(g1.n)
    if keys.is_Integer and int(keys) >= CACHE_KEYS and skips_masked_keys(k):
        large = sympy.Max(large, _at_least(FEW_ROWS + 1 - g1.m, 1))
    return large  # a number where the shapes are static


def schedule_cpu(prog: ir.Program, kernels: list[Kernel], supported) -> list[Kernel]:
    """The CPU's kernel list (a new list; ``kernels`` stays the shared one the GPU schedules). ``supported``:
    whether the C++ renderer takes an attention kernel (cpu/attention.supported)."""
    out = list(kernels)
    for a, b, c, merged in attention_triples(prog, kernels):
        when = fused_when(prog, merged, supported)
        if when == 0:
            continue
        at = out.index(c)
        if when == 1:
            out[at] = merged
            out.remove(a)
            out.remove(b)
            continue
        merged.when = when
        for old in (a, b, c):
            out[out.index(old)] = dataclasses.replace(old, when=1 - when)
        out.insert(at + 1, merged)
    verify_kernels(out)
    return out
