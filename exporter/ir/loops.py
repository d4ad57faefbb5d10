"""The loop IR: buffers with symbolic shapes, and nodes whose bodies are value expressions over index variables.

One IR serves every pass after capture. Lowering produces one node per op; fusion (fuse.py) rewrites bodies
(inlining) and groups nodes into kernels; codegen only reads it. Sizes and indices are sympy expressions over
the shape symbols (positive integers) and the index variables ``i0, i1, ...`` (a node's output position) and
``r0, r1, ...`` (its reduction position). Views are index arithmetic: a Load carries the full buffer index.
Data-dependent indexing (embedding, gather, index) is a LoadIndirect: its index may also use ``x0, x1, ...``,
each bound to an integer value computed in the same body; kernels bounds-check those dims at run time.

``str(program)`` prints it readably; ``program.verify()`` checks its invariants and runs after each pass in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterator

import sympy
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
# 16-bit floats are storage formats: values are loaded into float32, computed in float32 and rounded (to nearest
# even) where they are stored or explicitly cast, as PyTorch's CPU kernels do; BLAS has no GEMM for them
HALF_DTYPES = ("float16", "bfloat16")


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic on ``dtype`` values runs in: float32 for the 16-bit floats, else ``dtype`` itself."""
    return "float32" if dtype in HALF_DTYPES else dtype


@lru_cache(maxsize=None)
def ivar(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"i{k}", integer=True, nonnegative=True)


@lru_cache(maxsize=None)
def rvar(k: int) -> sympy.Symbol:
    return sympy.Symbol(f"r{k}", integer=True, nonnegative=True)


def shape_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, positive=True)


def product(xs) -> sympy.Expr:
    out = sympy.Integer(1)
    for x in xs:
        out = out * x
    return out


def simplify_index(e) -> sympy.Expr:
    """Undo the division a reshape introduces: k*c*FloorDiv(x, d*k) + c*ModularIndexing(x, d, k) is
    c*FloorDiv(x, d) (and FloorDiv(x, 1) is x), applied until nothing changes."""
    e = sympy.expand(sympy.sympify(e))
    changed = True
    while changed and e.has(ModularIndexing):
        changed = False
        terms = list(sympy.Add.make_args(e))
        for t in terms:
            mods = [f for f in sympy.Mul.make_args(t) if isinstance(f, ModularIndexing)]
            if len(mods) != 1:
                continue
            x, d, k = mods[0].args
            c = t / mods[0]
            partner = sympy.expand(c * k * FloorDiv(x, d * k))
            match = next((u for u in terms if u is not t and sympy.expand(u - partner) == 0), None)
            if match is not None:
                e = sympy.expand(e - t - match + c * FloorDiv(x, d))
                changed = True
                break
    return e


def same_size(a, b) -> bool:
    return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0


def squeeze(ranges) -> tuple:
    """Ranges without their size-1 entries: what fusion compares iteration spaces by."""
    return tuple(r for r in ranges if r != 1)


# ---------------------------------------------------------------------------------------------------------
# value expressions (node bodies)


@dataclass(frozen=True)
class Value:
    dtype: str


@dataclass(frozen=True)
class Load(Value):
    buffer: str
    index: tuple  # one sympy expression per buffer dim

    def __str__(self):
        return f"{self.buffer}[{', '.join(map(str, self.index))}]"


@lru_cache(maxsize=None)
def xvar(k: int) -> sympy.Symbol:
    """The k-th value-bound index symbol of a LoadIndirect."""
    return sympy.Symbol(f"x{k}", integer=True)


@dataclass(frozen=True)
class LoadIndirect(Value):
    """``buffer[index]`` where ``index`` may use ``x0, x1, ...``: symbol ``xk`` is the int64 value of
    ``sources[k]`` (a value over the same index variables). Every dim whose index uses an ``x`` is checked
    against the buffer's size when the kernel runs; an out-of-range value is an error, never a wild read."""

    buffer: str
    index: tuple
    sources: tuple
    origin: str | None = field(default=None, compare=False)  # the user's source line, for the error message

    def __str__(self):
        binds = ", ".join(f"{xvar(k)}={v}" for k, v in enumerate(self.sources))
        return f"{self.buffer}[{', '.join(map(str, self.index))} | {binds}]"


