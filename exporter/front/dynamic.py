"""Dynamic-dimension specs: `--dynamic` strings and model files' `dynamic_shapes`, into torch.export Dims.

    --dynamic batch                    dim 0 of every tensor input is the symbol `batch`, range 1..unbounded
    --dynamic batch=1:512              the same, range 1..512
    --dynamic seq@ids.1,mask.1         symbol `seq` on dim 1 of `ids` and of `mask`
    --dynamic seq=1:2048@ids.1,mask.1
    --dynamic 2*seq@pairs.1            a derived dim: dim 1 of `pairs` is always 2*seq (needs @places, no range)
    --dynamic seq-1@shifted.1          derived dims are A*SYMBOL + B: `2*seq`, `seq+1`, `seq-1`, `4*seq+2`
    dynamic_shapes = {"x": {0: "batch"}, "ids": {1: ("seq", 1, 2048)}, "pairs": {1: "2*seq"}}

A derived dim becomes torch.export Dim arithmetic (``2*Dim("seq")``, ``Dim("seq") - 1``); its range follows its
symbol's. A symbol used only in derived dims is declared implicitly with the range 1..unbounded.
Placement values are the dim's text: a symbol name (``"seq"``) or a normalised derived expression
(``"2*seq"``, ``"seq - 1"``); ``parse_dim_expr`` reads either.

Where a spec comes from and goes: cli.py (``--dynamic``) or the model file's ``dynamic_shapes`` -> ``resolve``
(symbols and their placement, called by capture.capture) -> ``to_torch_dynamic_shapes`` (torch.export Dims) ->
torch.export -> relations.py (torch's symbols back to ours, ranges, guards).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

import torch

from tcexport.formats.manifest import SM_COUNT

from tcexport.exporter.errors import DynamicSpecError

DEFAULT_MIN = 1
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SPEC_RE = re.compile(rf"^(?P<sym>{_NAME})(=(?P<lo>\d*):(?P<hi>\d*))?(@(?P<places>.+))?$")
_DERIVED_RE = re.compile(rf"^(?:(?P<a>\d+)\s*\*\s*)?(?P<sym>{_NAME})(?:\s*\*\s*(?P<a2>\d+))?"
                         rf"(?:\s*(?P<sign>[+-])\s*(?P<b>\d+))?$")
DERIVED_FORMS = "A*SYMBOL + B, e.g. `2*seq`, `seq+1`, `seq-1`, `4*seq+2`"


@dataclass(frozen=True)
class DimExpr:
    """A dim's size as ``scale*root + offset``: the bare symbol has scale 1 and offset 0."""

    root: str
    scale: int = 1
    offset: int = 0

    @property
    def is_bare(self) -> bool:
        return self.scale == 1 and self.offset == 0

    def __str__(self) -> str:
        text = self.root if self.scale == 1 else f"{self.scale}*{self.root}"
        if self.offset:
            text += f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        return text


def parse_dim_expr(text: str, where: str = "dynamic dim") -> DimExpr:
    m = _DERIVED_RE.match(str(text).strip())
    if not m:
        raise DynamicSpecError(f"{where}: {text!r} is neither a symbol name nor a derived dim ({DERIVED_FORMS})")
    scale = int(m["a"] or 1) * int(m["a2"] or 1)
    offset = int(m["b"] or 0) * (-1 if m["sign"] == "-" else 1)
    if scale < 1:
        raise DynamicSpecError(f"{where}: {text!r} has scale {scale}; a derived dim needs a positive scale")
    return DimExpr(m["sym"], scale, offset)


@dataclass(frozen=True)
class SymbolSpec:
    name: str
    min: int
    max: int | None


# input name -> dim -> symbol name
Placement = dict[str, dict[int, str]]


