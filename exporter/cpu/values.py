"""How the C++ backend writes a value: the C types of each dtype, the templates of the IR's ops, index
expressions (``cindex``) and ``CppEmitter``, which renders an IR value into statements. Shared by the kernel
writer (codegen.py) and the fused attention kernel (attention.py)."""

from __future__ import annotations

import math
import re

import sympy

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.index_text import IndexText

# the C type a value of each dtype is computed in; 16-bit floats compute in float32 (see ir.HALF_DTYPES)
CTYPE = {"float64": "double", "float32": "float", "float16": "float", "bfloat16": "float", "int64": "int64_t",
         "int32": "int32_t", "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "bool"}
# the C type a buffer stores each dtype's elements as: 16-bit floats are their bit patterns
STORAGE_CTYPE = {**CTYPE, "float16": "uint16_t", "bfloat16": "uint16_t"}
# 16-bit float -> (bits to float32, float32 to bits, float32 rounded to it); all in the prelude
HALF_CONVERSIONS = {"float16": ("tc_f16_to_float", "tc_float_to_f16", "tc_round_f16"),
                    "bfloat16": ("tc_bf16_to_float", "tc_float_to_bf16", "tc_round_bf16")}

# op -> template over rendered args a, b, c and the C type T
OPS = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "div": "({a} / {b})",
    "truncdiv": "({a} / {b})", "neg": "(-{a})", "abs": "std::abs({a})", "exp": "tc_exp({a})",
    "log": "tc_log({a})", "sqrt": "std::sqrt({a})", "rsqrt": "({T}(1) / std::sqrt({a}))",
    "erf": "tc_erf({a})", "tanh": "tc_tanh({a})", "sin": "std::sin({a})", "cos": "std::cos({a})",
    "tan": "std::tan({a})", "atan": "std::atan({a})", "sigmoid": "tc_sigmoid({a})",
    "reciprocal": "({T}(1) / {a})", "floor": "std::floor({a})", "ceil": "std::ceil({a})",
    "trunc": "std::trunc({a})", "round": "std::nearbyint({a})", "log1p": "std::log1p({a})",
    "expm1": "std::expm1({a})", "exp2": "std::exp2({a})", "log2": "std::log2({a})", "relu": "tc_relu({a})",
    "sign": "tc_sign({a})", "isnan": "({a} != {a})", "logical_not": "(!{a})",
    "maximum": "tc_max<{T}>({a}, {b})", "minimum": "tc_min<{T}>({a}, {b})", "pow": "std::pow({a}, {b})",
    "fmod": "std::fmod({a}, {b})", "atan2": "std::atan2({a}, {b})",
    "logical_and": "({a} && {b})", "logical_or": "({a} || {b})", "logical_xor": "({a} != {b})",
    "bitand": "({a} & {b})", "bitor": "({a} | {b})", "bitxor": "({a} ^ {b})", "bitnot": "(~{a})",
    "eq": "({a} == {b})", "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})",
    "gt": "({a} > {b})", "ge": "({a} >= {b})", "where": "({a} ? {b} : {c})", "cast": "static_cast<{T}>({a})",
}
INT_OPS = {"floordiv": "tc_floordiv({a}, {b})", "remainder": "tc_pymod({a}, {b})", "fmod": "({a} % {b})",
           "abs": "({a} < 0 ? -{a} : {a})"}
FLOAT_OPS = {"floordiv": "std::floor({a} / {b})", "remainder": "tc_fpymod({a}, {b})",
             "truncdiv": "std::trunc({a} / {b})"}


# ---------------------------------------------------------------------------------------------------------
# index expressions


class CIndex(IndexText):
    """Index text in C++: int64 arithmetic, floor division and modulo through the prelude's helpers (C truncates),
    literals past 32 bits marked long long; loop variables keep their names, symbols get an ``s_`` prefix."""

    def integer(self, v: int) -> str:
        return f"{v}LL" if abs(v) > 2**31 - 1 else str(v)

    def symbol(self, name: str) -> str:
        return name if name[0] in "ioqrt" and name[1:].isdigit() else f"s_{name}"

    def floordiv(self, a: str, b: str, nonneg: bool) -> str:
        return f"tc_floordiv({a}, {b})"

    def mod(self, a: str, b: str, nonneg: bool) -> str:
        return f"tc_pymod({a}, {b})"

    def extreme(self, which: str, a: str, b: str) -> str:
        return f"std::{which}<int64_t>({a}, {b})"


cindex = CIndex()


def loaded(dtype: str, element: str) -> str:
    """A stored element (C lvalue text) as the value it holds: 16-bit float bits widen to float32."""
    return f"{HALF_CONVERSIONS[dtype][0]}({element})" if dtype in HALF_CONVERSIONS else element


def stored(dtype: str, value: str) -> str:
    """A computed value as a buffer of ``dtype`` stores it: float32 rounds to 16-bit float bits."""
    return f"{HALF_CONVERSIONS[dtype][1]}({value})" if dtype in HALF_CONVERSIONS else value