@dataclass(frozen=True)
class Const(Value):
    value: object  # python float / int / bool; float('inf') allowed

    def __str__(self):
        return repr(self.value)


@dataclass(frozen=True)
class IndexValue(Value):
    """An integer index expression used as a value (arange, masks built from positions)."""

    expr: sympy.Expr

    def __str__(self):
        return f"index({self.expr})"


@dataclass(frozen=True)
class Op(Value):
    op: str
    args: tuple

    def __str__(self):
        if self.op == "cast":
            return f"{self.dtype}({self.args[0]})"
        return f"{self.op}({', '.join(map(str, self.args))})"


def walk(v: Value) -> Iterator[Value]:
    yield v
    if isinstance(v, Op):
        for a in v.args:
            yield from walk(a)
    elif isinstance(v, LoadIndirect):
        for a in v.sources:
            yield from walk(a)


def loads(v: Value) -> list[Load]:
    """The direct loads of ``v`` (including those inside an indirect load's sources)."""
    return [x for x in walk(v) if isinstance(x, Load)]


def indirect_loads(v: Value) -> list[LoadIndirect]:
    return [x for x in walk(v) if isinstance(x, LoadIndirect)]


def reads(v: Value) -> set[str]:
    """Every buffer ``v`` reads, directly or indirectly."""
    return {x.buffer for x in walk(v) if isinstance(x, (Load, LoadIndirect))}


def map_values(v: Value, fn) -> Value:
    """Rebuild ``v`` bottom-up, replacing each node by ``fn(node)`` (which may return it unchanged)."""
    if isinstance(v, Op):
        v = replace(v, args=tuple(map_values(a, fn) for a in v.args))
    elif isinstance(v, LoadIndirect):
        v = replace(v, sources=tuple(map_values(a, fn) for a in v.sources))
    return fn(v)


def rename_buffer(v: Value, old: str, new: str, reindex=None) -> Value:
    """``v`` reading ``new`` wherever it read ``old``; ``reindex(index)`` maps a direct load's index."""
    def fn(x):
        if isinstance(x, Load) and x.buffer == old:
            return Load(x.dtype, new, reindex(x.index) if reindex else x.index)
        if isinstance(x, LoadIndirect) and x.buffer == old:
            assert reindex is None, "an indirectly read buffer cannot change shape"
            return replace(x, buffer=new)
        return x
    return map_values(v, fn)


def subs_index(v: Value, mapping: dict) -> Value:
    """Substitute index variables in every Load / IndexValue of ``v`` (simultaneously)."""
    if not mapping:
        return v

    def fn(x):
        if isinstance(x, (Load, LoadIndirect)):
            return replace(x, index=tuple(sympy.sympify(e).xreplace(mapping) for e in x.index))
        if isinstance(x, IndexValue):
            return replace(x, expr=sympy.sympify(x.expr).xreplace(mapping))
        return x

    return map_values(v, fn)


# ---------------------------------------------------------------------------------------------------------
# buffers and nodes


@dataclass
class Buffer:
    name: str
    dtype: str
    shape: tuple  # sympy expressions; storage is contiguous row-major
    kind: str     # "input" | "weight" | "output" | "temp"

    def strides(self) -> tuple:
        out, acc = [], sympy.Integer(1)
        for s in reversed(self.shape):
            out.append(acc)
            acc = acc * s
        return tuple(reversed(out))

    def flat_index(self, index) -> sympy.Expr:
        return simplify_index(sum((sympy.sympify(i) * s for i, s in zip(index, self.strides())), sympy.Integer(0)))

    def numel(self) -> sympy.Expr:
        return product(self.shape)

    def __str__(self):
        return f"{self.name}: {self.kind} {self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass
