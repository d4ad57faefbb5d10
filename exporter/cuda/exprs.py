"""Triton expressions: the loop IR's values and indices rendered as Triton statements, one temporary per
distinct subexpression, with the dtype rules of eager PyTorch (16-bit floats computed in float32 and rounded
where stored or cast; Python's floor division and modulo where signs can differ).

The type and op tables are data; ``TritonEmitter`` only looks them up. Every template (cuda/loops.py,
cuda/gemm.py, cuda/attention.py) renders its bodies and epilogues through it.
"""

from __future__ import annotations

import math
import re
import sympy

from tcexport.exporter.cuda.scope import LaunchScope
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.index_text import IndexText

TL_TYPE = {"float64": "tl.float64", "float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16",
           "int64": "tl.int64", "int32": "tl.int32", "int16": "tl.int16", "int8": "tl.int8", "uint8": "tl.uint8",
           "bool": "tl.int1"}
POINTER = {"float64": "*fp64", "float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "int64": "*i64",
           "int32": "*i32", "int16": "*i16", "int8": "*i8", "uint8": "*u8", "bool": "*i1"}
HALF = ("float16", "bfloat16")
FLOATS = ("float64", "float32") + HALF

# op -> template over rendered args a, b, c (already in the op's compute type)
OPS = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "neg": "(-{a})", "abs": "tl.abs({a})", "exp": "tl.exp({a})", "log": "tl.log({a})",
    "sqrt": "tl.sqrt_rn({a})", "rsqrt": "(1.0 / tl.sqrt_rn({a}))", "erf": "tl.math.erf({a})",
    "tanh": "libdevice.tanh({a})", "sin": "tl.sin({a})", "cos": "tl.cos({a})", "tan": "libdevice.tan({a})",
    "atan": "libdevice.atan({a})", "sigmoid": "(1.0 / (1.0 + tl.exp(-{a})))", "reciprocal": "(1.0 / {a})",
    "floor": "tl.floor({a})", "ceil": "tl.ceil({a})", "trunc": "libdevice.trunc({a})",
    "round": "libdevice.nearbyint({a})", "log1p": "libdevice.log1p({a})", "expm1": "libdevice.expm1({a})",
    "exp2": "tl.exp2({a})", "log2": "tl.log2({a})", "relu": "tl.where({a} < 0, 0, {a})",
    "isnan": "({a} != {a})", "logical_not": "({a} == 0)", "sign": "(({a} > 0).to({T}) - ({a} < 0).to({T}))",
    "maximum": "_max_nan({a}, {b})", "minimum": "_min_nan({a}, {b})", "pow": "libdevice.pow({a}, {b})",
    "fmod": "libdevice.fmod({a}, {b})", "atan2": "libdevice.atan2({a}, {b})",
    "logical_and": "(({a} != 0) & ({b} != 0))", "logical_or": "(({a} != 0) | ({b} != 0))",
    "logical_xor": "(({a} != 0) ^ ({b} != 0))", "bitand": "({a} & {b})", "bitor": "({a} | {b})", "bitnot": "(~{a})",
    "bitxor": "({a} ^ {b})", "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})",
    "le": "({a} <= {b})", "gt": "({a} > {b})", "ge": "({a} >= {b})",
}
INT_OPS = {"floordiv": "_floordiv({a}, {b})", "remainder": "_pymod({a}, {b})", "fmod": "({a} % {b})",
           "truncdiv": "({a} // {b})", "abs": "tl.where({a} < 0, -{a}, {a})", "maximum": "tl.maximum({a}, {b})",
           "minimum": "tl.minimum({a}, {b})", "relu": "tl.maximum({a}, 0)"}
# tl.sqrt_rn takes float32 only; float64's tl.sqrt is already sqrt.rn.f64 (float32's is sqrt.approx)
FLOAT64_OPS = {"sqrt": "tl.sqrt({a})", "rsqrt": "(1.0 / tl.sqrt({a}))"}
# GELU's tanh in GPT-2's MLP up-projection (H200, batch 8, 11.1-11.6 us without it): libdevice's cost 5.4-6.1 us,
# this form 1.9-2.1 us, tanh.approx.f32 0.9-1.0 us (but its 2**-11 relative error near -1 can put GELU(-3) about
# 20% off). This form's relative error near 0 is below bfloat16's rounding only: float16 and float32 keep
# libdevice.
BFLOAT16_OPS = {"tanh": "_tanh_exp({a})"}
FLOAT_OPS = {"floordiv": "tl.floor({a} / {b})", "remainder": "_fpymod({a}, {b})",
             "truncdiv": "libdevice.trunc({a} / {b})"}
