"""The manifest's ``training`` section from a pipeline State built with ``--backward`` (SPEC §6b)."""

from __future__ import annotations

from tcexport.formats.manifest import TensorSpec
from tcexport.formats.training import Training, TrainingGraph

from .exprs import to_expr


def _spec(prog, buffer: str, name: str) -> TensorSpec:
    """The TensorSpec of ``prog``'s buffer under the name the manifest gives it."""
    buf = prog.buffers[buffer]
    return TensorSpec(name, buf.dtype, tuple(to_expr(d) for d in buf.shape))


def _graph(entry: str, g, inputs: tuple, outputs: tuple) -> TrainingGraph:
    return TrainingGraph(entry, inputs, outputs, to_expr(g.memory.workspace_bytes), tuple(k.name for k in g.kernels))


def training_section(st, outputs: tuple) -> Training | None:
    """``outputs`` are the manifest's output specs (the training forward returns them first)."""
    if st.training is None:
        return None
    from tcexport.exporter.autograd import BACKWARD_ENTRY, FORWARD_ENTRY

    tg = st.training
    fw, bw = st.train_states[FORWARD_ENTRY], st.train_states[BACKWARD_ENTRY]
    saved = [f"saved.{k}" for k in range(len(fw.program.outputs) - tg.num_outputs)]
    fw_names = [s.name for s in outputs] + saved
    fw_outputs = tuple(_spec(fw.program, b, name) for b, name in zip(fw.program.outputs, fw_names))
    bw_inputs = tuple(_spec(bw.program, b, bw.lowering.public_names[b]) for b in bw.program.inputs)
    bw_outputs = tuple(_spec(bw.program, b, name) for b, (_, name) in zip(bw.program.outputs, tg.gradients))
    return Training(tuple(tg.trainable), _graph(FORWARD_ENTRY, fw, (), fw_outputs),
                    _graph(BACKWARD_ENTRY, bw, bw_inputs, bw_outputs), tuple(tg.backward_sources),
                    tuple(tg.gradients))
