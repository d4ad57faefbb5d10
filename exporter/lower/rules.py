"""Rule tables: which function lowers which op, as values a pipeline composes (no global registry).

Each rule module owns one ``RuleTable`` and fills it with ``@RULES.rule(op, ...)`` as its functions are defined;
core.py composes the modules' tables into one table per pipeline (inference; training = inference + gradient
rules) and hands it to the lowering walk (context.Lowering). An op that two composed tables define is an error,
so which rule lowers an op never depends on which modules happen to have been imported.
"""

from __future__ import annotations

from typing import Callable

from tcexport.exporter.errors import DuplicateRuleError


def _op_name(op) -> str:
    name = getattr(op, "__name__", str(op))
    ns = getattr(op, "namespace", None)
    return f"{ns}.{name}" if ns else str(op)


class RuleTable:
    """Op (an OpOverload or OpOverloadPacket) -> rule; ``module`` names where each rule is defined, for errors.
    A composed table is frozen: only a rule module adds rules, and only to its own table."""

    def __init__(self, module: str):
        self.module = module
        self._rules: dict = {}
        self._origin: dict = {}   # op -> the module that defined its rule
        self._frozen = False

    def rule(self, *ops) -> Callable:
        """Decorator: ``fn`` lowers each of ``ops``."""
        def deco(fn):
            for op in ops:
                self._add(op, fn, self.module)
            return fn
        return deco

    def _add(self, op, fn, module: str) -> None:
        if self._frozen:
            raise TypeError(f"rule table {self.module} is composed and frozen; add {_op_name(op)}'s rule to the "
                            f"table of the module that defines it")
        if op in self._rules:
            raise DuplicateRuleError(
                f"op {_op_name(op)} has a lowering rule in {self._origin[op]} and another in {module}; one "
                f"pipeline's table takes one rule per op: remove one of them",
                op=_op_name(op), modules=(self._origin[op], module))
        self._rules[op] = fn
        self._origin[op] = module

    def lookup(self, target) -> Callable | None:
        """The rule for ``target``: one for the overload itself, else one for its overload packet."""
        rule = self._rules.get(target)
        if rule is None and hasattr(target, "overloadpacket"):
            rule = self._rules.get(target.overloadpacket)
        return rule

    def origin(self, op) -> str | None:
        """The module whose rule lowers ``op`` in this table."""
        return self._origin.get(op)

    def __contains__(self, op) -> bool:
        return op in self._rules

    def __len__(self) -> int:
        return len(self._rules)


def compose(name: str, *tables: RuleTable) -> RuleTable:
    """One frozen table holding every rule of ``tables``; raises DuplicateRuleError (naming the op and both
    modules) when two of them define the same op."""
    out = RuleTable(name)
    for table in tables:
        for op, fn in table._rules.items():
            out._add(op, fn, table._origin[op])
    out._frozen = True
    return out