BOOL_OPS = {"maximum": "({a} | {b})", "minimum": "({a} & {b})", "mul": "({a} & {b})", "add": "({a} | {b})"}
COMPARE = {"eq", "ne", "lt", "le", "gt", "ge"}
# an integer zero shaped like each mask: added to a fixed offset, it makes the pointer a block like the mask
BLOCK_ZERO = {"xmask": " + 0 * xindex", "xmask & rmask": " + 0 * (xindex + rindex)",
              "mask": " + 0 * mask.to(tl.int32)", "smask": " + 0 * smask.to(tl.int32)"}  # GEMM / attention tiles
LOGICAL = {"logical_and", "logical_or", "logical_xor", "logical_not", "isnan"}
PROMOTION = ("bool", "uint8", "int8", "int16", "int32", "int64", "bfloat16", "float16", "float32", "float64")

REDUCE_INIT = {"sum": "0", "prod": "1", "max": 'float("-inf")', "min": 'float("inf")'}
REDUCE_COMBINE = {"sum": "{acc} + {v}", "prod": "{acc} * {v}", "max": "_max_nan({acc}, {v})",
                  "min": "_min_nan({acc}, {v})"}
REDUCE_FINAL = {"sum": "tl.sum({acc}, 1, keep_dims=True)", "prod": "tl.reduce({acc}, 1, _mul, keep_dims=True)",
                "max": "tl.reduce({acc}, 1, _max_nan, keep_dims=True)",
                "min": "tl.reduce({acc}, 1, _min_nan, keep_dims=True)"}
INT_LIMITS = {"int64": (-2**63, 2**63 - 1), "int32": (-2**31, 2**31 - 1), "int16": (-2**15, 2**15 - 1),
              "int8": (-128, 127), "uint8": (0, 255), "bool": (0, 1)}


def compute_dtype(dtype: str) -> str:
    """The dtype arithmetic happens in: half types widen to float32, bool reductions to int32."""
    return "float32" if dtype in HALF else dtype


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


_TEMP = re.compile(r"t\d+")


class TritonIndex(IndexText):
    """Index text in Triton: Python's // and % where both sides are non-negative (they agree with C's there and
    compile to cheaper code), the floor helpers of the prelude elsewhere; loop variables keep their names."""

    def symbol(self, name: str) -> str:
        return name if name[0] in "ioqrxt" and name[1:].isdigit() else f"s_{name}"

    def floordiv(self, a: str, b: str, nonneg: bool) -> str:
        return f"({a} // {b})" if nonneg else f"_floordiv({a}, {b})"

    def mod(self, a: str, b: str, nonneg: bool) -> str:
        return f"({a} % {b})" if nonneg else f"_pymod({a}, {b})"

    def extreme(self, which: str, a: str, b: str) -> str:
        return f"tl.{which}imum({a}, {b})"


tindex = TritonIndex()


def tconst(value, dtype: str) -> str:
    if dtype == "bool":
        return "True" if value else "False"
    if dtype in FLOATS:
        v = float(value)
        text = 'float("nan")' if math.isnan(v) else (f'float("{"-" if v < 0 else ""}inf")' if math.isinf(v) else repr(v))
        return f"tl.full([1], {text}, tl.float64)" if dtype == "float64" else text
    v = int(value)
    if dtype == "int64" and not -2**31 <= v < 2**31:
        return f"tl.full([1], {v}, tl.int64)"
    return str(v)


def _literal(v: ir.Value) -> bool:
    """Whether ``v`` renders as a Python literal (a constant, or an index value that is a fixed integer)."""
    return isinstance(v, ir.Const) or isinstance(v, ir.IndexValue) and sympy.sympify(v.expr).is_Integer


def _cast_python(value, dtype: str):
    if dtype == "bool":
        return bool(value)
    if dtype in FLOATS:
        return float(value)
    return int(value) if math.isfinite(float(value)) else 0


