"""Bind the shape symbols from a call's inputs and check every guard before any kernel runs.

The order is fixed (formats/SPEC.md, "Guards"): arity, rank, dtype, static dims, symbol binding
(first bare occurrence binds, later ones must agree), symbol ranges, derived dims, relation guards.
The first failure raises a typed GuardError naming the input, dim and symbol, what was allowed, what
came, and how to fix it. ``GuardPlan`` does the analysis once per manifest, so a call only runs
flat loops over small tuples; ``SignatureCache`` remembers what a full check concluded for a set of input
shapes, so a call with shapes seen before costs a dtype check and one dict lookup.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.errors import (ArityError, DtypeError, FormatError, RankError, RelationError,
                                     StaticDimError, SymbolConflictError, SymbolRangeError)
from tcexport.formats.manifest import Manifest

from .dtypes import dtype_name, numpy_dtype


@dataclass(frozen=True)
class _Derived:
    """A dim given by a compound expression; ``solves`` names the symbol it binds, if no bare dim does."""
    input: str
    index: int
    dim: int
    expr: object
    solves: str | None


class GuardPlan:
    """The checks of one manifest, precomputed; ``check(arrays)`` returns the bound symbol values."""

    def __init__(self, manifest: Manifest):
        self.manifest = manifest
        self.names = tuple(s.name for s in manifest.inputs)
        self.ranks = tuple(len(s.shape) for s in manifest.inputs)
        self.dtypes = tuple(s.dtype for s in manifest.inputs)
        # fast path: plain (untagged, native-order) numpy dtypes compare directly; bfloat16 takes the slow path
        self._plain = tuple(None if d == "bfloat16" else numpy_dtype(d) for d in self.dtypes)
        # per input, the dtype object whose identity alone passes the dtype guard (None: only the full check can say)
        self.exact_dtypes = tuple(self._exact_dtype(k) for k in range(len(self.dtypes)))
        self.shape_key = _compile_shape_key(self.exact_dtypes)
        self.ranges = {s.name: (s.min, s.max) for s in manifest.symbols}
        self.static: list[tuple[int, int, int]] = []     # (input index, dim, size)
        self.binders: list[tuple[int, int, str]] = []     # (input index, dim, symbol), in binding order
        self.derived: list[_Derived] = []
        self._plan_dims(manifest)

    def _plan_dims(self, manifest: Manifest) -> None:
        bare = set()
        compound = []
        for i, spec in enumerate(manifest.inputs):
            for d, entry in enumerate(spec.shape):
                if isinstance(entry, int):
                    self.static.append((i, d, entry))
                elif isinstance(entry, str):
                    self.binders.append((i, d, entry))
                    bare.add(entry)
                else:
                    compound.append((i, d, entry))
        solvable = set(bare)
        for i, d, entry in compound:
            unbound = ex.free_symbols(entry) - solvable
            solves = next(iter(unbound)) if len(unbound) == 1 else None
            if solves:
                solvable.add(solves)
            self.derived.append(_Derived(self.names[i], i, d, entry, solves))
        missing = sorted(set(self.ranges) - solvable)
        if missing:
            raise FormatError(f"manifest: symbol(s) {missing} occur in no input shape the loader can bind them from; "
                              f"every symbol must be an input dim or derivable from one. Rebuild the package.")

    # -- per call -------------------------------------------------------------------------------------

    def check(self, arrays: list[np.ndarray]) -> dict[str, int]:
        """Run every check in SPEC order; return symbol name -> value."""
        self._check_arity(arrays)
        self._check_ranks(arrays)
        self._check_dtypes(arrays)
        self._check_static(arrays)
        env, where = self._bind(arrays)
        self._check_ranges(env, where)
        self._check_derived(arrays, env, where)
        self._check_relations(env, where)
        return env

    def _check_arity(self, arrays) -> None:
        if len(arrays) != len(self.names):
            raise ArityError(
                f"model {self.manifest.model!r} takes {len(self.names)} input(s) ({', '.join(self.names)}), "
                f"got {len(arrays)}. Pass exactly these inputs, positionally or by name.",
                expected=len(self.names), got=len(arrays), rule="arity")

    def _check_ranks(self, arrays) -> None:
        for name, rank, spec, arr in zip(self.names, self.ranks, self.manifest.inputs, arrays):
            if arr.ndim != rank:
                raise RankError(
                    f"input {name!r}: expected {rank} dimension(s) {spec.shape_text()}, got {arr.ndim} "
                    f"with shape {list(arr.shape)}. Reshape the input to rank {rank}.",
                    input=name, expected=rank, got=arr.ndim, rule="rank")

    def _exact_dtype(self, k: int) -> np.dtype | None:
        """The loader's dtype object for input k, if the dtype guard accepts it: then ``arr.dtype is`` that object
        passes the guard exactly as the full rule would (the rule is a function of the dtype object alone)."""
        dtype = numpy_dtype(self.dtypes[k])
        return dtype if self._dtype_passes(k, dtype) else None

    def _dtype_passes(self, k: int, dtype: np.dtype) -> bool:
        plain = self._plain[k]
        if plain is not None and dtype == plain and dtype.metadata is None and dtype.isnative:
            return True
        return dtype_name(dtype) == self.dtypes[k] and dtype.isnative

    def _check_dtypes(self, arrays) -> None:
        for k, (name, dtype, arr) in enumerate(zip(self.names, self.dtypes, arrays)):
            if self._dtype_passes(k, arr.dtype):
                continue
            got = dtype_name(arr.dtype)
            shown = got if arr.dtype.isnative else f"{got} (non-native byte order)"
            raise DtypeError(
                f"input {name!r}: expected dtype {dtype}, got {shown}. The loader never casts; "
                f"convert it yourself, e.g. x.astype('{dtype}') or tensor.to(torch.{dtype}).",
                input=name, expected=dtype, got=shown, rule="dtype")

    def _check_static(self, arrays) -> None:
        for i, d, size in self.static:
            got = arrays[i].shape[d]
            if got != size:
                name = self.names[i]
                raise StaticDimError(
                    f"input {name!r} dim {d}: the package was built for size {size} (static), got {got} "
                    f"(shape {list(arrays[i].shape)}). Pass size {size}, or re-export with this dim "
                    f"marked dynamic (--dynamic NAME@{name}.{d}).",
                    input=name, dim=d, expected=size, got=got, rule="static")

    def _bind(self, arrays) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
        """First bare occurrence binds a symbol; later bare occurrences must agree."""
        env: dict[str, int] = {}
        where: dict[str, tuple[str, int]] = {}
        for i, d, sym in self.binders:
            got = arrays[i].shape[d]
            if sym not in env:
                env[sym], where[sym] = got, (self.names[i], d)
            elif env[sym] != got:
                first, fd = where[sym]
                raise SymbolConflictError(
                    f"input {self.names[i]!r} dim {d} is {got}, but symbol {sym!r} was bound to {env[sym]} by "
                    f"input {first!r} dim {fd}; these dims must be equal. Pass inputs whose dims agree.",
                    input=self.names[i], dim=d, symbol=sym, expected=env[sym], got=got, rule=f"{sym} == {sym}")
        for dv in self.derived:
            if dv.solves:
                self._solve(dv, arrays[dv.index].shape[dv.dim], env, where)
        return env, where

    def _solve(self, dv: _Derived, got: int, env: dict, where: dict) -> None:
        """Bind the one unbound symbol of an affine dim like 2*s or s+1; _check_derived verifies it."""
        try:
            b = ex.evaluate(dv.expr, {**env, dv.solves: 0})
            a = ex.evaluate(dv.expr, {**env, dv.solves: 1}) - b
        except FormatError:
            a, b = 0, 0
        env[dv.solves] = (got - b) // a if a else got
        where[dv.solves] = (dv.input, dv.dim)

    def _check_ranges(self, env: dict[str, int], where: dict) -> None:
        for sym, value in env.items():
            lo, hi = self.ranges[sym]
            if value < lo or (hi is not None and value > hi):
                name, d = where[sym]
                allowed = f"{lo}..{hi if hi is not None else 'inf'}"
                raise SymbolRangeError(
                    f"input {name!r} dim {d} (symbol {sym!r}): got {value}, allowed {allowed}. Pass a size "
                    f"in {allowed}, or re-export with a wider range (--dynamic {sym}={lo}:N).",
                    input=name, dim=d, symbol=sym, expected=(lo, hi), got=value, rule=f"{lo} <= {sym}"
                    + (f" <= {hi}" if hi is not None else ""))

    def _check_derived(self, arrays, env: dict[str, int], where: dict) -> None:
        for dv in self.derived:
            got = arrays[dv.index].shape[dv.dim]
            want = _evaluate_or_none(dv.expr, env)
            if want != got:
                text = ex.to_text(dv.expr)
                bound = ", ".join(f"{s}={env[s]} from input {where[s][0]!r} dim {where[s][1]}"
                                  for s in sorted(ex.free_symbols(dv.expr)) if s in env)
                raise SymbolConflictError(
                    f"input {dv.input!r} dim {dv.dim} must equal {text} = {want} ({bound}), got {got}. "
                    f"Pass inputs whose dims satisfy {text}.",
                    input=dv.input, dim=dv.dim, symbol=dv.solves, expected=want, got=got, rule=text)

    def _check_relations(self, env: dict[str, int], where: dict) -> None:
        for guard in self.manifest.guards:
            if _evaluate_or_none(guard.expr, env) != 1:
                self._relation_error(guard, env, where)

    def _relation_error(self, guard, env: dict[str, int], where: dict):
        """Name the rule, where each of its symbols came from, and (for one symbol) the nearest sizes that pass."""
        text = ex.to_text(guard.expr)
        syms = sorted(ex.free_symbols(guard.expr))
        values = ", ".join(f"{s}={env[s]} from input {where[s][0]!r} dim {where[s][1]}" for s in syms)
        fix = "Pass inputs that satisfy it."
        if len(syms) == 1:
            near = self._nearest_passing(guard.expr, syms[0], env)
            if near:
                fix = f"Pass {syms[0]} = {' or '.join(map(str, near))} instead."
        name, dim = where[syms[0]] if len(syms) == 1 else (None, None)
        raise RelationError(
            f"{guard.message}: guard {text} does not hold for {values or 'these inputs'}. {fix}",
            input=name, dim=dim, symbol=syms[0] if len(syms) == 1 else None, expected=text,
            got={s: env[s] for s in syms}, rule=text)

    def _nearest_passing(self, expr, sym: str, env: dict[str, int], reach: int = 64) -> list[int]:
        lo, hi = self.ranges[sym]
        value, out = env[sym], []
        for step in range(1, reach + 1):
            for v in (value - step, value + step):
                if v >= lo and (hi is None or v <= hi) and _evaluate_or_none(expr, {**env, sym: v}) == 1:
                    out.append(v)
            if out:
                return out
        return out


def _evaluate_or_none(expr, env) -> int | None:
    """A guard whose arithmetic fails (division by zero for these sizes) does not hold."""
    try:
        return ex.evaluate(expr, env)
    except FormatError:
        return None


def _compile_shape_key(exact: tuple) -> Callable[[list], tuple | None]:
    """One closure for the per-call fast check: the inputs' shapes (the cache key) when there are as many
    inputs as the plan has and each dtype is the exact expected object; None sends the call to the full check.
    Specialised for one input, the common case, to skip the loop."""
    n = len(exact)
    if n == 1 and exact[0] is not None:
        (want,) = exact

        def one(arrays) -> tuple | None:
            if len(arrays) == 1 and arrays[0].dtype is want:
                return (arrays[0].shape,)
            return None
        return one

    def many(arrays) -> tuple | None:
        if len(arrays) != n:
            return None
        for a, want in zip(arrays, exact):
            if want is None or a.dtype is not want:
                return None
        return tuple([a.shape for a in arrays])
    return many


SIGNATURE_CACHE_SIZE = 64


class SignatureCache:
    """What a full guard check concluded for one set of input shapes (``make(env)``: bound symbols, output
    shapes, workspace size...), kept so that a call repeating a signature skips binding and range checks.

    Safe by construction: every rule after arity and dtype (rank, static dims, symbol binding, ranges, derived
    dims, relations) is a function of the input shapes alone, and the key is all of them; arity and dtype are
    checked on every call, by ``GuardPlan.shape_key`` (the exact dtype objects) or by the full check. A key is
    stored only after a full check passed for it. Bounded (oldest signature evicted first); reads take no lock,
    inserts take one, so concurrent calls stay safe.
    """

    def __init__(self, plan: GuardPlan, make: Callable[[dict], object], size: int = SIGNATURE_CACHE_SIZE):
        if size < 1:
            raise ValueError(f"SignatureCache size should be >= 1, got {size}")
        self._plan, self._make, self._size = plan, make, size
        self._entries: dict = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, arrays) -> object:
        """The entry for these inputs; raises the guard's typed error if they break a guard."""
        key = self._plan.shape_key(arrays)
        if key is not None:
            entry = self._entries.get(key)
            if entry is not None:
                return entry
            env = self._plan.check(arrays)
        else:
            env = self._plan.check(arrays)  # dtypes the fast check cannot vouch for: the full rule, every call
            key = tuple(a.shape for a in arrays)
            entry = self._entries.get(key)
            if entry is not None:
                return entry
        return self._insert(key, self._make(env))

    def _insert(self, key: tuple, entry: object) -> object:
        with self._lock:
            if key not in self._entries and len(self._entries) >= self._size:
                del self._entries[next(iter(self._entries))]
            return self._entries.setdefault(key, entry)


def bind_and_check(manifest: Manifest, arrays: list[np.ndarray]) -> dict[str, int]:
    """One-shot form of ``GuardPlan(manifest).check(arrays)``; models keep a GuardPlan instead."""
    return GuardPlan(manifest).check(arrays)
