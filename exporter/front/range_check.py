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


def _holds_everywhere(expr, ranges) -> bool | None:
    """True when ``expr`` holds at every point of its symbols' ranges, False when it fails at one, None when that
    cannot be decided here (an unbounded range, too many points, a function numpy does not have)."""
    symbols = sorted(expr.free_symbols, key=str)
    if any(s not in ranges for s in symbols):
        return None
    grid = _grid(symbols, ranges)
    if grid is None:
        return None
    try:
        fn = sympy.lambdify(symbols, expr, modules=[_FUNCTIONS, "numpy"])
        value = np.asarray(fn(*grid))
    except Exception:  # a function lambdify or numpy does not know: undecided, torch's fix is taken
        return None
    return bool(value.all())


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
