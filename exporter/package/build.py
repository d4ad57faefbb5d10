"""The exporter's last stage: one export's manifest and member bytes (weights, sources, CPU libraries, CUDA
parts and cubins of each named graph, guards), handed to ``tcexport.packager.Package``, which writes
the archive."""

from __future__ import annotations

import platform

import torch

from tcexport.formats.abi import CPU_ENTRY, ISA_PLACEHOLDER, Interface, descriptor
from tcexport.formats.errors import FormatError
from tcexport.formats.graphs import INFERENCE, CpuPart, Graph
from tcexport.formats.manifest import (CPU_ABI_VERSION, GRAPHS_VERSION, METHODS_VERSION, STATE_VERSION, KernelBundle,
                                       Manifest, Method)
from tcexport.packager.package import Package

from .selfcheck import example_call
from tcexport.exporter.cpu.build import ISA_LEVELS, LIBRARIES, compiler, compiler_version
from tcexport.exporter.schedule.memory import ITEMSIZE

from . import members as names
from .cuda import cuda_bundles, cuda_part
from .exprs import to_expr
from .interface import guards, interface
from .methods import method_graphs, methods_list
from .state import state_file_bytes, state_pairs
from .training import training_graphs
from .weights import weights_bytes

TCEXPORT_VERSION = "0.1.0"


def package(r, model_name: str, embed_onnx: bool = False, model_info: tuple = (None, {})) -> Package:
    """The package of the pipeline's results ``r`` (pipeline.Results), named ``model_name``; ``embed_onnx`` stores the ONNX export
    in the archive too; ``model_info`` is the model's (version, metadata) for the manifest. Raises FormatError if
    the manifest's interface differs from the compiled-in one."""
    g, cpu = r.inference, r.cpu
    face = interface(r, cpu.blas if cpu else ())
    members = {names.WEIGHTS_FILE: weights_bytes(g),
               names.KERNELS_TEXT: "\n\n".join(str(k) for k in g.kernels).encode() + b"\n"}
    sources = [names.KERNELS_TEXT]
    if cpu:
        members[names.CPP_SOURCE] = cpu.source.encode()
        sources.insert(0, names.CPP_SOURCE)
    bundles = _cpu_bundles(cpu, members) if cpu else []
    cuda = None
    if g.cuda is not None:
        members[names.TRITON_SOURCE] = g.cuda.module.source.encode()
        sources.append(names.TRITON_SOURCE)
        cuda = cuda_part(g, members, names.TRITON_SOURCE, "", r.job.tuning)
        bundles = cuda_bundles(cuda) + bundles
    onnx = None
    if embed_onnx and r.onnx is not None:
        members[names.ONNX_FILE] = r.onnx[0]
        onnx = {"file": names.ONNX_FILE, "opset": r.onnx[1]}
    cpu_part = CpuPart(CPU_ENTRY, face.workspace_bytes, tuple(k.name for k in g.cpu_kernels)) \
        if any(b.target == "cpu" for b in bundles) else None
    graphs = {INFERENCE: Graph(INFERENCE, face.inputs, face.outputs, cpu_part, cuda)}
    training, training_sources = training_graphs(r, face.inputs, face.outputs, members, cpu=cpu_part is not None)
    graphs.update(training)
    later, method_sources = method_graphs(r, members, cpu=cpu_part is not None)
    graphs.update(later)
    state = state_pairs(g, face.inputs, face.outputs)
    state_bytes = state_file_bytes([x for x in r.graphs.values() if x.method is not None] or [g])
    if state_bytes is not None:
        members[names.STATE_FILE] = state_bytes
    methods = methods_list(r, Method(g.method, INFERENCE, face.symbols, face.output_structure,
                                     guards(g.captured.guards), state)) if g.method is not None else ()
    manifest = Manifest(
        # 1.10 only with methods, 1.9 only with state: a package without them keeps 1.8's bytes
        format_version=METHODS_VERSION if methods else STATE_VERSION if state else GRAPHS_VERSION,
        producer={"tcexport": TCEXPORT_VERSION, "torch": torch.__version__.split("+")[0],
                  "python": platform.python_version(),
                  **({"cxx": compiler_version(compiler())} if cpu else {})},
        model=model_name,
        symbols=face.symbols,
        inputs=face.inputs,
        outputs=face.outputs,
        output_structure=face.output_structure,
        guards=guards(g.captured.guards),
        weights_file=names.WEIGHTS_FILE,
        weights=face.weights,
        kernels=tuple(bundles),
        graphs=graphs,
        plan={"kernels": [k.name for k in g.cpu_kernels], "workspace_bytes": face.workspace_bytes,
              "workspace_bytes_without_reuse": to_expr(g.memory.naive_bytes),
              "peak_bytes": to_expr(_peak_bytes(g))},
        sources=tuple(sources + training_sources + method_sources),
        onnx=onnx,
        trainable=tuple(r.training.trainable) if r.training is not None else (),
        model_version=model_info[0],
        metadata=dict(model_info[1]),
        state=state,
        state_file=names.STATE_FILE if state_bytes is not None else None,
        methods=methods,
    )
    if cpu and cpu.descriptor != descriptor(Interface.of_manifest(manifest, cpu.blas), ISA_PLACEHOLDER):
        raise FormatError("the manifest's interface differs from the one compiled into the kernel library (a "
                          "tcexport bug; please report it with the model)")
    return Package(manifest, members, dict(r.timings), r.onnx[0] if r.onnx else None, tuple(g.captured.notes),
                   reference=g.captured.reference,
                   check=example_call(r.job.spec.example_inputs, {m.name: m.example_inputs for m in r.job.methods}))


def _cpu_bundles(cpu, members: dict) -> list[KernelBundle]:
    """One bundle per CPU ISA level built, fastest first (ISA_LEVELS' order), its library added to ``members``."""
    bundles = []
    for isa in ISA_LEVELS:
        if isa.name not in cpu.binaries:
            continue
        path = names.cpu_library(isa.name)
        members[path] = cpu.binaries[isa.name]
        bundles.append(KernelBundle(target="cpu", isa=isa.name, requires=tuple(isa.requires), file=path,
                                    abi=CPU_ABI_VERSION, entry=CPU_ENTRY, libraries=tuple(LIBRARIES),
                                    blas=cpu.blas))
    return bundles


def _peak_bytes(g):
    """Memory a call needs beyond inputs and weights: the planned workspace plus the outputs it returns."""
    prog = g.program
    outputs = sum((prog.buffers[n].numel() * ITEMSIZE[prog.buffers[n].dtype] for n in prog.outputs), 0)
    return g.memory.workspace_bytes + outputs
