"""The deterministic archive writer: a ``Package`` (manifest + member bytes, as the exporter built them) →
a `.tcpkg` file (archive.py; formats/SPEC.md). It imports only formats/: no torch, sympy or exporter."""

from .package import Package

__all__ = ["Package"]
