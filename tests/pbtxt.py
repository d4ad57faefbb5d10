"""A parser for the subset of protobuf text format that Triton model configurations use, to read generated
``config.pbtxt`` files in tests: ``key: scalar``, ``key { message }`` / ``key: { message }``, lists
``key [ a, b ]`` / ``key: [ ... ]`` of scalars or messages, ``# comments``. Scalars are ints, double-quoted
strings (with backslash escapes) and bare identifiers (enums, kept as str). A repeated key becomes a list.
Anything else is a ValueError naming the position, so a malformed file fails the test that reads it.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r'\s+|#[^\n]*|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<int>-?\d+)(?![\w.])|(?P<id>[A-Za-z_][\w.]*)'
                    r'|(?P<punct>[{}\[\]:,])')


def _tokens(text: str) -> list[tuple[str, object, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"pbtxt: unexpected character {text[pos]!r} at offset {pos}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "str":
            out.append(("scalar", re.sub(r"\\(.)", r"\1", m.group()[1:-1]), m.start()))
        elif kind == "int":
            out.append(("scalar", int(m.group()), m.start()))
        elif kind == "id":
            out.append(("id", m.group(), m.start()))
        elif kind == "punct":
            out.append((m.group(), m.group(), m.start()))
    return out


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> str | None:
        return self.toks[self.i][0] if self.i < len(self.toks) else None

    def take(self, kind: str):
        if self.peek() != kind:
            where = self.toks[self.i][2] if self.i < len(self.toks) else "end"
            raise ValueError(f"pbtxt: expected {kind!r} at offset {where}, got {self.peek()!r}")
        self.i += 1
        return self.toks[self.i - 1][1]

    def message(self, end: str | None) -> dict:
        fields: dict = {}
        while self.peek() != end:
            key = self.take("id")
            colon = self.peek() == ":"
            if colon:
                self.take(":")
            value = self.value(colon)
            if key in fields:
                prev = fields[key]
                fields[key] = (prev if isinstance(prev, list) else [prev]) + (value if isinstance(value, list)
                                                                             else [value])
            else:
                fields[key] = value
        return fields

    def value(self, after_colon: bool):
        kind = self.peek()
        if kind == "{":
            self.take("{")
            v = self.message("}")
            self.take("}")
            return v
        if kind == "[":
            self.take("[")
            items = []
            while self.peek() != "]":
                items.append(self.value(True))
                if self.peek() == ",":
                    self.take(",")
            self.take("]")
            return items
        if not after_colon:
            raise ValueError(f"pbtxt: a scalar needs 'key: value' (got {kind!r} without a colon)")
        if kind == "scalar":
            return self.take("scalar")
        return self.take("id")


def parse(text: str) -> dict:
    """The configuration as nested dicts and lists."""
    p = _Parser(text)
    return p.message(None)
