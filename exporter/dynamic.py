"""Dynamic-dimension specs: `--dynamic` strings and model files' `dynamic_shapes`, into torch.export Dims.

    --dynamic batch                    dim 0 of every tensor input is the symbol `batch`, range 1..unbounded
    --dynamic batch=1:512              the same, range 1..512
    --dynamic seq@ids.1,mask.1         symbol `seq` on dim 1 of `ids` and of `mask`
    --dynamic seq=1:2048@ids.1,mask.1
    dynamic_shapes = {"x": {0: "batch"}, "ids": {1: ("seq", 1, 2048)}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .errors import DynamicSpecError

DEFAULT_MIN = 1
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_SPEC_RE = re.compile(rf"^(?P<sym>{_NAME})(=(?P<lo>\d*):(?P<hi>\d*))?(@(?P<places>.+))?$")


@dataclass(frozen=True)
class SymbolSpec:
    name: str
    min: int
    max: int | None


# input name -> dim -> symbol name
Placement = dict[str, dict[int, str]]


def parse_cli_spec(text: str, input_names: list[str], ranks: list[int]) -> tuple[SymbolSpec, Placement]:
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise DynamicSpecError(
            f"--dynamic {text!r}: expected SYMBOL, SYMBOL=MIN:MAX, or SYMBOL[=MIN:MAX]@INPUT.DIM[,INPUT.DIM...] "
            f"(for example `batch`, `batch=1:512`, `seq@ids.1,mask.1`)")
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
    for item in m["places"].split(","):
        name, _, dim = item.strip().rpartition(".")
        if not name or not dim.lstrip("-").isdigit():
            raise DynamicSpecError(f"--dynamic {text!r}: {item!r} should be INPUT.DIM, e.g. ids.1")
        places.setdefault(name, {})[int(dim)] = sym.name
    return sym, places


def _check_range(sym: SymbolSpec, where: str) -> None:
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
            if isinstance(entry, str):
                sym = SymbolSpec(entry, DEFAULT_MIN, None)
            elif isinstance(entry, (tuple, list)) and len(entry) == 3 and isinstance(entry[0], str):
                sym = SymbolSpec(entry[0], int(entry[1]), None if entry[2] is None else int(entry[2]))
            else:
                raise DynamicSpecError(f"{where}: expected \"symbol\" or (\"symbol\", min, max), found {entry!r}")
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
    for text in cli_specs:
        sym, p = parse_cli_spec(text, input_names, ranks)
        symbols[sym.name] = sym if (sym.min, sym.max) != (DEFAULT_MIN, None) or sym.name not in symbols \
            else symbols[sym.name]
        for name, dims in p.items():
            places.setdefault(name, {}).update(dims)
    for name, dims in places.items():
        if name not in input_names:
            raise DynamicSpecError(f"dynamic dim on input {name!r}, but forward() takes {input_names}")
        k = input_names.index(name)
        rank = ranks[k]
        for dim in list(dims):
            if not -rank <= dim < rank:
                raise DynamicSpecError(f"dynamic dim {name}.{dim}: input {name!r} has rank {rank} "
                                       f"(shape {tuple(examples[k].shape)})")
            if dim < 0:
                dims[dim % rank] = dims.pop(dim)
        for dim, s in dims.items():
            size, sym = examples[k].shape[dim], symbols[s]
            if size < sym.min or (sym.max is not None and size > sym.max):
                raise DynamicSpecError(f"example input {name!r} has size {size} at dim {dim}, outside the range "
                                       f"{sym.min}:{sym.max} of symbol {s!r}; change the example or the range")
    return symbols, places


def to_torch_dynamic_shapes(input_names, examples, symbols, places) -> dict | None:
    """One torch.export.Dim per symbol, shared across every place it appears."""
    if not places:
        return None
    dims = {name: torch.export.Dim(name, min=max(s.min, 0), **({"max": s.max} if s.max is not None else {}))
            for name, s in symbols.items()}
    out = {}
    for name, t in zip(input_names, examples):
        spec = {d: dims[s] for d, s in places.get(name, {}).items()}
        out[name] = spec or None
    return out
