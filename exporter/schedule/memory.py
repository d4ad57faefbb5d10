"""Memory plan: every intermediate buffer gets a byte offset in one workspace, reusing dead buffers' slots.

Sizes are symbolic, so a slot is reused only when the new buffer provably fits (equal size, or a difference
that is non-negative for every positive value of the symbols). Offsets and the total are expressions of the
shape symbols, evaluated by the loader per call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy
from torch.utils._sympy.functions import FloorDiv

from tcexport.formats.dtypes import DTYPES
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel

ALIGN = 64
ITEMSIZE = DTYPES  # bytes per element, from the format's one dtype table


@dataclass
class MemoryPlan:
    offsets: dict = field(default_factory=dict)   # buffer -> byte offset (expr)
    slots: list = field(default_factory=list)     # [(size expr, [buffers])]
    workspace_bytes: sympy.Expr = sympy.Integer(0)
    naive_bytes: sympy.Expr = sympy.Integer(0)    # what one buffer per intermediate would take

    def __str__(self):
        lines = [f"workspace: {self.workspace_bytes} bytes (without reuse: {self.naive_bytes})"]
        for k, (size, names) in enumerate(self.slots):
            lines.append(f"  slot {k}: {size} bytes <- {', '.join(names)}")
        return "\n".join(lines)


def aligned_bytes(buf: ir.Buffer) -> sympy.Expr:
    raw = sympy.expand(buf.numel() * ITEMSIZE[buf.dtype])
    return sympy.expand(ALIGN * FloorDiv(raw + ALIGN - 1, ALIGN))


def _fits(size: sympy.Expr, slot: sympy.Expr) -> bool:
    diff = sympy.expand(slot - size)
    return diff == 0 or bool(diff.is_nonnegative)


def plan_memory(prog: ir.Program, kernels: list[Kernel]) -> MemoryPlan:
    first, last = {}, {}
    for ki, k in enumerate(kernels):
        for s in k.stages:
            for b in s.node.inputs():
                last[b] = ki
        for b in k.writes():
            first.setdefault(b, ki)
            last.setdefault(b, ki)
    temps = [b for b in first if prog.buffers[b].kind == "temp"]
    plan = MemoryPlan()
    busy_until: list[int] = []
    for b in sorted(temps, key=lambda b: (first[b], b)):
        size = aligned_bytes(prog.buffers[b])
        plan.naive_bytes = sympy.expand(plan.naive_bytes + size)
        for k, (slot_size, names) in enumerate(plan.slots):
            if busy_until[k] < first[b] and _fits(size, slot_size):
                names.append(b)
                busy_until[k] = last[b]
                break
        else:
            plan.slots.append((size, [b]))
            busy_until.append(last[b])
    offset = sympy.Integer(0)
    for size, names in plan.slots:
        for b in names:
            plan.offsets[b] = offset
        offset = sympy.expand(offset + size)
    plan.workspace_bytes = offset
    return plan
