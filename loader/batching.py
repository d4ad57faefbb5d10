"""Which requests to a package can run as one call, and how to merge them and split the result.

A package batches along a symbol that is dim 0 of every input and every output and appears nowhere else in
their shapes: then concatenating requests along dim 0 is the same computation as running them one by one (rows
do not see each other), and the outputs split back by each request's row count. Requests merge only when
everything except dim 0 agrees (dtypes and the other dims, hence every other symbol's value). This module is
the one place that decides it; the loader's Batcher, the HTTP server, the Triton backend and the Ray deployment
all use it. It is pure numpy: no threads, no queues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tcexport.formats import expr as ex

from .dtypes import dtype_name


@dataclass(frozen=True)
class BatchAxis:
    """The batch symbol of a package and its declared range (``max`` None: unbounded)."""

    symbol: str
    min: int
    max: int | None

    def limit(self, max_batch: int | None) -> int | None:
        """The most rows one merged call may carry: the symbol's upper bound, capped by ``max_batch``."""
        bounds = [b for b in (self.max, max_batch) if b is not None]
        return min(bounds) if bounds else None


def batch_axis(manifest) -> BatchAxis | None:
    """The package's batch axis, or None when its inputs and outputs share no dim-0 symbol used only there.

    ``manifest`` is a loaded model's ``manifest`` (anything with ``inputs``, ``outputs`` and ``symbols``).
    """
    specs = list(manifest.inputs) + list(manifest.outputs)
    if not manifest.inputs or any(not s.shape for s in specs):
        return None
    first = specs[0].shape[0]
    if not isinstance(first, str):
        return None
    for spec in specs:
        if spec.shape[0] != first:
            return None
        if any(first in ex.free_symbols(d) for d in spec.shape[1:]):
            return None
    for sym in manifest.symbols:
        if sym.name == first:
            return BatchAxis(first, sym.min, sym.max)
    return None


def merge_key(arrays: Sequence[np.ndarray]) -> tuple:
    """Requests with equal keys can be concatenated: every input's dtype and its dims after the first."""
    return tuple((dtype_name(a.dtype), a.shape[1:]) for a in arrays)


def rows(arrays: Sequence[np.ndarray]) -> int:
    """A request's size along the batch axis (its first input's dim 0; guards check the others agree)."""
    return int(arrays[0].shape[0])


def concat(requests: Sequence[Sequence[np.ndarray]]) -> list[np.ndarray]:
    """One input list from several requests with the same ``merge_key``, rows in request order.

    The concatenation keeps the dtype object itself, so a bfloat16 tag survives it.
    """
    if len(requests) == 1:
        return list(requests[0])
    merged = []
    for i in range(len(requests[0])):
        parts = [r[i] for r in requests]
        out = np.concatenate(parts, axis=0)
        if out.dtype is not parts[0].dtype:
            out = out.view(parts[0].dtype)
        merged.append(out)
    return merged


def split(outputs: Sequence[np.ndarray], sizes: Sequence[int]) -> list[list[np.ndarray]]:
    """Each request's outputs back from a merged call's, by the requests' row counts (copies, not views, so a
    reply never keeps the whole batch alive)."""
    if len(sizes) == 1:
        return [list(outputs)]
    edges = np.cumsum([0, *sizes])
    return [[o[edges[i]:edges[i + 1]].copy() for o in outputs] for i in range(len(sizes))]