def parse_cli_spec(text: str, input_names: list[str], ranks: list[int]) -> tuple[SymbolSpec | None, Placement]:
    """One `--dynamic` flag. Returns (the symbol it declares, or None for a derived dim; its placement)."""
    head, at, tail = text.strip().partition("@")
    if _DERIVED_RE.match(head.strip()) and not _SPEC_RE.match(head.strip()):
        expr = parse_dim_expr(head, f"--dynamic {text!r}")
        if not at:
            raise DynamicSpecError(f"--dynamic {text!r}: a derived dim needs its places, e.g. "
                                   f"--dynamic {expr}@INPUT.DIM (its range follows {expr.root!r})")
        return None, _parse_places(text, tail, str(expr))
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise DynamicSpecError(
            f"--dynamic {text!r}: expected SYMBOL, SYMBOL=MIN:MAX, SYMBOL[=MIN:MAX]@INPUT.DIM[,INPUT.DIM...] "
            f"or a derived dim EXPR@INPUT.DIM with EXPR = {DERIVED_FORMS} "
            f"(for example `batch`, `batch=1:512`, `seq@ids.1,mask.1`, `2*seq@pairs.1`)")
    lo = int(m["lo"]) if m["lo"] else DEFAULT_MIN
    hi = int(m["hi"]) if m["hi"] else None
    sym = SymbolSpec(m["sym"], lo, hi)
    _check_range(sym, f"--dynamic {text!r}")
    places: Placement = {}
    if m["places"] is None:
        for name, rank in zip(input_names, ranks):
            if rank >= 1:
                places.setdefault(name, {})[0] = sym.name
        return sym, places
    return sym, _parse_places(text, m["places"], sym.name)


def _parse_places(text: str, places_text: str, dim_text: str) -> Placement:
    places: Placement = {}
    for item in places_text.split(","):
        name, _, dim = item.strip().rpartition(".")
        if not name or not dim.lstrip("-").isdigit():
            raise DynamicSpecError(f"--dynamic {text!r}: {item!r} should be INPUT.DIM, e.g. ids.1")
        places.setdefault(name, {})[int(dim)] = dim_text
    return places


def _check_range(sym: SymbolSpec, where: str) -> None:
    if sym.name == SM_COUNT:
        raise DynamicSpecError(f"{where}: the symbol name {SM_COUNT!r} is reserved (launch grids use it for the "
                               "GPU's multiprocessor count); pick another name")
    if sym.min < 1 and sym.min != 0:
        raise DynamicSpecError(f"{where}: minimum {sym.min} of {sym.name!r} should be >= 0")
    if sym.max is not None and sym.max < sym.min:
        raise DynamicSpecError(f"{where}: range {sym.min}:{sym.max} of {sym.name!r} is empty (max < min)")


def parse_model_dynamic_shapes(dyn: dict) -> tuple[dict[str, SymbolSpec], Placement]:
    symbols: dict[str, SymbolSpec] = {}
    places: Placement = {}
    for name, dims in dyn.items():
        if not isinstance(dims, dict):
            raise DynamicSpecError(f"dynamic_shapes[{name!r}] should be a dict {{dim: symbol}}, found {dims!r}")
        for dim, entry in dims.items():
            where = f"dynamic_shapes[{name!r}][{dim!r}]"
            if isinstance(entry, str) and not re.fullmatch(_NAME, entry.strip()):
                places.setdefault(name, {})[int(dim)] = str(parse_dim_expr(entry, where))
                continue
            if isinstance(entry, str):
                sym = SymbolSpec(entry.strip(), DEFAULT_MIN, None)
            elif isinstance(entry, (tuple, list)) and len(entry) == 3 and isinstance(entry[0], str):
                sym = SymbolSpec(entry[0], int(entry[1]), None if entry[2] is None else int(entry[2]))
            else:
                raise DynamicSpecError(f"{where}: expected \"symbol\", (\"symbol\", min, max) or a derived dim "
                                       f"such as \"2*symbol\" ({DERIVED_FORMS}), found {entry!r}")
            _check_range(sym, where)
            _merge_symbol(symbols, sym, where)
            places.setdefault(name, {})[int(dim)] = sym.name
    return symbols, places


def _merge_symbol(symbols: dict[str, SymbolSpec], sym: SymbolSpec, where: str) -> None:
    old = symbols.get(sym.name)
    if old is not None and (old.min, old.max) != (sym.min, sym.max) and (sym.min, sym.max) != (DEFAULT_MIN, None):
        if (old.min, old.max) != (DEFAULT_MIN, None):
            raise DynamicSpecError(f"{where}: symbol {sym.name!r} has range {sym.min}:{sym.max} here but "
                                   f"{old.min}:{old.max} elsewhere; give one range per symbol")
    if old is None or (old.min, old.max) == (DEFAULT_MIN, None):
        symbols[sym.name] = sym