class GemmOperand:
    """A 2-D (or batched 3-D) view of a realized buffer, as a GEMM reads it. Strided views (what a BLAS call
    takes) have ``offset`` and the three strides; any other view (heads split out of a fused projection, a
    reshape across a transpose) has ``index`` instead: the buffer index of element (i0, i1, i2) = (batch, row,
    col) (i0 is 0 for an unbatched GEMM). Triton reads such a view in place; the C++ backend gathers it.
    ``rows`` (the CPU's only: schedule/window_gemm.py) places row k otherwise than at k * row_stride: as
    ``(sizes, offset)``, k split row-major over ``sizes`` into (i0, i1, ...) and its row at ``offset`` of them (a
    convolution's channel and taps over its zero-padded input)."""

    buffer: str
    offset: sympy.Expr
    batch_stride: sympy.Expr
    row_stride: sympy.Expr
    col_stride: sympy.Expr
    index: tuple | None = None
    rows: tuple | None = None

    def __str__(self):
        if self.index is not None:
            return f"{self.buffer}[{', '.join(map(str, self.index))}]"
        if self.rows is not None:
            sizes, offset = self.rows
            return (f"{self.buffer}+{self.offset} strides(b={self.batch_stride}, "
                    f"r=[{offset} over {' x '.join(map(str, sizes))}], c={self.col_stride})")
        return (f"{self.buffer}+{self.offset} strides(b={self.batch_stride}, "
                f"r={self.row_stride}, c={self.col_stride})")


@dataclass
class Gemm:
    """out[b, m, n] = sum_k a[b, m, k] * b[b, k, n]; the output is always contiguous. Products accumulate in
    ``acc_dtype`` (float32, or float64), whatever the operands' dtype (16-bit floats are read as they are); in
    an epilogue, Load(out, i...) is the accumulated value in ``acc_dtype`` even when ``out`` is stored in
    another dtype (a rounding cast absorbed into the epilogue)."""

    a: GemmOperand
    b: GemmOperand
    batch: sympy.Expr
    m: sympy.Expr
    n: sympy.Expr
    k: sympy.Expr
    acc_dtype: str = "float32"


@dataclass
class Node:
    """Computes buffer ``out``. Pointwise: out[i...] = body. Reduction: out[i...] = reduce_op over r... of body.

    ``ranges`` always equals ``out.shape`` (the store index is the identity). A gemm node has no body until
    fusion gives it an epilogue: a pointwise body in which Load(out, i...) is the GEMM's result.
    """

    name: str
    kind: str  # "pointwise" | "reduction" | "gemm"
    out: Buffer
    body: Value | None = None
    reduce_op: str | None = None
    reduce_ranges: tuple = ()
    gemm: Gemm | None = None
    source: str | None = None  # the user's source line this node came from

    @property
    def ranges(self) -> tuple:
        return self.out.shape

    def inputs(self) -> set[str]:
        names = reads(self.body) if self.body is not None else set()
        if self.gemm is not None:
            names |= {self.gemm.a.buffer, self.gemm.b.buffer}
        names.discard(self.out.name) if self.kind == "gemm" else None
        return names

    def __str__(self):
        idx = ", ".join(str(ivar(k)) for k in range(len(self.ranges)))
        head = f"{self.out.name}[{idx}]"
        if self.kind == "pointwise":
            return f"{self.name}: {head} = {self.body}"
        if self.kind == "reduction":
            r = ", ".join(f"{rvar(k)}<{s}" for k, s in enumerate(self.reduce_ranges))
            return f"{self.name}: {head} = {self.reduce_op}({r}: {self.body})"
        g = self.gemm
        text = (f"{self.name}: {head} = gemm(batch={g.batch}, m={g.m}, n={g.n}, k={g.k}; "
                f"A={g.a}; B={g.b})")
        return text + (f" then {self.body}" if self.body is not None else "")


@dataclass
class SymbolInfo:
    name: str
    min: int
    max: int | None


