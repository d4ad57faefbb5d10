"""Relations between dynamic dims: what torch.export demands, what we accept, and what the package guards.

    export fails with "Suggested fixes"  ->  accept_fixes: narrow a range, `seq = 4*_seq` (divisibility),
                                             `b = a + 1` (a relation); a constant (`batch = 4`) is an error
    export succeeds                      ->  bind_symbols: torch's s0, s77 ... as expressions over our symbols
                                             symbol_ranges: every range constraint, as our symbols' ranges
                                             collect_guards: divisibility, non-range constraints, ShapeEnv
                                             guards and runtime asserts not implied by the ranges

Our symbols are the user's: a divisibility fact keeps ``seq`` (input dims stay ``seq``) and records the guard
``seq % 4 == 0``; torch's ``_seq`` becomes ``seq // 4`` wherever the program uses it (``subst``).

capture.capture calls these in that order; the refined symbols and the ``Relation`` list travel in
capture.Captured to lowering (sizes over our symbols) and to the package stage, which writes each Relation as a
manifest Guard that the loader (loader/guards.py) checks on every call.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import sympy
import torch
from torch.export.graph_signature import InputKind
from torch.utils._sympy.functions import FloorDiv

from tcexport.exporter.front import dynamic
from tcexport.exporter.front.dynamic import DimExpr, Rewrite, SymbolSpec
from tcexport.exporter.front.source_line import source_of
from tcexport.exporter.errors import CaptureError, DynamicSpecError, SpecializedDimError
from tcexport.exporter.ir.loops import shape_symbol



@dataclass
class Relation:
    """A relation over our symbols (sympy, boolean) and the human message the loader shows when it fails; the
    package stage writes each as a manifest ``Guard`` (formats.manifest), which the loader checks per call."""

    expr: sympy.Basic
    message: str


@dataclass
class Accepted:
    """What export demanded and we accepted while capturing; notes go to the export summary as warnings."""

    rewrites: dict = field(default_factory=dict)   # user symbol -> dynamic.Rewrite
    notes: list = field(default_factory=list)
    reasons: dict = field(default_factory=dict)    # user symbol -> torch's lines about it
    dropped: set = field(default_factory=set)      # torch guards (text) shown not to change the program


# ---------------------------------------------------------------------------------------------------------
# before a successful export: torch's suggested fixes


def accept_fixes(message: str, symbols: dict[str, SymbolSpec], places, accepted: Accepted) -> None:
    """Apply the "Suggested fixes" of a constraint violation to ``symbols`` / ``accepted``.

    Raises SpecializedDimError when the model fixes a dim marked dynamic to a constant, CaptureError when the
    message has no fix we can take (the caller shows torch's message)."""
    if "Suggested fixes:" not in message:
        raise CaptureError("no suggested fixes")
    fresh, exprs = _suggested_fixes(message, symbols)
    progress = False
    for name, expr in exprs.items():
        if isinstance(expr, int):
            _raise_specialized(name, expr, message, places)
    for name, (lo, hi) in fresh.items():
        if name in symbols and name not in exprs:  # a user symbol whose range export narrowed
            old = symbols[name]
            lo, hi = max(lo, old.min), hi if old.max is None or hi is not None and hi < old.max else old.max
            if (lo, hi) != (old.min, old.max):
                symbols[name] = SymbolSpec(name, lo, hi)
                accepted.notes.append(f"export narrowed the range of {name!r} from {old.min}:{old.max} to "
                                      f"{lo}:{hi} (the model needs it: {_reasons(name, message)})")
                progress = True
    for name, expr in exprs.items():
        if name not in symbols or name in accepted.rewrites:
            raise CaptureError(f"torch suggests `{name} = {expr}`, but {name!r} is not a symbol tcexport can "
                               f"rewrite")
        if expr.scale <= 0:
            raise CaptureError(f"torch suggests the relation {name} = {expr}, which is not of the form A*SYMBOL + B "
                               f"with A > 0")
        root_range = fresh.get(expr.root) if expr.root not in symbols else None
        if root_range is None and expr.root not in symbols:
            raise CaptureError(f"torch suggests `{name} = {expr}`, but {expr.root!r} is not a known symbol")
        rw = Rewrite(name, expr.root, expr.scale, expr.offset, root_range)
        if root_range is None:  # `name` is now tied to another user symbol: keep its declared range
            _narrow_root(symbols, symbols[name], rw)
        accepted.rewrites[name] = rw
        accepted.reasons[name] = _reasons(name, message)
        accepted.notes.append(_rewrite_note(rw, symbols))
        progress = True
    if not progress:
        raise CaptureError("the suggested fixes change nothing")


def _suggested_fixes(message: str, symbols: dict) -> tuple[dict, dict]:
    """torch's fixes, read by torch's own reader of its message (``refine_dynamic_shapes_from_suggested_fixes``,
    which changes with the message's wording): (name -> (min, max) of every dim the fixes leave free, our symbols
    and fresh roots such as ``_seq``; name -> the constant a symbol is fixed to, or the ``DimExpr`` over another
    dim it now is)."""
    from torch.export import Dim
    from torch.export.dynamic_shapes import _DerivedDim, refine_dynamic_shapes_from_suggested_fixes

    names = list(symbols)
    # the fixes block ends at its blank line: export's advice after it is not a fix
    block = message.split("Suggested fixes:", 1)[1].strip().split("\n\n", 1)[0]
    try:
        refined = refine_dynamic_shapes_from_suggested_fixes(f"Suggested fixes:\n{block}",
                                                             {"dims": [Dim(n) for n in names]})["dims"]
    except Exception as e:  # noqa: BLE001 - torch's UserError or AssertionError: a fix it cannot apply to our dims
        raise CaptureError(f"torch's suggested fixes do not apply to the dims tcexport declared: {e}") from e
    fresh, exprs = {}, {}
    for name, dim in zip(names, refined):
        if isinstance(dim, int):
            exprs[name] = dim
        elif isinstance(dim, _DerivedDim):
            offset = int(dim.fn(0))
            exprs[name] = DimExpr(dim.root.__name__, int(dim.fn(1)) - offset, offset)
            if dim.root.__name__ not in symbols:
                fresh[dim.root.__name__] = _dim_range(dim.root)
        elif dim.__name__ != name:
            exprs[name] = DimExpr(dim.__name__)
        else:
            fresh[name] = _dim_range(dim)
    return fresh, exprs


def _dim_range(dim) -> tuple[int, int | None]:
    hi = dim.max
    return int(dim.min or 0), None if hi is None or not isinstance(hi, int) or hi >= 2**62 else int(hi)


def _narrow_root(symbols, declared: SymbolSpec, rw: Rewrite) -> None:
    """``declared.name = scale*root + offset``: the root's range must keep ``declared`` in its own range."""
    root = symbols[rw.root]
    lo = max(root.min, -(-(declared.min - rw.offset) // rw.scale))
    hi = root.max
    if declared.max is not None:
        top = (declared.max - rw.offset) // rw.scale
        hi = top if hi is None else min(hi, top)
    symbols[rw.root] = SymbolSpec(rw.root, lo, hi)


def _rewrite_note(rw: Rewrite, symbols) -> str:
    rhs = str(DimExpr(rw.root, rw.scale, rw.offset))
    if rw.fresh_range is not None:
        rule = divisibility_text(rw.name, rw.scale, rw.offset)
        return (f"export needs {rule}; accepted torch's fix `{rw.name} = {rhs}`: {rw.name!r} stays the symbol "
                f"and the package guards {rw.name} % {rw.scale} == {rw.offset % rw.scale}")
    return (f"export found that {rw.name} = {rhs}; accepted: {rw.name!r} is no longer a free symbol, its dims "
            f"are {rhs} and the loader checks them")


def divisibility_text(name: str, scale: int, offset: int) -> str:
    r = offset % scale
    return f"{name} divisible by {scale}" if r == 0 else f"{name} % {scale} == {r}"


def _reasons(name: str, message: str) -> str:
    """torch's bullet lines that mention ``name`` (the guard it generated and why)."""
    bullets = [ln.strip()[2:] for ln in message.splitlines() if ln.strip().startswith("- ")]
    mine = [b for b in bullets if re.search(rf"\b{re.escape(name)}\b", b)] or bullets
    return "; ".join(b.split(". If you're using")[0] for b in mine[:3])


def _raise_specialized(name: str, value: int, message: str, places) -> None:
    where = [(inp, d) for inp, dims in places.items() for d, text in dims.items()
             if dynamic.parse_dim_expr(text).root == name]
    inp, dim = where[0] if where else (None, None)
    at = ", ".join(f"{i}.{d}" for i, d in where) or "?"
    reason = _reasons(name, message)
    raise SpecializedDimError(
        f"input {inp!r} dim {dim} was marked dynamic as {name!r}, but the model's code fixes it to the constant "
        f"{value}; torch says: {reason}. Fix: remove the dynamic mark for {at} (the package then accepts only "
        f"size {value}), or change the model code that fixes this size (a view or reshape with the literal "
        f"{value}, a size check, ...).", input=inp, dim=dim, symbol=name, value=value, reason=reason)


# ---------------------------------------------------------------------------------------------------------
# after a successful export: torch's symbols as our expressions


def subst(e, rename: dict):
    """``e`` over torch's symbols -> over ours. A symbol may map to a rational expression (``_seq`` ->
    ``seq/4``); polynomial parts are then made integral again as floor divisions, exact under the guards."""
    e = sympy.sympify(e)
    if all(v.is_Symbol for v in rename.values()) or not e.free_symbols:
        return e.xreplace(rename)
    return _integral(_subst(e, rename))


def _subst(e, rename):
    if e.is_Symbol:
        return rename.get(e, e)
    if e.is_Atom or not e.args:
        return e
    args = [_subst(a, rename) for a in e.args]
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Pow)):
        return e.func(*args)
    return e.func(*[_integral(a) for a in args])


def _integral(e):
    if not isinstance(e, (sympy.Add, sympy.Mul)):
        return e
    num, den = sympy.fraction(sympy.together(e))
    if den == 1:
        return e
    if not den.is_Integer:
        raise CaptureError(f"size {e} is not an integer expression over the dynamic symbols")
    return FloorDiv(sympy.expand(num), den)


def user_input_nodes(ep) -> dict[str, torch.fx.Node]:
    """The placeholders of the program's user inputs (not weights), by node name, in signature order."""
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return {name: nodes[name] for name in user}


def bind_symbols(ep, input_names, places, symbols: dict[str, SymbolSpec], accepted: Accepted):
    """Map torch's symbols to expressions over our symbols, from where each dim was placed.

    Returns (rename, ours) with ``ours`` the user symbols that stay free (others were rewritten)."""
    rewrites = accepted.rewrites
    ours = {n: shape_symbol(n) for n in symbols
            if n not in rewrites or rewrites[n].fresh_range is not None}
    rename: dict = {}
    pending = []
    user_nodes = list(user_input_nodes(ep).values())
    for k, name in enumerate(input_names[:len(user_nodes)]):
        shape = user_nodes[k].meta["val"].shape
        for dim, text in places.get(name, {}).items():
            size = shape[dim]
            decl = dynamic.parse_dim_expr(text)
            if not isinstance(size, torch.SymInt):
                raise SpecializedDimError(
                    f"input {name!r} dim {dim} was marked dynamic as {text!r}, but export specialised it to the "
                    f"constant {size}: the model's code requires that size. Remove the dynamic mark for "
                    f"{name}.{dim}, or change the model so the size is not fixed.",
                    input=name, dim=dim, symbol=decl.root, value=int(size), reason="specialised by export")
            want = _ours_of(decl, rewrites, ours)
            pending.append((name, dim, text, sympy.sympify(size.node.expr), want))
    for name, dim, text, got, want in pending:  # solve each torch symbol from a dim affine in it alone
        free = [s for s in got.free_symbols if s not in rename]
        if len(free) == 1:
            t = free[0]
            a, b = got.diff(t), got.subs(t, 0)
            if a.is_Integer and a != 0 and sympy.expand(got - a * t - b) == 0:
                rename[t] = sympy.expand((want - b) / a)
    for name, dim, text, got, want in pending:
        if sympy.expand(_subst(got, rename) - want) != 0:
            raise DynamicSpecError(
                f"input {name!r} dim {dim} is {text} in your dynamic shapes, but export traced it as {got} "
                f"({_subst(got, rename)} over your symbols); declare the relation, e.g. as a derived dim")
    return rename, ours


def _ours_of(decl: DimExpr, rewrites, ours) -> sympy.Expr:
    r = rewrites.get(decl.root)
    if r is None or r.fresh_range is not None:
        return decl.scale * ours[decl.root] + decl.offset
    inner = _ours_of(DimExpr(r.root, r.scale, r.offset), rewrites, ours)
    return decl.scale * inner + decl.offset


def symbol_ranges(ep, rename, symbols, ours) -> tuple[dict[str, SymbolSpec], list[Relation]]:
    """Each of our symbols' range: the user's, narrowed by every range constraint export recorded.

    A constraint on an expression that is not affine in one symbol becomes a guard instead."""
    lo = {n: symbols[n].min for n in ours}
    hi = {n: symbols[n].max for n in ours}
    guards = []
    for key, vr in ep.range_constraints.items():
        e = sympy.expand(_subst(sympy.sympify(key), rename))
        kl, kh = _finite(vr.lower), _finite(vr.upper)
        free = e.free_symbols
        if any(s.name not in lo for s in free):  # an unbacked symbol (a draft export's .item()): not a dim's range
            continue
        if len(free) == 1:
            (s,) = free
            a, b = e.diff(s), e.subs(s, 0)
            if a.is_Rational and a > 0 and sympy.expand(e - a * s - b) == 0:
                if kl is not None:
                    lo[s.name] = max(lo[s.name], int(math.ceil((kl - b) / a)))
                if kh is not None:
                    new = int(math.floor((kh - b) / a))
                    hi[s.name] = new if hi[s.name] is None else min(hi[s.name], new)
                continue
        if free and (kl is not None or kh is not None):
            e = _integral(e)
            cond = sympy.And(*([sympy.Le(kl, e)] if kl is not None else []) +
                             ([sympy.Le(e, kh)] if kh is not None else []))
            guards.append(Relation(cond, f"export requires {kl} <= {e} <= {kh}"))
    return {n: SymbolSpec(n, lo[n], hi[n]) for n in ours}, guards


def range_notes(declared: dict[str, SymbolSpec], refined: dict[str, SymbolSpec]) -> list[str]:
    """A note for each symbol whose range export narrowed beyond what the user declared."""
    notes = []
    for name, r in refined.items():
        d = declared.get(name)
        if d is not None and (r.min, r.max) != (d.min, d.max):
            notes.append(f"symbol {name!r}: declared {d.min}:{d.max if d.max is not None else ''}, the package "
                         f"accepts {r.min}:{r.max if r.max is not None else ''} (export's range constraints; torch "
                         f"treats sizes 0 and 1 specially, and the model may bound the size)")
    return notes


def _finite(x) -> int | None:
    try:
        v = sympy.sympify(x)
        return int(v) if v.is_Integer else None
    except (TypeError, ValueError, AttributeError):
        return None


def collect_guards(ep, rename, accepted: Accepted, model_file: str | None) -> list[Relation]:
    """Relations the package must check beyond symbol ranges and input dims, with human messages."""
    guards = []
    for rw in accepted.rewrites.values():
        if rw.fresh_range is None or rw.scale == 1:
            continue
        s = shape_symbol(rw.name)
        where = _divisibility_source(ep, rw, rename, model_file)
        rule = divisibility_text(rw.name, rw.scale, rw.offset).replace("divisible", "must be divisible") \
            if rw.offset % rw.scale == 0 else divisibility_text(rw.name, rw.scale, rw.offset) + " must hold"
        guards.append(Relation(sympy.Eq(sympy.Mod(s, rw.scale), rw.offset % rw.scale, evaluate=False),
                            f"{rule} ({'from ' + where if where else 'torch: ' + accepted.reasons[rw.name]})"))
    shape_env = _shape_env(ep)
    known = set(rename)
    if shape_env is not None:
        for g in shape_env.guards:
            if _keep(g.expr, known, shape_env) and str(g.expr) not in accepted.dropped:
                loc = g.sloc.maybe_user_loc or g.sloc.framework_loc
                guards.append(Relation(subst(g.expr, rename), f"export guards {g.expr} (from {_loc_text(loc)})"))
        for asserts in shape_env.deferred_runtime_asserts.values():
            for ra in asserts:
                if _keep(ra.expr, known, shape_env) and str(ra.expr) not in accepted.dropped:
                    guards.append(Relation(subst(ra.expr, rename), f"runtime assert: {ra.msg}"))
    for n in ep.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten._assert_scalar.default:
            cond = n.args[0].meta.get("val") if isinstance(n.args[0], torch.fx.Node) else None
            if isinstance(cond, torch.SymBool) and _keep(cond.node.expr, known, shape_env) and \
                    str(cond.node.expr) not in accepted.dropped:
                src = _source(n, model_file)
                msg = str(n.args[1]) if len(n.args) > 1 else "runtime assert"
                guards.append(Relation(subst(cond.node.expr, rename), msg + (f" (from {src})" if src else "")))
    return guards


def _keep(expr, known, shape_env) -> bool:
    """A guard over input symbols only, that the ranges do not already imply."""
    expr = sympy.sympify(expr)
    if not expr.free_symbols or not expr.free_symbols <= known:
        return False
    try:
        static = shape_env._maybe_evaluate_static(expr) if shape_env is not None else None
    except Exception:  # a private torch API: if it changes, keep the guard (checking twice is harmless)
        static = None
    return static is not sympy.true and static is not True


def _shape_env(ep):
    for n in ep.graph.nodes:
        val = n.meta.get("val")
        for s in getattr(val, "shape", ()):
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _loc_text(loc) -> str:
    if isinstance(loc, str):
        return loc
    return f"{_short(loc.filename)}:{loc.lineno} in {loc.name}: {(loc.line or '').strip()}" if loc else "?"


def _short(path: str) -> str:
    """A file's name without the build machine's folders: packages stay byte-identical across machines."""
    return str(path).replace("\\", "/").rsplit("/", 1)[-1]


def _source(node, model_file) -> str | None:
    src = source_of(node, model_file)
    if not src:
        return None
    m = re.match(r"^(.*?)(:\d+ in .*)$", src, re.S)
    return _short(m[1]) + m[2] if m else src


def _divisibility_source(ep, rw: Rewrite, rename, model_file) -> str | None:
    """The model's line that needs the divisibility: the first node whose sizes use ``seq / 4``."""
    shape_env = _shape_env(ep)
    if shape_env is not None and model_file:
        for g in shape_env.guards:  # torch._check(...) in the model: the guard carries the user's frame
            loc = g.sloc.framework_loc
            if not isinstance(loc, str) and loc is not None and _short(loc.filename) == _short(model_file) \
                    and any(isinstance(a, (sympy.Mod, FloorDiv)) or "Mod" in type(a).__name__
                            for a in sympy.preorder_traversal(g.expr)):
                return _loc_text(loc)
    for n in ep.graph.nodes:
        if n.op != "call_function":
            continue
        val = n.meta.get("val")
        sizes = list(getattr(val, "shape", ())) + ([val] if isinstance(val, torch.SymInt) else [])
        for s in sizes:
            if isinstance(s, torch.SymInt):
                e = _subst(sympy.sympify(s.node.expr), rename)
                if e.free_symbols and sympy.fraction(sympy.together(e))[1] != 1:
                    return _source(n, model_file)
    return None
