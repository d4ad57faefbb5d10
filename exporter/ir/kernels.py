"""The kernel list: fused loop-IR nodes grouped into kernels, the unit both code generators render and the memory
plan orders. Fusion (schedule/fuse.py) builds it; the GPU schedule (schedule/attention.py, schedule/split_k.py)
rewrites its own copy; the C++ and Triton renderers only read it.

A kernel is ``loops`` (an outer nest over rows and stages at three levels: ``reduce`` accumulates over the inner
nest, ``row`` runs once per outer point, ``inner`` sweeps the inner nest storing), ``gemm`` (one template stage
whose body is its epilogue) or ``attention`` (the fused scores GEMM, softmax and PV GEMM). How a loop kernel's
stages share sweeps of the inner nest (``Kernel.loops``) is decided here, once, for both renderers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from tcexport.exporter.ir import loops as ir

KINDS = ("loops", "gemm", "attention")
LEVELS = {"loops": ("reduce", "row", "inner"), "gemm": ("gemm",), "attention": ("gemm", "reduce", "row", "inner")}
# arg reduction -> the reduction whose initial value its running value takes
ARG_REDUCTIONS = {"argmax": "max", "argmin": "min"}


def ovar(k):
    """A kernel's outer loop variable (rows)."""
    return sympy.Symbol(f"o{k}", integer=True, nonnegative=True)


def qvar(k):
    """A kernel's inner loop variable (the reduced or swept row)."""
    return sympy.Symbol(f"q{k}", integer=True, nonnegative=True)


@dataclass
class Stage:
    node: ir.Node
    level: str  # "reduce": inner loop accumulating; "row": once per outer point; "inner": inner loop storing
    var_map: dict  # node index variable -> kernel index expression


@dataclass
class Loop:
    """A run of consecutive stages that share one sweep of the inner nest (or one scalar block for "row")."""

    level: str
    stages: list


@dataclass(frozen=True)
class KvSplit:
    """An attention kernel that covers one slice of the keys per program (schedule/split_kv.py): it stores its
    slice's unnormalised output and its running max and sum, which a combining kernel after it merges."""

    slices: int
    acc: str     # float32 [slices, batch, rows, dv]: the slice's probabilities (unnormalised) times the values
    stats: str   # float32 [slices, batch, rows, 2]: the slice's running max and sum of the scores' exponentials
    group: int = 1  # batch entries (query heads) sharing one K/V view whose rows a program takes together


@dataclass
class Kernel:
    name: str
    kind: str  # "loops" | "gemm" | "attention"
    outer: tuple
    inner: tuple
    stages: list = field(default_factory=list)
    local: set = field(default_factory=set)  # buffers held in registers, never stored
    when: object = None    # GPU only: a 0/1 expression of the symbols; the kernel runs where it is 1 (split_k.py)
    rows: tuple | None = None  # GPU only: (above, up to) the band of rows a GEMM runs for (split_k.py); None: all
    kv_split: KvSplit | None = None  # GPU only: an attention kernel over one slice of the keys (split_kv.py)

    @property
    def nodes(self):
        return [s.node for s in self.stages]

    def writes(self) -> list[str]:
        if self.kv_split is not None:  # the slices' partial results, not the attention's output
            return [self.kv_split.acc, self.kv_split.stats]
        return [s.node.out.name for s in self.stages if s.node.out.name not in self.local]

    def loops(self) -> list[Loop]:
        """The stages in runs that share one sweep: consecutive ``reduce`` stages (unless one reads another's
        result) and consecutive ``inner`` stages share theirs; every ``row`` stage is a run of its own."""
        runs: list[Loop] = []
        for s in self.stages:
            prev = runs[-1] if runs else None
            same = prev is not None and prev.level == s.level and s.level in ("reduce", "inner")
            if same and s.level == "reduce" and s.node.inputs() & {p.node.out.name for p in prev.stages}:
                same = False
            if same:
                prev.stages.append(s)
            else:
                runs.append(Loop(s.level, [s]))
        return runs

    def verify(self) -> None:
        """Invariants every schedule pass keeps. Violations are compiler bugs, hence AssertionError."""
        assert self.kind in KINDS, f"{self.name}: kind {self.kind!r}"
        assert self.stages, f"{self.name}: no stages"
        for s in self.stages:
            assert s.level in LEVELS[self.kind], f"{self.name}: a {s.level} stage in a {self.kind} kernel"
        if self.kind == "gemm":
            assert len(self.stages) == 1 and self.stages[0].node.kind == "gemm", f"{self.name}: one GEMM stage"
        if self.kind == "attention":
            assert self.stages[0].node.kind == "gemm" and self.stages[-1].node.kind == "gemm", \
                f"{self.name}: attention starts and ends with its GEMMs"
        outs = {s.node.out.name for s in self.stages}
        assert self.local <= outs, f"{self.name}: registers {sorted(self.local - outs)} it does not compute"
        assert self.rows is None or self.kind == "gemm", f"{self.name}: a band of rows on a {self.kind} kernel"
        assert self.kv_split is None or self.kind == "attention", f"{self.name}: kv_split on a {self.kind} kernel"

    def __str__(self):
        head = f"{self.name} [{self.kind}] outer={list(self.outer)} inner={list(self.inner)}"
        if self.local:
            head += f" registers={sorted(self.local)}"
        if self.kv_split is not None:
            head += f" kv_split={self.kv_split.slices} -> {self.kv_split.acc}, {self.kv_split.stats}"
            head += f" group={self.kv_split.group}" if self.kv_split.group > 1 else ""
        if self.when is not None:
            head += f" when={self.when}"
        return "\n".join([head] + [f"    {s.level:6} {s.node}" for s in self.stages])


def flat_position(inner: tuple) -> sympy.Expr:
    """The row-major position of (q0, q1, ...) in the inner loop nest: an arg reduction's result."""
    pos = sympy.Integer(0)
    for d, ext in enumerate(inner):
        pos = pos * ext + qvar(d)
    return pos


def verify_kernels(kernels: list[Kernel]) -> None:
    """Every kernel's invariants, and names unique across the list (they name launches and cubins)."""
    for k in kernels:
        k.verify()
    names = [k.name for k in kernels]
    assert len(names) == len(set(names)), f"kernel names repeat: {sorted(n for n in names if names.count(n) > 1)}"
