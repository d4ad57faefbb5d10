"""A guard torch could not prove over a declared range, checked at every size in that range instead.

torch.export reasons about sizes with intervals; through floor divisions it loses precision and reports a
constraint violation for a guard that in fact holds for every size the user declared. A Wav2Vec2 feature encoder
(three strided convolutions: ``frames = samples // 20 - 1``) needs ``(samples // 20 - 1)**2 > 1``, true for all
``samples >= 60``, yet torch could only suggest ``samples = 20*_samples``: a package narrowed to multiples of 20.

So before accepting a fix, capture.py exports again with the violated symbols as ``Dim.DYNAMIC`` over the same
range (torch then records its guards instead of failing) and ``failing_guard`` evaluates every guard on the
symbols' sizes at every point of their declared ranges (exact integer arithmetic, numpy, a few million points at
most). When each holds everywhere, the declared range stands and the guards travel on to the package as usual
(relations.collect_guards); when one fails somewhere, or the range is too large to enumerate, torch's fix is
accepted as before.
"""

from __future__ import annotations

import itertools
import math
import re

import numpy as np
import sympy
import torch

MAX_POINTS = 4_000_000
"""Largest product of range sizes enumerated for one guard (a few numpy passes over that many int64s)."""

_VIOLATED_RE = re.compile(r"Not all values of (?P<name>\w+) = ")


def violated_symbols(message: str) -> list[str]:
    """The symbols a constraint-violation message says torch could not prove a guard for."""
    return list(dict.fromkeys(m.group("name") for m in _VIOLATED_RE.finditer(message)))


def _floordiv(a, b):
    return np.floor_divide(a, b)


def _mod(a, b):
    return np.mod(a, b)


_FUNCTIONS = {"FloorDiv": _floordiv, "Mod": _mod, "PythonMod": _mod, "Max": np.maximum, "Min": np.minimum,
              "floor": np.floor, "ceiling": np.ceil, "CleanDiv": _floordiv}


def _shape_env(ep):
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for s in val.shape:
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
    return None


def _grid(symbols, ranges):
    """Every point of the symbols' ranges (one flat int64 array per symbol), or None when too many."""
    sizes = [ranges[s][1] - ranges[s][0] + 1 for s in symbols]
    if math.prod(sizes) > MAX_POINTS:
        return None
    axes = [np.arange(ranges[s][0], ranges[s][1] + 1, dtype=np.int64) for s in symbols]
    return [a.ravel() for a in np.meshgrid(*axes, indexing="ij")] if axes else []


def _truth(expr, symbols, grid) -> np.ndarray | None:
    """``expr`` at every grid point (a bool per point), or None when numpy cannot evaluate it."""
    try:
        fn = sympy.lambdify(symbols, expr, modules=[_FUNCTIONS, "numpy"])
        return np.broadcast_to(np.asarray(fn(*grid), dtype=bool), grid[0].shape if grid else ())
    except Exception:  # a function lambdify or numpy does not know: undecided
        return None


def _holds_everywhere(expr, ranges) -> bool | None:
    """True when ``expr`` holds at every point of its symbols' ranges, False when it fails at one, None when that
    cannot be decided here (an unbounded range, too many points, a function numpy does not have)."""
    symbols = sorted(expr.free_symbols, key=str)
    if any(s not in ranges for s in symbols):
        return None
    grid = _grid(symbols, ranges)
    if grid is None:
        return None
    value = _truth(expr, symbols, grid)
    return None if value is None else bool(value.all())


