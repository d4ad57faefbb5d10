"""The compiler: capture → lower → fuse → plan → codegen → build. ``export()`` is the Python entry point."""

from tcexport.exporter.pipeline import export

__all__ = ["export"]
