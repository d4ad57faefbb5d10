"""The manifest's ``training`` section from a pipeline State built with ``--backward`` (SPEC §6b), and with CUDA
targets each training graph's launch list, Triton source and cubins (members of their own, so their kernel
names never meet the inference graph's)."""

from __future__ import annotations

from dataclasses import replace

from tcexport.formats.abi import BACKWARD_ENTRY, TRAIN_FORWARD_ENTRY
from tcexport.formats.manifest import TensorSpec
from tcexport.formats.training import GraphCuda, Training, TrainingGraph

from . import members as names
from .cuda import cubin_members, cuda_launches
from .exprs import to_expr


def _spec(prog, buffer: str, name: str) -> TensorSpec:
    """The TensorSpec of ``prog``'s buffer under the name the manifest gives it."""
    buf = prog.buffers[buffer]
    return TensorSpec(name, buf.dtype, tuple(to_expr(d) for d in buf.shape))


def _graph(entry: str, g, inputs: tuple, outputs: tuple) -> TrainingGraph:
    return TrainingGraph(entry, inputs, outputs, to_expr(g.memory.workspace_bytes), tuple(k.name for k in g.kernels))


def training_interface(r, outputs: tuple) -> Training | None:
    """The section without its CUDA kernels: what the CPU library's training entries are built for (and what its
    interface descriptor pins); ``outputs`` are the manifest's output specs (the training forward returns them
    first)."""
    if r.training is None:
        return None
    tg = r.training
    fw, bw = r.graphs[TRAIN_FORWARD_ENTRY], r.graphs[BACKWARD_ENTRY]
    saved = [f"saved.{k}" for k in range(len(fw.program.outputs) - tg.num_outputs)]
    fw_names = [s.name for s in outputs] + saved
    fw_outputs = tuple(_spec(fw.program, b, name) for b, name in zip(fw.program.outputs, fw_names))
    bw_inputs = tuple(_spec(bw.program, b, bw.lowering.public_names[b]) for b in bw.program.inputs)
    bw_outputs = tuple(_spec(bw.program, b, name) for b, (_, name) in zip(bw.program.outputs, tg.gradients))
    forward = _graph(TRAIN_FORWARD_ENTRY, fw, (), fw_outputs)
    backward = _graph(BACKWARD_ENTRY, bw, bw_inputs, bw_outputs)
    return Training(tuple(tg.trainable), forward, backward, tuple(tg.backward_sources), tuple(tg.gradients))


def training_section(r, outputs: tuple, members: dict) -> tuple[Training | None, list[str]]:
    """The section and the source members it added to ``members``."""
    training = training_interface(r, outputs)
    if training is None:
        return None, []
    fw, bw = r.graphs[TRAIN_FORWARD_ENTRY], r.graphs[BACKWARD_ENTRY]
    if fw.cuda is None:
        return training, []
    forward = replace(training.forward, cuda=_cuda(TRAIN_FORWARD_ENTRY, fw, members))
    backward = replace(training.backward, cuda=_cuda(BACKWARD_ENTRY, bw, members))
    return replace(training, forward=forward, backward=backward), [forward.cuda.source, backward.cuda.source]


def _cuda(entry: str, g, members: dict) -> GraphCuda:
    """``g``'s launch list (made as the inference one is, over its own inputs, weights and outputs), with its
    Triton source under ``src/cuda/training/`` and its cubins under ``kernels/cuda-sm_XX/<entry>/``."""
    plan = cuda_launches(g)
    source = names.training_source(entry)
    members[source] = g.cuda.module.source.encode()
    cubins = {f"sm_{arch}": files for arch, files in cubin_members(g, members, f"{entry}/").items()}
    return GraphCuda(source, g.cuda.module.index_bits, plan.workspace_bytes, plan.launches, cubins)
