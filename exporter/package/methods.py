"""A package's methods (SPEC §2c) from the pipeline's results: one graph per method after the first (its CPU
entry, its launch list, Triton source and cubins under a folder of its own) and the manifest's ``methods`` list.
The first method is the package's ``inference`` graph and top level, written as for any package."""

from __future__ import annotations

from tcexport.formats.graphs import CpuPart, Graph
from tcexport.formats.manifest import Method

from . import members as names
from .cuda import cuda_part
from .interface import graph_interface, guards
from .state import state_pairs


def method_graphs(r, members: dict, cpu: bool) -> tuple[dict, list[str]]:
    """Each later method's graph by name, and the source members they added to ``members``; ``cpu``: the package
    has CPU bundles (the graphs' CPU parts)."""
    graphs, sources = {}, []
    for g in _later(r):
        face = graph_interface(g)
        part = CpuPart(face.entry, face.workspace_bytes, tuple(k.name for k in g.cpu_kernels)) if cpu else None
        cuda = None
        if g.cuda is not None:
            source = names.method_source(g.method)
            members[source] = g.cuda.module.source.encode()
            sources.append(source)
            cuda = cuda_part(g, members, source, names.method_cubins(g.method))
        graphs[g.name] = Graph(g.name, face.inputs, face.outputs, part, cuda)
    return graphs, sources


def methods_list(r, first: Method) -> tuple:
    """The manifest's methods: ``first`` (the top level's), then each later one with its own interface and state."""
    out = [first]
    for g in _later(r):
        face = graph_interface(g)
        out.append(Method(g.method, g.name, face.symbols, face.output_structure, guards(g.captured.guards),
                          state_pairs(g, face.inputs, face.outputs)))
    return tuple(out)


def _later(r) -> list:
    return [g for g in r.graphs.values() if g.method is not None and g is not r.inference]