def same_sizes(ep, input_names, places, trusted) -> dict:
    """torch's symbol at each further place of a trusted symbol -> its symbol at the first place: one user
    symbol is one size (a square image's height and width), whatever names torch gave its places."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    first, same = {}, {}
    for input_name, node_name in zip(input_names, user):
        shape = nodes[node_name].meta["val"].shape
        for dim, text in places.get(input_name, {}).items():
            if text in trusted and isinstance(shape[dim], torch.SymInt):
                sym = sympy.sympify(shape[dim].node.expr)
                if text in first and sym != first[text]:
                    same[sym] = first[text]
                first.setdefault(text, sym)
    return same


def failing_guard(ep, same: dict | None = None) -> str | None:
    """None when every guard of the exported program holds at every size of the program's symbol ranges (torch
    symbols in ``same`` replaced by the one they equal); else the first guard that fails somewhere or cannot be
    checked (as text: why the range cannot stand)."""
    env = _shape_env(ep)
    if env is None:
        return None
    same = same or {}
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        lo, hi = vr.lower, vr.upper
        if not (lo.is_finite and hi.is_finite):
            continue
        ranges[sympy.sympify(sym)] = (int(lo), int(hi))
    asserts = (a.expr for group in getattr(env, "deferred_runtime_asserts", {}).values() for a in group)
    for guard in itertools.chain((g.expr for g in env.guards), asserts):
        guard = guard.xreplace(same)
        if guard.free_symbols and not _holds_everywhere(guard, ranges):
            return str(guard)
    return None


# ---------------------------------------------------------------------------------------------------------
# a guard that picks between two identical graphs: torch 2.11's pooling meta asks ``(size - 1) % 2 != 0`` in a
# rounding helper whose two branches compute the same size, so the guard splits the range into halves that trace
# to the same program. Export again at a size on the other side; when the graphs are equal and every size meets
# one capture's guards or the other's, the program holds over the whole range and the split guards are dropped.


def user_symbols(ep, input_names, places, trusted) -> dict:
    """torch's symbol at every place of a trusted user symbol -> that user symbol (sympy, by the user's name)."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out = {}
    for input_name, node_name in zip(input_names, user):
        shape = nodes[node_name].meta["val"].shape
        for dim, text in places.get(input_name, {}).items():
            if text in trusted and isinstance(shape[dim], torch.SymInt):
                out[sympy.sympify(shape[dim].node.expr)] = sympy.Symbol(text, integer=True)
    return out


def guards_over(ep, names: dict) -> list | None:
    """Every guard and runtime assert of ``ep`` over the user symbols ``names`` maps to, or None when one reads a
    symbol outside them (a size the check cannot enumerate)."""
    env = _shape_env(ep)
    if env is None:
        return []
    asserts = (a.expr for group in getattr(env, "deferred_runtime_asserts", {}).values() for a in group)
    out = []
    for guard in itertools.chain((g.expr for g in env.guards), asserts):
        if not guard.free_symbols:
            continue
        if not guard.free_symbols <= set(names):
            return None
        out.append(guard.xreplace(names))
    return out


def shape_env_of(ep):
    return _shape_env(ep)


def holds_on(expr, ranges: dict) -> bool:
    """Whether ``expr`` over user symbols holds at every point of ``ranges`` (name -> (lo, hi))."""
    return bool(_holds_everywhere(expr, {sympy.Symbol(n, integer=True): r for n, r in ranges.items()}))


def _all_hold(guards, symbols, grid) -> np.ndarray | None:
    ok = np.ones(grid[0].shape if grid else (), dtype=bool)
    for g in guards:
        value = _truth(g, symbols, grid)
        if value is None:
            return None
        ok &= value
    return ok


def uncovered(guard_sets: list, ranges: dict) -> dict | None:
    """The first point of ``ranges`` where no set of ``guard_sets`` holds whole ({name: size}), or None when
    every point meets one of them. Raises ValueError where the guards cannot be evaluated over the grid."""
    symbols = [sympy.Symbol(n, integer=True) for n in ranges]
    grid = _grid(symbols, {s: ranges[s.name] for s in symbols})
    if grid is None:
        raise ValueError("no grid over these ranges")
    met = None
    for guards in guard_sets:
        ok = _all_hold(guards, symbols, grid)
        if ok is None:
            raise ValueError(f"guards {guards} cannot be evaluated")
        met = ok if met is None else met | ok
    if met.all():
        return None
    at = int(np.argmin(met))
    return {s.name: int(axis[at]) for s, axis in zip(symbols, grid)}


def resized(t: torch.Tensor, dims: dict) -> torch.Tensor:
    """``t`` with each dim in ``dims`` (dim -> size) made that size by repeating its contents along it and cutting:
    token ids stay ids of the vocabulary, a mask stays a mask."""
    for d, size in dims.items():
        reps = [1] * t.dim()
        reps[d] = -(-size // t.shape[d])
        t = t.repeat(*reps).narrow(d, 0, size)
    return t.contiguous()
