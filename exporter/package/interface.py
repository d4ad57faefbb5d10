"""What the package's CPU kernels are built for (formats/abi.py's ``Interface``), computed once from the
pipeline's results: the C++ codegen stage compiles it into the library as its descriptor and ``build.package``
writes it into the manifest, so the two cannot differ unless something edits one of them afterwards."""

from __future__ import annotations

from tcexport.formats import expr as ex
from tcexport.formats.abi import Interface, MethodInterface
from tcexport.formats.manifest import Guard, Symbol, TensorSpec

from .exprs import to_expr
from .training import training_interface
from .weights import weight_specs


def interface(r, blas: tuple) -> Interface:
    """The symbols, inputs, outputs, guards, weights, workspace, BLAS routines, training entries and methods of the
    pipeline's results ``r``, for a library calling ``blas``."""
    g = r.inference
    face = graph_interface(g)
    methods = tuple(graph_interface(m) for m in r.graphs.values() if m.method is not None and m is not g)
    return Interface(
        symbols=face.symbols, inputs=face.inputs, outputs=face.outputs, output_structure=face.output_structure,
        guards=face.guards, weights=weight_specs(g), workspace_bytes=face.workspace_bytes, blas=tuple(blas),
        training=training_interface(r, face.outputs), methods=methods)


def graph_interface(g) -> MethodInterface:
    """One graph's own part of the interface (its symbols, inputs, outputs, guards, workspace): the package's top
    level for the first graph, a method's entry for each later method."""
    prog, low = g.program, g.lowering
    single = g.captured.program.call_spec.out_spec.is_leaf()
    return MethodInterface(
        name=g.method or g.name, entry=g.entry if g.method is not None else g.name,
        symbols=tuple(Symbol(s.name, s.min, s.max) for s in prog.symbols),
        inputs=tuple(_spec(prog, low, n) for n in prog.inputs), outputs=tuple(_spec(prog, low, n) for n in prog.outputs),
        output_structure="single" if len(prog.outputs) - len(g.captured.state) == 1 and single else "tuple",
        guards=tuple(x.expr for x in guards(g.captured.guards)), workspace_bytes=to_expr(g.memory.workspace_bytes))


def guards(found) -> tuple:
    """Relations export found (capture's relations.Guard), in manifest form; duplicates dropped, order kept."""
    out, seen = [], set()
    for g in found:
        e = to_expr(g.expr)
        key = ex.to_text(e) if not isinstance(e, int) else str(e)
        if e == 1 or key in seen:  # a relation sympy already proved true needs no check
            continue
        seen.add(key)
        out.append(Guard(e, g.message))
    return tuple(out)


def _spec(prog, low, name) -> TensorSpec:
    buf = prog.buffers[name]
    return TensorSpec(low.public_names[name], buf.dtype, tuple(to_expr(s) for s in buf.shape))