@dataclass
class Program:
    """A whole graph in loop IR. ``inputs``/``weights``/``outputs`` are buffer names in ABI order."""

    buffers: dict
    nodes: list
    inputs: list
    weights: list
    outputs: list
    symbols: list = field(default_factory=list)
    guards: list = field(default_factory=list)  # (sympy boolean, message)

    def producers(self) -> dict[str, Node]:
        return {n.out.name: n for n in self.nodes}

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for b in n.inputs():
                out.setdefault(b, []).append(n)
        return out

    def __str__(self):
        lines = ["symbols: " + ", ".join(f"{s.name} in [{s.min}, {s.max}]" for s in self.symbols)]
        lines += ["buffers:"] + [f"  {b}" for b in self.buffers.values()]
        lines += ["nodes:"] + [f"  {n}" for n in self.nodes]
        lines.append("outputs: " + ", ".join(self.outputs))
        return "\n".join(lines)

    def verify(self) -> None:
        """Invariants every pass keeps. Violations are compiler bugs, hence AssertionError."""
        defined = set(self.inputs) | set(self.weights)
        for name in defined:
            assert name in self.buffers, f"{name} is not a buffer"
        for n in self.nodes:
            assert n.out.name in self.buffers and self.buffers[n.out.name] is n.out, f"{n.name}: unknown out"
            assert n.out.name not in defined, f"{n.name}: {n.out.name} written twice"
            for b in n.inputs():
                assert b in defined, f"{n.name} reads {b} before it is written"
            allowed = {ivar(k) for k in range(len(n.ranges))} | {rvar(k) for k in range(len(n.reduce_ranges))}
            if n.body is not None:
                for ld in loads(n.body) + indirect_loads(n.body):
                    buf = self.buffers[ld.buffer]
                    assert len(ld.index) == len(buf.shape), f"{n.name}: rank of {ld}"
                    bound = {xvar(k) for k in range(len(ld.sources))} if isinstance(ld, LoadIndirect) else set()
                    for e in ld.index:
                        extra = {s for s in sympy.sympify(e).free_symbols
                                 if s.name[0] in "irx" and s.name[1:].isdigit()}
                        assert extra <= allowed | bound, f"{n.name}: {ld} uses {extra - allowed - bound}"
            assert n.kind in ("pointwise", "reduction", "gemm"), n.kind
            assert (n.kind == "reduction") == (n.reduce_op is not None), f"{n.name}: reduce_op"
            defined.add(n.out.name)
        for o in self.outputs:
            assert o in defined, f"output {o} never written"


def kept_elsewhere(node: Node, buffers: dict) -> tuple[Value, Value, Load] | None:
    """(c, a, old) when a pointwise output is ``where(c, a, old)`` and ``old`` is the element of an input of the
    output's dtype and shape at the output's own position (the only place the input is read): the output changes
    only where c holds. A state updated in place (SPEC §2b: a KV cache's cache write) is such a node, and the loader
    may pass its input and output as one array; a renderer then stores only where c holds, and copies ``old``
    elsewhere only when the two arrays differ (a check of the pointers when the kernel runs)."""
    body = node.body
    if node.kind != "pointwise" or node.out.kind != "output" or not (isinstance(body, Op) and body.op == "where"):
        return None
    c, a, old = body.args
    src = buffers.get(old.buffer) if isinstance(old, Load) else None
    if src is None or src.kind != "input" or src.dtype != node.out.dtype or old.dtype != src.dtype or \
            len(src.shape) != len(node.out.shape) or \
            not all(same_size(x, y) for x, y in zip(src.shape, node.out.shape)):
        return None
    own = tuple(ivar(d) for d in range(len(node.ranges)))
    if not same_size(src.flat_index(old.index), node.out.flat_index(own)):
        return None
    if any(isinstance(x, (Load, LoadIndirect)) and x.buffer == src.name and x != old for v in (c, a) for x in walk(v)):
        return None
    return c, a, old
