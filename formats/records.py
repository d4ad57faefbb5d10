"""The manifest's small records — symbols, tensor specs, guards, kernel bundles, launches, cubins — with their JSON
form and the field checks every section of the manifest uses (SPEC §2, §6, §6a).

Kept apart from manifest.py (the whole document) and graphs.py (the named graphs) so both build on one set of
checks: a launch list is parsed by one function wherever it appears.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .expr import to_text, validate
from .abi import check_bundle
from .dtypes import DTYPES
from .errors import FormatError
from .errors import clip as _clip

# a launch grid may name this besides the model's symbols (1.6, SPEC §6a): the GPU's multiprocessor count, bound
# by the loader. A persistent kernel's grid is min(SM_COUNT, its tiles): one program per SM walks its tiles.
SM_COUNT = "__sm_count"
SCRATCH_ALIGN = 256  # the loader's scratch buffer starts at a multiple of this (cuMemAlloc's alignment)
MAX_SCRATCH = 1 << 20  # per program: far above what a kernel needs (Triton's descriptors take 128 bytes each)
PARAM_KINDS = ("input", "weight", "output", "temp", "symbol", "error")
MAX_WARPS = 32           # 1024 threads, the most a CUDA block may have
MAX_SHARED = 1 << 20     # bytes of dynamic shared memory a launch may ask for (far above any GPU's limit)
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")


@dataclass(frozen=True)
class Symbol:
    name: str
    min: int
    max: int | None  # None: no upper bound


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple  # each dim: int or expression (see expr.py)

    def shape_text(self) -> str:
        return "[" + ", ".join(to_text(d) for d in self.shape) + "]"

    def __repr__(self) -> str:
        return f"TensorSpec({self.name}: {self.dtype}{self.shape_text()})"


@dataclass(frozen=True)
class Guard:
    expr: Any  # boolean expression over symbols
    message: str


@dataclass(frozen=True)
class Cubin:
    kernel: str           # the launch (its graph's cuda.launches[].name) this binary runs
    file: str             # archive member holding the cubin
    function: str         # the entry symbol inside it
    shared: int           # dynamic shared memory bytes to request at launch
    num_warps: int
    dependent: bool = False  # it may be launched as a programmatic dependent (1.5; SPEC §6a)
    global_scratch: int = 0  # bytes of global memory each program needs (1.6; SPEC §6a)

    def to_json(self) -> dict:
        """Its JSON object; ``dependent`` and ``global_scratch`` only where set, so earlier packages' manifests
        keep their bytes."""
        out = asdict(self)
        for key in ("dependent", "global_scratch"):
            if not out[key]:
                del out[key]
        return out


@dataclass(frozen=True)
class KernelBundle:
    """One target's native code. A CUDA bundle's cubins are per graph (graphs.CudaPart.cubins[isa])."""

    target: str           # "cpu" or "cuda:sm_XX"
    isa: str              # e.g. "x86-64-v3"; the loader picks the first whose `requires` this CPU has
    requires: tuple       # CPU feature flags as /proc/cpuinfo spells them
    file: str             # archive member holding the shared library
    abi: int
    entry: str
    libraries: tuple      # shared libraries the code needs at load time, e.g. "libgomp.so.1"
    blas: tuple           # BLAS routines the loader must pass in, e.g. "sgemm"

    @property
    def is_cuda(self) -> bool:
        return self.target.startswith("cuda:")


@dataclass(frozen=True)
class Launch:
    """One CUDA kernel launch: its parameters in argument order, each {"kind": ..., "value": ...} (an input,
    weight or output index; a temp's byte offset in the arena, an expression; a symbol name; the error word),
    and its grid as three expressions."""

    name: str
    params: tuple
    grid: tuple
    block: dict           # the constexpr block sizes it was compiled with (informational)
    num_warps: int
    num_stages: int
    index_bits: int = 32  # the width of its symbol parameters (32 or 64)

    def to_json(self) -> dict:
        return {"name": self.name, "params": [dict(p) for p in self.params], "grid": list(self.grid),
                "block": dict(self.block), "num_warps": self.num_warps, "num_stages": self.num_stages,
                "index_bits": self.index_bits}


def spec_json(s: TensorSpec) -> dict:
    return {"name": s.name, "dtype": s.dtype, "shape": list(s.shape)}


def bundle_json(k: KernelBundle, cubins: tuple = ()) -> dict:
    """A bundle's JSON object; ``cubins``: the inference graph's, which packages before 1.8 (and 1.8's view for
    them, SPEC §8) list in the CUDA bundle itself."""
    out = {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(k).items()}
    if cubins:
        out["cubins"] = [c.to_json() for c in cubins]
    return out


# ---------------------------------------------------------------------------------------------------------
# field checks


def need(d: dict, key: str, typ, where: str):
    """``d[key]``, which must be there and of type ``typ``; FormatError naming ``where`` otherwise."""
    if key not in d:
        raise FormatError(f"manifest: {where} has no field {key!r}")
    v = d[key]
    if typ is int and isinstance(v, bool) or not isinstance(v, typ):
        raise FormatError(f"manifest: {where}.{key} should be {getattr(typ, '__name__', typ)}, "
                          f"found {type(v).__name__} {v!r:.80}")
    return v


def parse_spec(d: Any, where: str, symbols: set[str], static: bool = False) -> TensorSpec:
    if not isinstance(d, dict):
        raise FormatError(f"manifest: {where} should be an object, found {d!r:.80}")
    name = need(d, "name", str, where)
    dtype = need(d, "dtype", str, where)
    if dtype not in DTYPES:
        raise FormatError(f"manifest: {where} ({name}) has dtype {dtype!r}; known: {sorted(DTYPES)}")
    shape = need(d, "shape", list, where)
    for i, dim in enumerate(shape):
        if static and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 0):
            raise FormatError(f"manifest: {where} ({name}) dim {i} should be a non-negative integer, found {dim!r}")
        validate(dim, symbols, f"manifest: {where} ({name}) dim {i}")
    return TensorSpec(name, dtype, tuple(shape))


def parse_symbols(sym_list: list, where_list: str) -> tuple:
    """A ``symbols`` list (the manifest's, or a method's): identifiers, unique, not the reserved grid symbol,
    each with ``min`` and ``max`` null or >= min."""
    symbols = []
    for i, s in enumerate(sym_list):
        where = f"{where_list}[{i}]"
        if not isinstance(s, dict):
            raise FormatError(f"manifest: {where} should be an object")
        name = need(s, "name", str, where)
        validate(name, None, f"manifest: {where}.name")
        if name == SM_COUNT:
            raise FormatError(f"manifest: {where}: {SM_COUNT!r} is reserved for the GPU's multiprocessor count in "
                              "launch grids; rename the dynamic dim")
        lo = need(s, "min", int, where)
        hi = s.get("max")
        if hi is not None and (not isinstance(hi, int) or isinstance(hi, bool) or hi < lo):
            raise FormatError(f"manifest: {where} ({name}) max should be null or an integer >= min {lo}, found "
                              f"{_clip(hi)}")
        for bound in (lo, hi):
            if bound is not None:
                validate(bound, None, f"manifest: {where} ({name}) range")
        symbols.append(Symbol(name, lo, hi))
    if len({s.name for s in symbols}) != len(symbols):
        raise FormatError(f"manifest: {where_list} has duplicate names")
    return tuple(symbols)


def parse_guards(items: list, names: set, where_list: str) -> tuple:
    """A ``guards`` list (the manifest's, or a method's): each an expression over ``names`` and a message."""
    guards = []
    for i, g in enumerate(items):
        if not isinstance(g, dict):
            raise FormatError(f"manifest: {where_list}[{i}] should be an object")
        validate(g.get("expr"), names, f"manifest: {where_list}[{i}].expr")
        guards.append(Guard(g["expr"], need(g, "message", str, f"{where_list}[{i}]")))
    return tuple(guards)


def strings(k: dict, key: str, where: str) -> tuple:
    values = need(k, key, list, where)
    if not all(isinstance(v, str) and len(v) <= 256 for v in values):
        raise FormatError(f"manifest: {where}.{key} should be a list of short strings, found {_clip(values)}")
    return tuple(values)


def parse_bundle(k: Any, where: str) -> tuple[KernelBundle, tuple]:
    """A bundle, and the cubins it lists itself (packages before 1.8: the inference graph's)."""
    if not isinstance(k, dict):
        raise FormatError(f"manifest: {where} should be an object")
    cubins = k.get("cubins", [])
    if not isinstance(cubins, list):
        raise FormatError(f"manifest: {where}.cubins should be a list, found {_clip(cubins)}")
    bundle = KernelBundle(
        target=need(k, "target", str, where), isa=need(k, "isa", str, where),
        requires=strings(k, "requires", where), file=need(k, "file", str, where),
        abi=need(k, "abi", int, where), entry=need(k, "entry", str, where),
        libraries=strings(k, "libraries", where), blas=strings(k, "blas", where))
    check_bundle(bundle.target, bundle.entry, bundle.libraries, where)
    return bundle, tuple(parse_cubin(c, f"{where}.cubins[{j}]") for j, c in enumerate(cubins))


def parse_cubin(c: Any, where: str) -> Cubin:
    if not isinstance(c, dict):
        raise FormatError(f"manifest: {where} should be an object")
    function, shared, warps = need(c, "function", str, where), need(c, "shared", int, where), \
        need(c, "num_warps", int, where)
    if not IDENT.match(function):
        raise FormatError(f"manifest: {where}.function should be a kernel's symbol name, found {_clip(function)}")
    if not 0 <= shared <= MAX_SHARED or not 1 <= warps <= MAX_WARPS:
        raise FormatError(f"manifest: {where}: shared {shared} should be 0..{MAX_SHARED} bytes and num_warps "
                          f"{warps} 1..{MAX_WARPS}")
    return Cubin(kernel=need(c, "kernel", str, where), file=need(c, "file", str, where), function=function,
                 shared=shared, num_warps=warps,
                 dependent=need(c, "dependent", bool, where) if "dependent" in c else False,
                 global_scratch=_scratch(c, where))


def _scratch(c: dict, where: str) -> int:
    value = c.get("global_scratch", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SCRATCH:
        raise FormatError(f"manifest: {where}.global_scratch should be a byte count from 0 to {MAX_SCRATCH}, "
                          f"found {value!r:.40}")
    return value


def parse_launches(items: list, where: str, symbols: set, counts: dict, default_bits) -> tuple:
    """A launch list (SPEC §6a): ``counts`` the number of inputs, weights and outputs its params may index."""
    launches = []
    for i, l in enumerate(items):
        lw = f"{where}[{i}]"
        if not isinstance(l, dict):
            raise FormatError(f"manifest: {lw} should be an object")
        params = tuple(_parse_param(p, f"{lw}.params[{j}]", symbols, counts)
                       for j, p in enumerate(need(l, "params", list, lw)))
        grid = need(l, "grid", list, lw)
        if len(grid) != 3:
            raise FormatError(f"manifest: {lw}.grid should have 3 expressions, found {len(grid)}")
        for g in grid:
            validate(g, symbols | {SM_COUNT}, f"manifest: {lw}.grid")
        bits = l.get("index_bits", default_bits)
        if isinstance(bits, bool) or bits not in (32, 64):
            raise FormatError(f"manifest: {lw}.index_bits should be 32 or 64, found {_clip(bits)}")
        launches.append(Launch(name=need(l, "name", str, lw), params=params, grid=tuple(grid),
                               block=dict(need(l, "block", dict, lw)), num_warps=need(l, "num_warps", int, lw),
                               num_stages=need(l, "num_stages", int, lw), index_bits=bits))
    if len({l.name for l in launches}) != len(launches):
        raise FormatError(f"manifest: {where} has duplicate names")
    return tuple(launches)


def _parse_param(p: Any, where: str, symbols: set, counts: dict) -> dict:
    if not isinstance(p, dict) or p.get("kind") not in PARAM_KINDS:
        raise FormatError(f"manifest: {where} should be {{'kind': one of {PARAM_KINDS}, 'value': ...}}, "
                          f"found {p!r:.80}")
    kind, value = p["kind"], p.get("value")
    if kind in counts and (not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < counts[kind]):
        raise FormatError(f"manifest: {where} refers to {kind} {value!r}; the package has {counts[kind]}")
    if kind == "symbol" and (not isinstance(value, str) or value not in symbols):
        raise FormatError(f"manifest: {where} names symbol {_clip(value)}, which is not declared")
    param = {"kind": kind, "value": value}
    if kind == "temp":
        validate(value, symbols, f"manifest: {where}.value")
        if not isinstance(p.get("dtype"), str) or p["dtype"] not in DTYPES:
            raise FormatError(f"manifest: {where} (a temp) needs a dtype, one of {sorted(DTYPES)}")
        param["dtype"] = p["dtype"]
    return param


def check_tuning(t: Any, names: set | None = None, where: str = "cuda.tuning") -> dict:
    """``tuning`` (SPEC §6a): ``device``, ``at`` (the symbol values measured at) and ``configs`` (launch
    name -> its chosen block sizes, num_warps, num_stages), which a rebuild takes back (``--tuning``); with
    ``names``, every configured launch must be one of them."""
    if not isinstance(t, dict):
        raise FormatError(f"manifest: {where} should be an object")
    need(t, "device", str, where)
    for i, at in enumerate(need(t, "at", list, where)):
        if not isinstance(at, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in at.values()):
            raise FormatError(f"manifest: {where}.at[{i}] should map symbol names to integers, found {at!r:.80}")
    for name, cfg in need(t, "configs", dict, where).items():
        if names is not None and name not in names:
            raise FormatError(f"manifest: {where}.configs names launch {name!r}, which "
                              f"{where.rsplit('.', 1)[0]}.launches lacks")
        if not isinstance(cfg, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                for v in cfg.values()):
            raise FormatError(f"manifest: {where}.configs[{name!r}] should map settings to integers, "
                              f"found {cfg!r:.80}")
    return t
