"""The record one launch's rendering fills: a fresh ``LaunchScope`` per launch, passed to every renderer and
returned with the body, so nothing about one launch lives in an object that outlives it.

What a launch is to be (its kernel, tiles, index width, error code) is decided before rendering, in
cuda/launches.py's ``LaunchPlan``; what rendering finds out is recorded here as data: the buffers in the order
the body first names them (its parameter order, so kernels with one code take their buffers in one order),
whether it range-checks an index (it then takes the error word), and the addresses it forms (from which the
aligned variant is decided).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.bounds import symbol_bounds, upper_bound


@dataclass
class LaunchScope:
    prog: ir.Program
    bits: int                 # width of index arithmetic (ir/bounds.py index_bits)
    error_code: int           # what a failed range check stores in the error word: the launch's position + 1
    bounds: dict = field(default_factory=dict)
    names: itertools.count = field(default_factory=itertools.count)  # temporaries t0, t1, ...
    used: dict = field(default_factory=dict)       # buffer -> None, in the order the body first names them
    checked: bool = False                          # a load range-checks an index read from data
    addresses: list = field(default_factory=list)  # (element offset, its tile's column variable) of tile accesses

    def __post_init__(self):
        self.bounds = self.bounds or symbol_bounds(self.prog)

    def use(self, buffer: str) -> str:
        """Record that the body names ``buffer`` here (its first mention fixes its parameter position)."""
        self.used.setdefault(buffer, None)
        return buffer

    def ub(self, e) -> int | None:
        return upper_bound(e, self.bounds)