def cconst(value, dtype: str) -> str:
    """A literal of ``dtype``'s compute type. A 16-bit float constant keeps its float32 value: PyTorch's CPU
    kernels use a Python scalar in the compute type (the lowering rounds it where PyTorch does)."""
    t = CTYPE[dtype]
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in ir.FLOAT_DTYPES:
        v = float(value)
        if math.isnan(v):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(v):
            return f"{'-' if v < 0 else ''}std::numeric_limits<{t}>::infinity()"
        text = repr(v)
        return f"{text}f" if t == "float" else text
    return f"static_cast<{t}>({int(value)}LL)"


# ---------------------------------------------------------------------------------------------------------
# value expressions


class CppEmitter:
    """Renders values into a block of statements, one temporary per distinct subexpression."""

    def __init__(self, prog: ir.Program, locals_: dict, indent: str, names):
        self.names = names  # shared by every emitter of one kernel, so temporaries never collide
        self.prog = prog
        self.locals = locals_  # buffer -> C variable holding its per-row value
        self.indent = indent
        self.lines: list[str] = []
        self.memo: dict = {}

    def emit(self, v: ir.Value) -> str:
        if v in self.memo:
            return self.memo[v]
        if isinstance(v, ir.Const):
            return cconst(v.value, v.dtype)
        if isinstance(v, ir.IndexValue):
            text = f"static_cast<{CTYPE[v.dtype]}>({cindex(v.expr)})"
        elif isinstance(v, ir.LoadIndirect):
            text = loaded(self.prog.buffers[v.buffer].dtype, self._indirect(v))
        elif isinstance(v, ir.Load):
            if v.buffer in self.locals:
                return self.locals[v.buffer]
            buf = self.prog.buffers[v.buffer]
            text = loaded(buf.dtype, f"{v.buffer}[{cindex(buf.flat_index(v.index))}]")
        else:
            args = [self.emit(a) for a in v.args]
            table = INT_OPS if v.dtype not in ir.FLOAT_DTYPES and v.dtype != "bool" else FLOAT_OPS
            tmpl = table.get(v.op) or OPS.get(v.op)
            if v.op == "where" and _positive_zero(v.args[2]) and CTYPE[v.dtype] in ("float", "double"):
                tmpl = "tc_keep({a}, {b})"
            elif (v.op == "where" and isinstance(v.args[2], ir.Const) and v.args[2].dtype == v.dtype
                  and CTYPE[v.dtype] in ("float", "double")):
                tmpl = "tc_keep_or({a}, {b}, {c})"
            if tmpl is None:
                raise NotImplementedError(f"no C++ rendering for op {v.op!r}")
            t = CTYPE[v.dtype]
            text = tmpl.format(T=t, a=args[0] if args else "", b=args[1] if len(args) > 1 else "",
                               c=args[2] if len(args) > 2 else "")
            if v.op not in ("cast",) and v.dtype != _arg_dtype(v):
                text = f"static_cast<{t}>({text})"
            if v.op == "cast" and v.dtype in HALF_CONVERSIONS:  # an explicit cast rounds, as PyTorch's does
                text = f"{HALF_CONVERSIONS[v.dtype][2]}({text})"
        name = f"t{next(self.names)}"
        self.lines.append(f"{self.indent}const {CTYPE[v.dtype]} {name} = {text};")
        self.memo[v] = name
        return name


    def _temp(self, ctype: str, text: str) -> str:
        name = f"t{next(self.names)}"
        self.lines.append(f"{self.indent}const {ctype} {name} = {text};")
        return name

    def _named(self, v: ir.Value) -> str:
        """``v`` as a temporary's name (``t12``): an index source becomes a symbol of the index expression, and
        only a temporary's name renders as itself (a constant index, ``static_cast<int64_t>(0LL)``, would not)."""
        text = self.emit(v)
        return text if _TEMP.fullmatch(text) else self._temp(CTYPE[v.dtype], text)

    def _indirect(self, v: ir.LoadIndirect) -> str:
        """The element address of an indirect load. A dim indexed by data is range-checked: a bad value sets
        the kernel's ``tc_oob`` flag (the kernel then fails) and reads element 0 instead of wild memory."""
        bound = {ir.xvar(k): sympy.Symbol(self._named(_as_int64(src)), integer=True)
                 for k, src in enumerate(v.sources)}
        buf = self.prog.buffers[v.buffer]
        index = []
        for e, size in zip(v.index, buf.shape):
            e = sympy.sympify(e)
            if e.free_symbols & set(bound):
                raw = self._temp("int64_t", cindex(e.xreplace(bound)))
                bad = self._temp("bool", f"({raw} < 0) | ({raw} >= {cindex(size)})")
                self.lines.append(f"{self.indent}tc_oob |= {bad};")
                e = sympy.Symbol(self._temp("int64_t", f"{bad} ? 0 : {raw}"), integer=True)
            index.append(e)
        return f"{v.buffer}[{cindex(buf.flat_index(index))}]"


_TEMP = re.compile(r"t\d+")


def _positive_zero(v: ir.Value) -> bool:
    return isinstance(v, ir.Const) and v.value == 0 and math.copysign(1.0, float(v.value)) > 0


def _as_int64(v: ir.Value) -> ir.Value:
    return v if v.dtype == "int64" else ir.Op("int64", "cast", (v,))


def _arg_dtype(v: ir.Op) -> str:
    if v.op in ("eq", "ne", "lt", "le", "gt", "ge", "isnan", "logical_and", "logical_or", "logical_xor",
                "logical_not"):
        return "bool"
    return v.dtype
