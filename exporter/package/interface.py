"""What the package's CPU kernels are built for (formats/abi.py's ``Interface``), computed once from the
pipeline's results: the C++ codegen stage compiles it into the library as its descriptor and ``build.package``
writes it into the manifest, so the two cannot differ unless something edits one of them afterwards."""

from __future__ import annotations

from tcexport.formats import expr as ex
from tcexport.formats.abi import Interface
from tcexport.formats.manifest import Guard, Symbol, TensorSpec

from .exprs import to_expr
from .training import training_interface
from .weights import weight_specs


def interface(r, blas: tuple) -> Interface:
    """The symbols, inputs, outputs, guards, weights, workspace, BLAS routines and training entries of the
    pipeline's results ``r``, for a library calling ``blas``."""
    g = r.inference
    prog, low = g.program, g.lowering
    single = g.captured.program.call_spec.out_spec.is_leaf()
    outputs = tuple(_spec(prog, low, n) for n in prog.outputs)
    return Interface(
        symbols=tuple(Symbol(s.name, s.min, s.max) for s in prog.symbols),
        inputs=tuple(_spec(prog, low, n) for n in prog.inputs), outputs=outputs,
        output_structure="single" if len(prog.outputs) - len(g.captured.state) == 1 and single else "tuple",
        guards=tuple(g.expr for g in guards(g.captured.guards)), weights=weight_specs(g),
        workspace_bytes=to_expr(g.memory.workspace_bytes), blas=tuple(blas),
        training=training_interface(r, outputs))


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
