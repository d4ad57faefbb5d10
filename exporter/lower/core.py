"""Lowering's entry: the rule table of each pipeline, composed explicitly, and ``lower(captured, rules)``.

    INFERENCE_RULES   ops, reduce, conv, create, index, layout    every graph of an inference export
    TRAINING_RULES    INFERENCE_RULES + grad, grad_conv           the training forward and backward graphs

A pipeline passes its table as a value; nothing is registered by importing a module, so lowering an op gives the
same IR whatever was exported before in this process. Next: schedule/fuse.py turns the Program into kernels.
"""

from __future__ import annotations

from tcexport.exporter.front.capture import Captured
from tcexport.exporter.ir import loops as ir
from tcexport.exporter.lower import conv, create, grad, grad_conv, index, layout, ops, reduce
from tcexport.exporter.lower.context import Lowering
from tcexport.exporter.lower.rules import RuleTable, compose

INFERENCE_RULES = compose("inference", ops.RULES, reduce.RULES, conv.RULES, create.RULES, index.RULES,
                          layout.RULES)
TRAINING_RULES = compose("training", INFERENCE_RULES, grad.RULES, grad_conv.RULES)


def lower(captured: Captured, rules: RuleTable) -> tuple[ir.Program, Lowering]:
    """``captured``'s graph as a loop-IR Program (dead nodes removed, symbols with their ranges), and the
    Lowering that built it (public names and weight values, which packaging reads)."""
    low = Lowering(captured, rules)
    prog = low.run()
    prog.symbols = [ir.SymbolInfo(s.name, s.min, s.max) for s in captured.symbols.values()]
    return prog, low


def lower_inference(captured: Captured) -> tuple[ir.Program, Lowering]:
    """``lower`` with the inference rules: the lowering of an inference graph."""
    return lower(captured, INFERENCE_RULES)