class TritonEmitter:
    """Renders values into statements, one temporary per distinct subexpression. ``mask`` guards every load.
    What it learns about the launch (the buffers it reads, the addresses it forms, whether it range-checks an
    index) goes into the launch's scope (cuda/scope.py), never into the emitter's caller."""

    def __init__(self, sc: LaunchScope, registers: dict, indent: str, mask: str, axis_masks=(), col=None,
                 scalars=frozenset()):
        self.sc = sc
        self.col = col  # in a GEMM or attention tile: the index variable along its columns (its vector axis)
        self.scalars = scalars  # index variables with one value per program (a tile's batch dims, from bid)
        self.registers = registers  # buffer -> variable holding its value at this position
        self.indent = indent
        self.mask = mask            # what loads are masked by: the block's mask, narrowed inside where()
        self.block_mask = mask      # the block's own mask (its shape)
        self.axis_masks = axis_masks  # [(index variables, mask)]: a load indexed by those alone takes that mask
        self.lines: list[str] = []
        self.memo: dict = {}

    def temp(self, text: str) -> str:
        name = f"t{next(self.sc.names)}"
        self.lines.append(f"{self.indent}{name} = {text}")
        return name

    def emit(self, v: ir.Value) -> str:
        if v in self.memo:
            return self.memo[v]
        if isinstance(v, ir.Const):
            return tconst(v.value, v.dtype)
        if isinstance(v, ir.Load) and v.buffer in self.registers:
            return self.registers[v.buffer]
        if isinstance(v, ir.IndexValue) and sympy.sympify(v.expr).is_Integer:
            return tconst(int(v.expr), v.dtype)
        if isinstance(v, ir.IndexValue):
            text = f"({tindex(v.expr)}).to({TL_TYPE[compute_dtype(v.dtype)]})"
        elif isinstance(v, ir.LoadIndirect):
            text = self._load(v.buffer, self._indirect(v), v.dtype)
        elif isinstance(v, ir.Load):
            text = self._load(v.buffer, self.sc.prog.buffers[v.buffer].flat_index(v.index), v.dtype)
        else:
            text = self._op(v)
        name = self.temp(text)
        self.memo[v] = name
        return name

    def _load(self, buffer: str, flat, dtype: str) -> str:
        self.sc.use(buffer)
        if not isinstance(flat, str) and self.col is not None:
            self.sc.addresses.append((flat, self.col))
        offset = flat if isinstance(flat, str) else tindex(flat)
        if not isinstance(flat, str) and sympy.sympify(flat).free_symbols <= self.scalars:
            # a fixed element (a 0-d tensor, or one per batch of a tile) read by a whole block: a block pointer,
            # since a scalar pointer under a block mask is an error in Triton before 3.7
            offset += BLOCK_ZERO[self.block_mask]
        mask = self.mask
        if self.axis_masks and mask == self.block_mask and not isinstance(flat, str):
            used = sympy.sympify(flat).free_symbols & set().union(*(axis for axis, _ in self.axis_masks))
            mask = next((m for axis, m in self.axis_masks if used and used <= axis), mask)
        text = f"tl.load({buffer} + {offset}, mask={mask}, other=0)"
        return f"{text}.to(tl.float32)" if dtype in HALF else text

    def _op(self, v: ir.Op) -> str:
        if v.op == "cast":
            return self._cast(v.args[0], v.dtype)
        if v.op == "where":
            cond = self._as_bool(v.args[0])
            a = self._branch(v.args[1], v.dtype, cond)
            b = self._branch(v.args[2], v.dtype, f"~{cond}")
            return f"tl.where({cond}, {a}, {b})"
        if v.op in COMPARE:
            common = max((a.dtype for a in v.args), key=PROMOTION.index)
            args = [self._as(a, common) for a in v.args]
        elif v.op in LOGICAL:
            args = [self.emit(a) for a in v.args]
        else:
            args = [self._as(a, v.dtype) for a in v.args]
        kind = "bool" if v.dtype == "bool" else ("float" if v.dtype in FLOATS else "int")
        table = {"bool": BOOL_OPS, "float": FLOAT_OPS, "int": INT_OPS}[kind]
        tmpl = table.get(v.op) or (FLOAT64_OPS.get(v.op) if v.dtype == "float64" else None) or \
            (BFLOAT16_OPS.get(v.op) if v.dtype == "bfloat16" else None) or OPS.get(v.op)
        if tmpl is None:
            raise NotImplementedError(f"no Triton rendering for op {v.op!r}")
        text = tmpl.format(a=args[0] if args else "", b=args[1] if len(args) > 1 else "",
                           c=args[2] if len(args) > 2 else "", T=TL_TYPE[compute_dtype(v.dtype)])
        natural = "bool" if v.op in COMPARE | LOGICAL else v.dtype
        if natural == v.dtype:
            return text
        if all(_literal(a) for a in v.args):  # Python's value (0 == 0 is a bool): no .to() on it
            return f"tl.full([1], {text}, {TL_TYPE[compute_dtype(v.dtype)]})"
        return f"({text}).to({TL_TYPE[compute_dtype(v.dtype)]})"

    def _branch(self, v: ir.Value, dtype: str, taken: str) -> str:
        """One side of a where(): its loads are masked by the lanes that take it, so an index that only the
        other side's lanes keep in range (cat's, pad's) is never read; values it computes stay private to it."""
        memo, mask = dict(self.memo), self.mask
        self.mask = f"{mask} & {taken}"
        try:
            return self._as(v, dtype)
        finally:
            self.memo, self.mask = memo, mask

    def _as(self, v: ir.Value, dtype: str) -> str:
        text = self.emit(v)
        if compute_dtype(v.dtype) == compute_dtype(dtype) or isinstance(v, ir.Const) and dtype != "bool":
            return text
        return self._convert(text, v.dtype, dtype)

    def _as_bool(self, v: ir.Value) -> str:
        text = self.emit(v)
        return text if v.dtype == "bool" else f"({text} != 0)"

    def tensor(self, v: ir.Value) -> str:
        """``v`` as a named tensor (a constant becomes a one-element tensor), so ``.to()`` and stores apply."""
        text = self.emit(v)
        if isinstance(v, ir.Const):
            text = self.temp(f"tl.full([1], {text}, {TL_TYPE[compute_dtype(v.dtype)]})")
        return text

    def _cast(self, v: ir.Value, dtype: str) -> str:
        if isinstance(v, ir.Const):
            return tconst(_cast_python(v.value, dtype), dtype)
        text = self.emit(v)
        return self._convert(text, v.dtype, dtype, round_half=True)

    @staticmethod
    def _convert(text: str, src: str, dst: str, round_half: bool = False) -> str:
        if dst == "bool":
            return f"({text} != 0)"
        if text.lstrip("-").replace(".", "", 1).isdigit():  # a literal (a constant index value) has no .to()
            text = f"tl.full([1], {text}, {TL_TYPE[compute_dtype(src)]})"
        out = f"{text}.to({TL_TYPE[compute_dtype(dst)]})"
        if dst in HALF and round_half:
            # an explicit cast to a half type rounds, as eager's does: through float32, since c10's Half and
            # BFloat16 are built from a float only (an integer or float64 is rounded to float32 first; sm_90's
            # direct int->bf16 cvt would round once). It also keeps Triton's interpreter right: its int->bf16
            # cast takes the integer as bf16 bits
            wide = text if compute_dtype(src) == "float32" else f"{text}.to(tl.float32)"
            out = f"{wide}.to({TL_TYPE[dst]}).to(tl.float32)"
        return out

    def _indirect(self, v: ir.LoadIndirect) -> str:
        """An indirect load's flat offset. A dim indexed by data is range-checked: a bad value records this
        kernel in the error word (the loader raises after the call) and reads element 0 instead."""
        bound = {}
        for k, src in enumerate(v.sources):
            text = self.emit(src)
            if src.dtype != "int64":
                text = self.temp(f"{text}.to(tl.int64)")
            elif not _TEMP.fullmatch(text):  # a constant index: only a temporary's name renders as itself, and
                # a tensor (not a Python int) keeps the range check's mask a tensor
                text = self.temp(f"tl.full([1], {text}, tl.int64)" if text.lstrip("-").isdigit() else text)
            bound[ir.xvar(k)] = sympy.Symbol(text, integer=True)
        buf = self.sc.prog.buffers[v.buffer]
        index = []
        for e, size in zip(v.index, buf.shape):
            e = sympy.sympify(e)
            if e.free_symbols & set(bound):
                raw = self.temp(tindex(e.xreplace(bound)))
                bad = self.temp(f"({raw} < 0) | ({raw} >= {tindex(size)})")
                hit = self.temp(f"{bad} & {self.mask}")  # broadcast to the block, like the pointer below
                self.lines.append(f"{self.indent}tl.store(tc_error + 0 * {hit}.to(tl.int32), "
                                  f"{self.sc.error_code}, mask={hit})")
                self.sc.checked = True
                e = sympy.Symbol(self.temp(f"tl.where({bad}, 0, {raw})"), integer=True)
            index.append(e)
        return buf.flat_index(index)


def decompose(flat: str, dims: tuple, prefix: str, indent: str) -> list[str]:
    """Row-major position ``flat`` split into one variable per dim of ``dims``."""
    lines, stride = [], sympy.Integer(1)
    for d in range(len(dims) - 1, -1, -1):
        q = flat if stride == 1 else f"({flat} // {tindex(stride)})"
        lines.append(f"{indent}{prefix}{d} = {q}" + (f" % {tindex(dims[d])}" if d > 0 else ""))
        stride = stride * dims[d]
    return lines


def stored(val: str, dtype: str) -> str:
    """A value converted to the dtype its buffer stores."""
    return f"{val}.to({TL_TYPE[dtype]})"