def resolve(input_names: list[str], examples: tuple, model_dyn: dict | None, cli_specs: list[str]):
    """Combine the model file's dynamic_shapes with --dynamic flags (flags win) and check every placement.

    Returns (symbols by name, placement) where placement maps input name -> dim -> symbol name.
    """
    ranks = [t.dim() for t in examples]
    symbols: dict[str, SymbolSpec] = {}
    places: Placement = {}
    if model_dyn:
        symbols, places = parse_model_dynamic_shapes(model_dyn)
    from_file = dict(symbols)
    for text in cli_specs:
        sym, p = parse_cli_spec(text, input_names, ranks)
        if sym is not None:
            _check_known(text, sym.name, from_file)
            symbols[sym.name] = sym if (sym.min, sym.max) != (DEFAULT_MIN, None) or sym.name not in symbols \
                else symbols[sym.name]
        for name, dims in p.items():
            places.setdefault(name, {}).update(dims)
    for dims in places.values():  # a symbol used only in derived dims is declared by them
        for text in dims.values():
            root = parse_dim_expr(text).root
            symbols.setdefault(root, SymbolSpec(root, DEFAULT_MIN, None))
    _check_none_dropped(from_file, places, cli_specs)
    for name, dims in places.items():
        if name not in input_names:
            raise DynamicSpecError(f"dynamic dim on input {name!r}, but forward() takes {input_names}"
                                   f"{did_you_mean(name, input_names)}")
        k = input_names.index(name)
        rank = ranks[k]
        for dim in list(dims):
            if not -rank <= dim < rank:
                raise DynamicSpecError(f"dynamic dim {name}.{dim}: input {name!r} has rank {rank} "
                                       f"(shape {tuple(examples[k].shape)})")
            if dim < 0:
                dims[dim % rank] = dims.pop(dim)
    _check_examples(input_names, examples, symbols, places)
    return symbols, places


def did_you_mean(name: str, known) -> str:
    """`` (did you mean 'batch'?)`` for the closest of ``known`` to ``name``, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_known(text: str, name: str, from_file: dict[str, SymbolSpec]) -> None:
    """A --dynamic symbol the model file does not use, but close to one it does, is a misspelling."""
    if name in from_file or not from_file:
        return
    hint = did_you_mean(name, from_file)
    if hint:
        raise DynamicSpecError(f"--dynamic {text!r}: the model file's dynamic_shapes has no symbol {name!r}{hint}; "
                               f"its symbols are {sorted(from_file)}. Fix the spelling, or give a new symbol its "
                               f"places with @INPUT.DIM", symbol=name, expected=sorted(from_file), got=name)


def _check_none_dropped(from_file: dict[str, SymbolSpec], places: Placement, cli_specs: list[str]) -> None:
    """Every symbol of the model file keeps a place: a --dynamic flag that takes all of a file symbol's places
    would drop its range silently, so it is an error naming both."""
    used = {parse_dim_expr(t).root for dims in places.values() for t in dims.values()}
    for name, sym in from_file.items():
        if name in used:
            continue
        rng = f"{sym.min}..{'unbounded' if sym.max is None else sym.max}"
        raise DynamicSpecError(
            f"--dynamic {' '.join(repr(t) for t in cli_specs)} takes every place of the model file's symbol "
            f"{name!r} (range {rng}), which would drop that range. Use --dynamic {name}=MIN:MAX to change its "
            f"range, or place the new symbol elsewhere with @INPUT.DIM", symbol=name, expected=[sym.min, sym.max])


def _check_examples(input_names, examples, symbols, places) -> None:
    """Every example size must fit its symbol's range, and derived dims must agree with their symbol."""
    seen: dict[str, tuple[int, str]] = {}  # symbol -> (value, "input.dim" it came from)
    order = sorted(((parse_dim_expr(t), name, dim) for name, dims in places.items() for dim, t in dims.items()),
                   key=lambda e: not e[0].is_bare)  # bare dims first: they give the symbol's value directly
    for expr, name, dim in order:
        size = examples[input_names.index(name)].shape[dim]
        sym = symbols[expr.root]
        if (size - expr.offset) % expr.scale:
            raise DynamicSpecError(f"example input {name!r} has size {size} at dim {dim}, which cannot be {expr} "
                                   f"for any integer {expr.root}; change the example or the derived dim")
        value = (size - expr.offset) // expr.scale
        if expr.root in seen and seen[expr.root][0] != value:
            first_value, first = seen[expr.root]
            raise DynamicSpecError(
                f"example input {name!r} has size {size} at dim {dim}, but {expr} = "
                f"{expr.scale * first_value + expr.offset} with {expr.root} = {first_value} (from {first}); "
                f"change the example so the dims agree")
        seen.setdefault(expr.root, (value, f"{name}.{dim}"))
        if value < sym.min or (sym.max is not None and value > sym.max):
            what = f"size {size}" if expr.is_bare else f"size {size} ({expr.root} = {value} for {expr})"
            raise DynamicSpecError(f"example input {name!r} has {what} at dim {dim}, outside the range "
                                   f"{sym.min}:{sym.max} of symbol {expr.root!r}; change the example or the range")


