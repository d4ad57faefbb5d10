"""Lowering of the training graphs: the inference lowering, plus what graphs with many outputs need.

An inference graph's outputs are its last values; a training forward's saved activations are outputs that later
nodes still read, a GEMM among them. ``Lowering.finish_outputs`` renames an output's buffer in every node body
but not in a GEMM's operands, so those are renamed here as well.
"""

from __future__ import annotations

from dataclasses import replace

from . import ir
from .capture import Captured
from .lower import Lowering


class TrainingLowering(Lowering):
    def finish_outputs(self, node, env) -> list[str]:
        before = dict(self.buffers)
        names = super().finish_outputs(node, env)
        renamed = {old: buf.name for old, buf in before.items() if buf.name != old}
        for n in self.nodes:
            if n.gemm is not None and (n.gemm.a.buffer in renamed or n.gemm.b.buffer in renamed):
                a, b = n.gemm.a, n.gemm.b
                n.gemm = replace(n.gemm, a=replace(a, buffer=renamed.get(a.buffer, a.buffer)),
                                 b=replace(b, buffer=renamed.get(b.buffer, b.buffer)))
        return names


def lower_training(captured: Captured) -> tuple[ir.Program, Lowering]:
    """``lower.lower`` for a training forward or backward."""
    from . import lower_conv, lower_create, lower_grad, lower_index, lower_layout, lower_ops, lower_reduce  # noqa: F401

    low = TrainingLowering(captured)
    prog = low.run()
    prog.symbols = [ir.SymbolInfo(s.name, s.min, s.max) for s in captured.symbols.values()]
    return prog, low


def share_weights(inference, graphs: list) -> None:
    """One weights array serves every entry point (manifest order): the inference graph's weights, then those
    only a training graph reads. These join the inference program as weights its kernels never read (so the
    packager writes them), and each training program takes the whole list, so its entry indexes the same array.
    ``inference`` and ``graphs`` are pipeline States after planning."""
    main, low = inference.program, inference.lowering
    for g in graphs:
        for name in g.program.weights:
            if name not in main.weights:
                main.weights.append(name)
                main.buffers[name] = g.program.buffers[name]
                low.weight_values[name] = g.lowering.weight_values[name]
                low.public_names[name] = g.lowering.public_names[name]
    for g in graphs:
        g.program.weights = list(main.weights)
