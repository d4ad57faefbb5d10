"""The manifest's methods (added in 1.10, SPEC §2c): several named entry points over one set of weights and state.

Prefill (over a prompt of ``seq`` tokens) and decode (over one) want different kernels; a package with methods holds
each as a graph of its own, with its own symbols, ranges, guards and state pairing, all reading the one weights
array and the one state a session keeps. The first method is the package's ``inference`` graph and its top-level
fields (``symbols``, ``inputs``, ``guards``, ``state``...), so every reader finds one graph where it always did; each
later method is ``graphs[<its name>]`` with its interface in its ``methods`` entry. A package without methods has
no ``methods`` field and keeps the bytes it had before 1.10.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import FormatError
from .errors import clip as _clip
from .graphs import Context, parse_graph
from .records import IDENT, need, parse_guards, parse_symbols
from .state import parse_state

METHODS_VERSION = (1, 10)  # packages with methods say this version; those without keep 1.8's or 1.9's bytes
FIRST_GRAPH = "inference"  # the graph of the first method
RESERVED = ("inference", "backward")  # graph names a method may not take ("forward" only as the first method)


@dataclass(frozen=True)
class Method:
    """One named entry point: its graph in ``graphs`` and its interface (the first method's is the top level's)."""

    name: str
    graph: str              # FIRST_GRAPH for the first method, else ``name``
    symbols: tuple          # records.Symbol: its own, with its own ranges
    output_structure: str   # "single" or "tuple", counting its own outputs (not its state's)
    guards: tuple           # records.Guard over its symbols
    state: tuple = ()       # state.StateSpec, indices into its graph's inputs and outputs

    def to_json(self, first: bool) -> dict:
        if first:
            return {"name": self.name}
        out = {"name": self.name, "symbols": [asdict(s) for s in self.symbols],
               "output_structure": self.output_structure, "guards": [asdict(g) for g in self.guards]}
        if self.state:
            out["state"] = [s.to_json() for s in self.state]
        return out


def method_names(items: Any) -> tuple:
    """The names in ``methods`` (a list of objects each with an identifier ``name``), checked before the graphs are
    parsed, which need to know which graphs are methods."""
    if not isinstance(items, list) or not items:
        raise FormatError(f"manifest: methods should be a non-empty list of method objects, found {_clip(items)}")
    names = []
    for k, d in enumerate(items):
        if not isinstance(d, dict):
            raise FormatError(f"manifest: methods[{k}] should be an object, found {_clip(d)}")
        name = need(d, "name", str, f"methods[{k}]")
        if not IDENT.match(name) or name in names:
            raise FormatError(f"manifest: methods[{k}].name {_clip(name)} should be a unique identifier")
        if name in RESERVED or (k > 0 and name == "forward"):
            raise FormatError(f"manifest: methods[{k}].name {name!r} is a graph name of its own (only the first "
                              f"method may be 'forward'); rebuild the package")
        names.append(name)
    return tuple(names)


def parse_methods(items: list, first: "Method", table: dict, graphs: dict, ctx: Context, state_file: Any) -> tuple:
    """Every method: the first is ``first`` (the top level's interface, graph ``inference``); each later one reads
    its own symbols and guards, then its graph ``table[name]`` over those symbols (added to ``graphs``), then its
    state pairing against that graph. ``ctx`` is the manifest's graph context."""
    out = [first]
    for k, d in enumerate(items[1:], 1):
        name, where = d["name"], f"methods[{k}]"
        symbols = parse_symbols(need(d, "symbols", list, where), f"{where}.symbols")
        names = {s.name for s in symbols}
        guards = parse_guards(need(d, "guards", list, where), names, f"{where}.guards")
        raw = table.get(name)
        if not isinstance(raw, dict) or "inputs" not in raw or "outputs" not in raw:
            raise FormatError(f"manifest: {where} ({name}) needs the graph graphs.{name} with its inputs and "
                              f"outputs; rebuild the package")
        g = graphs[name] = parse_graph(name, raw, replace(ctx, symbols=names, inputs=(), outputs=()))
        state = parse_state(d.get("state", []), state_file, g.inputs, g.outputs, ctx.members)
        structure = need(d, "output_structure", str, where)
        own = len(g.outputs) - len(state)
        if structure not in ("single", "tuple") or (structure == "single" and own != 1):
            raise FormatError(f"manifest: {where}.output_structure {structure[:40]!r} does not fit {own} output(s)")
        out.append(Method(name, name, symbols, structure, guards, state))
    _check_shared_state(out, graphs)
    return tuple(out)


def _check_shared_state(methods: list, graphs: dict) -> None:
    """A state is one array per session whichever method runs: every method naming it agrees on its dtype, shape
    and initial value's kind."""
    seen: dict = {}
    for m in methods:
        g = graphs[m.graph]
        for s in m.state:
            spec = g.inputs[s.input]
            key = (spec.dtype, tuple(spec.shape), s.initial)
            other = seen.setdefault(s.name, (m.name, key))
            if other[1] != key:
                raise FormatError(f"manifest: state {s.name!r} is {other[1][0]}{list(other[1][1])} "
                                  f"({other[1][2]}) in method {other[0]!r} but {key[0]}{list(key[1])} ({key[2]}) in "
                                  f"method {m.name!r}; methods share one state by name. Rebuild the package.")