@dataclass(frozen=True)
class Rewrite:
    """A relation export demanded and we accepted: user symbol ``name`` = ``scale*root + offset``.

    ``root`` is another user symbol (an equality or derived relation) or a fresh Dim that torch suggested,
    with its range in ``fresh_range`` (a divisibility fact: ``seq = 4*_seq``)."""

    name: str
    root: str
    scale: int
    offset: int
    fresh_range: tuple | None = None  # (min, max) of a fresh root; None when root is a user symbol


def torch_dim_of(expr: DimExpr, rewrites: dict[str, Rewrite]) -> DimExpr:
    """A dim's expression over the Dims torch sees, after the accepted rewrites."""
    r = rewrites.get(expr.root)
    if r is None:
        return expr
    inner = torch_dim_of(DimExpr(r.root, r.scale, r.offset), rewrites)
    return DimExpr(inner.root, expr.scale * inner.scale, expr.scale * inner.offset + expr.offset)


def to_torch_dynamic_shapes(input_names, examples, symbols, places, rewrites=None, trusted=()) -> dict | None:
    """One torch.export.Dim per symbol, shared across every place it appears; derived dims as Dim arithmetic.
    A ``trusted`` symbol (never derived: ``plain_symbols``) is ``Dim.DYNAMIC`` over its range at each place,
    so export records the guards it cannot prove instead of failing (front/range_check.py checks them)."""
    if not places:
        return None
    rewrites = rewrites or {}
    dims = {name: _dim(name, s.min, s.max) for name, s in symbols.items() if name not in rewrites}
    dims.update({r.root: _dim(r.root, *r.fresh_range) for r in rewrites.values() if r.fresh_range is not None})
    dims.update({name: torch.export.Dim.DYNAMIC(min=max(symbols[name].min, 0), max=symbols[name].max)
                 for name in trusted})
    out = {}
    for name, t in zip(input_names, examples):
        spec = {}
        for d, text in places.get(name, {}).items():
            e = torch_dim_of(parse_dim_expr(text), rewrites)
            dim = dims[e.root] if e.scale == 1 else e.scale * dims[e.root]
            spec[d] = dim + e.offset if e.offset else dim
        out[name] = spec or None
    return out


def plain_symbols(names, places, rewrites) -> list[str]:
    """Those of ``names`` that stand alone wherever they are placed (no derived dim such as ``2*seq``, no
    rewrite): the symbols that can be exported as ``Dim.DYNAMIC``; torch then gives each place a symbol of its own
    (a square image's height and width), which front/range_check.py takes as equal, as the loader enforces."""
    plain: dict[str, bool] = {}
    for where in places.values():
        for text in where.values():
            e = parse_dim_expr(text)
            plain[e.root] = plain.get(e.root, True) and e.scale == 1 and e.offset == 0
    return [n for n in names if plain.get(n) and n not in (rewrites or {})]


def _dim(name: str, lo: int, hi: int | None):
    return torch.export.Dim(name, min=max(lo, 0), **({"max": hi} if hi is not None else {}))
