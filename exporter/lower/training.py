"""Lowering of the training graphs: ``lower`` with core.TRAINING_RULES (the inference rules plus those of grad.py
and grad_conv.py), and the weights every entry point shares."""

from __future__ import annotations

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.front.capture import Captured
from tcexport.exporter.lower.context import Lowering
from tcexport.exporter.lower.core import TRAINING_RULES, lower


def lower_training(captured: Captured) -> tuple[ir.Program, Lowering]:
    """``lower`` with the training rules: the lowering of a training forward or backward graph."""
    return lower(captured, TRAINING_RULES)


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
