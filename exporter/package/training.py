"""The training graphs of a package built with ``--backward`` (SPEC §2a, §6b): a ``forward`` and a ``backward`` graph
from the pipeline's results, and with CUDA targets each one's launch list, Triton source and cubins (members of
their own, so their kernel names never meet the inference graph's)."""

from __future__ import annotations

from dataclasses import replace

from tcexport.formats.abi import BACKWARD_ENTRY, TRAIN_FORWARD_ENTRY
from tcexport.formats.graphs import BACKWARD, FORWARD, CpuPart, Graph, Training
from tcexport.formats.manifest import TensorSpec

from . import members as names
from .cuda import cuda_part
from .exprs import to_expr


def _spec(prog, buffer: str, name: str) -> TensorSpec:
    """The TensorSpec of ``prog``'s buffer under the name the manifest gives it."""
    buf = prog.buffers[buffer]
    return TensorSpec(name, buf.dtype, tuple(to_expr(d) for d in buf.shape))


def _cpu(entry: str, g) -> CpuPart:
    return CpuPart(entry, to_expr(g.memory.workspace_bytes), tuple(k.name for k in g.cpu_kernels))


def training_interface(r, outputs: tuple, inputs: tuple = ()) -> Training | None:
    """The training graphs without their CUDA parts: what the CPU library's training entries are built for (and
    what its interface descriptor pins); ``outputs`` are the manifest's output specs (the training forward returns
    them first), ``inputs`` its input specs (the forward's)."""
    if r.training is None:
        return None
    tg = r.training
    fw, bw = r.graphs[TRAIN_FORWARD_ENTRY], r.graphs[BACKWARD_ENTRY]
    saved = [f"saved.{k}" for k in range(len(fw.program.outputs) - tg.num_outputs)]
    fw_names = [s.name for s in outputs] + saved
    fw_outputs = tuple(_spec(fw.program, b, name) for b, name in zip(fw.program.outputs, fw_names))
    bw_inputs = tuple(_spec(bw.program, b, bw.lowering.public_names[b]) for b in bw.program.inputs)
    bw_outputs = tuple(_spec(bw.program, b, name) for b, (_, name) in zip(bw.program.outputs, tg.gradients))
    forward = Graph(FORWARD, tuple(inputs), fw_outputs, _cpu(TRAIN_FORWARD_ENTRY, fw))
    backward = Graph(BACKWARD, bw_inputs, bw_outputs, _cpu(BACKWARD_ENTRY, bw),
                     sources=tuple(tg.backward_sources), gradients=tuple(tg.gradients))
    return Training(tuple(tg.trainable), forward, backward)


def training_graphs(r, inputs: tuple, outputs: tuple, members: dict, cpu: bool) -> tuple[dict, list[str]]:
    """The ``forward`` and ``backward`` graphs (none without ``--backward``) and the source members they added to
    ``members``; ``cpu``: the package has CPU bundles (the graphs' CPU parts)."""
    training = training_interface(r, outputs, inputs)
    if training is None:
        return {}, []
    graphs, sources = {}, []
    for name, entry, g in ((FORWARD, TRAIN_FORWARD_ENTRY, training.forward),
                           (BACKWARD, BACKWARD_ENTRY, training.backward)):
        state = r.graphs[entry]
        cuda = None
        if state.cuda is not None:
            source = names.training_source(entry)
            members[source] = state.cuda.module.source.encode()
            sources.append(source)
            cuda = cuda_part(state, members, source, f"{entry}/")
        graphs[name] = replace(g, cpu=g.cpu if cpu else None, cuda=cuda)
    return graphs, sources
