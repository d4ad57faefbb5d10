"""Package: pipeline results → Manifest + members → a `.tcpkg` archive (written by archive.py)."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch

from tcexport.formats import expr as ex
from tcexport.formats.abi import CPU_ENTRY, ISA_PLACEHOLDER, Interface, descriptor
from tcexport.formats.errors import FormatError
from tcexport.formats.manifest import (CPU_ABI_VERSION, CUDA_ABI_VERSION, FORMAT_VERSION, Cubin, CudaPlan, Guard,
                                       KernelBundle, Launch, Manifest, Symbol, TensorSpec)

from .archive import write_archive_digest
from .exprs import to_expr
from .training import training_interface, training_section

TCEXPORT_VERSION = "0.1.0"
WEIGHTS_FILE = "weights.safetensors"
CPP_SOURCE = "src/cpu/model.cpp"
TRITON_SOURCE = "src/cuda/model_triton.py"
KERNELS_TEXT = "src/kernels.txt"
ONNX_FILE = "model.onnx"


@dataclass
class Package:
    """A built package in memory: ``save(path)`` writes it atomically and deterministically."""

    manifest: Manifest
    members: dict
    timings: dict
    onnx: bytes | None = None  # the model as ONNX, when the export asked for it
    warnings: tuple = ()       # what export demanded and tcexport accepted (e.g. a divisibility guard)
    digest: str | None = None  # the package digest of the archive ``save`` wrote last (SPEC §7)

    def save(self, path, sign_key=None) -> Path:
        """Write the archive atomically; ``sign_key`` (an ed25519 private key: PEM path or bytes) signs it."""
        written, self.digest = write_archive_digest(Path(path), self.manifest, self.members, sign_key=sign_key)
        return written


def _weights_bytes(st) -> bytes:
    low, prog = st.lowering, st.program
    arrays = {low.public_names[name]: _weight_array(low.weight_values[name]) for name in prog.weights}
    return safetensors.numpy.save(arrays)


def _weight_specs(st) -> tuple:
    low, prog = st.lowering, st.program
    return tuple(TensorSpec(low.public_names[name], prog.buffers[name].dtype,
                            tuple(int(s) for s in low.weight_values[name].shape)) for name in prog.weights)


def interface(st) -> Interface:
    """What the package's CPU kernels are built for: computed once from the pipeline State, compiled into the
    library as its descriptor (codegen) and written into the manifest (``package``), so the two cannot differ
    unless something edits one of them afterwards (formats/abi.py)."""
    prog, low = st.program, st.lowering
    outputs = tuple(_spec(prog, low, n) for n in prog.outputs)
    return Interface(
        symbols=tuple(Symbol(s.name, s.min, s.max) for s in prog.symbols),
        inputs=tuple(_spec(prog, low, n) for n in prog.inputs), outputs=outputs,
        output_structure="single" if len(prog.outputs) == 1 and st.output_is_single else "tuple",
        guards=tuple(g.expr for g in _guards(st.captured.guards)), weights=_weight_specs(st),
        workspace_bytes=to_expr(st.memory.workspace_bytes), blas=tuple(st.blas),
        training=training_interface(st, outputs))


def _weight_array(t: torch.Tensor) -> np.ndarray:
    """A weight as a contiguous numpy array for safetensors. numpy has no bfloat16: its bits go in as
    ml_dtypes.bfloat16 (installed with onnx, an export dependency), which safetensors labels BF16."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return np.ascontiguousarray(t.view(torch.uint16).numpy()).view(ml_dtypes.bfloat16)
    return np.ascontiguousarray(t.numpy())


def _spec(prog, low, name) -> TensorSpec:
    buf = prog.buffers[name]
    return TensorSpec(low.public_names[name], buf.dtype, tuple(to_expr(s) for s in buf.shape))


def _peak_bytes(st):
    """Memory a call needs beyond inputs and weights: the planned workspace plus the outputs it returns."""
    from tcexport.exporter.schedule.memory import ITEMSIZE

    prog = st.program
    outputs = sum((prog.buffers[n].numel() * ITEMSIZE[prog.buffers[n].dtype] for n in prog.outputs), 0)
    return st.memory.workspace_bytes + outputs


def package(st, model_name: str, embed_onnx: bool = False) -> Package:
    from tcexport.exporter.cpu.build import ISA_LEVELS, LIBRARIES, compiler, compiler_version

    face = interface(st)
    members = {WEIGHTS_FILE: _weights_bytes(st), KERNELS_TEXT: "\n\n".join(str(k) for k in st.kernels).encode() + b"\n"}
    sources = [KERNELS_TEXT]
    if st.cpp:
        members[CPP_SOURCE] = st.cpp.encode()
        sources.insert(0, CPP_SOURCE)
    bundles = []
    for isa in ISA_LEVELS:
        if isa.name not in st.libraries:
            continue
        path = f"kernels/cpu-{isa.name}.so"
        members[path] = st.libraries[isa.name]
        bundles.append(KernelBundle(target="cpu", isa=isa.name, requires=tuple(isa.requires), file=path,
                                    abi=CPU_ABI_VERSION, entry=CPU_ENTRY, libraries=tuple(LIBRARIES),
                                    blas=tuple(st.blas)))
    cuda = None
    if st.triton is not None:
        members[TRITON_SOURCE] = st.triton.source.encode()
        sources.append(TRITON_SOURCE)
        cuda, cuda_bundles = _cuda(st, members)
        bundles = cuda_bundles + bundles
    onnx = None
    if embed_onnx and st.onnx is not None:
        members[ONNX_FILE] = st.onnx[0]
        onnx = {"file": ONNX_FILE, "opset": st.onnx[1]}
    training, training_sources = training_section(st, face.outputs, members)
    manifest = Manifest(
        format_version=FORMAT_VERSION,
        producer={"tcexport": TCEXPORT_VERSION, "torch": torch.__version__.split("+")[0],
                  "python": platform.python_version(),
                  **({"cxx": compiler_version(compiler())} if st.cpp else {})},
        model=model_name,
        symbols=face.symbols,
        inputs=face.inputs,
        outputs=face.outputs,
        output_structure=face.output_structure,
        guards=_guards(st.captured.guards),
        weights_file=WEIGHTS_FILE,
        weights=face.weights,
        kernels=tuple(bundles),
        workspace_bytes=face.workspace_bytes,
        plan={"kernels": [k.name for k in st.kernels],
              "workspace_bytes_without_reuse": to_expr(st.memory.naive_bytes),
              "peak_bytes": to_expr(_peak_bytes(st))},
        sources=tuple(sources + training_sources),
        onnx=onnx,
        cuda=cuda,
        training=training,
    )
    if st.cpp and st.descriptor != descriptor(Interface.of_manifest(manifest, tuple(st.blas)), ISA_PLACEHOLDER):
        raise FormatError("the manifest's interface differs from the one compiled into the kernel library (a "
                          "tcexport bug; please report it with the model)")
    return Package(manifest, members, dict(st.timings), st.onnx[0] if st.onnx else None,
                   tuple(st.captured.notes))


def _cuda(st, members: dict) -> tuple[CudaPlan, list[KernelBundle]]:
    """The launch list (shared by every arch) and one bundle of cubins per arch."""
    bundles = [KernelBundle(target=f"cuda:sm_{arch}", isa=f"sm_{arch}", requires=(), file=TRITON_SOURCE,
                            abi=CUDA_ABI_VERSION, entry="", libraries=("libcuda.so.1",), blas=(), cubins=files)
               for arch, files in cubin_members(st, members, "").items()]
    return cuda_launches(st), bundles


def cuda_launches(st) -> CudaPlan:
    """A graph's launch list in manifest form: each buffer parameter as the input, weight or output it is, or as
    a temp at its offset in the GPU's own memory plan."""
    from tcexport.exporter.cuda.build import triton_version

    prog = st.program
    where = {name: ("input", k) for k, name in enumerate(prog.inputs)}
    where |= {name: ("weight", k) for k, name in enumerate(prog.weights)}
    where |= {name: ("output", k) for k, name in enumerate(prog.outputs)}
    launches = []
    for launch in st.triton.launches:
        params = []
        for kind, value in launch.params:
            param = {"kind": kind, "value": value if kind != "error" else 0}
            if kind == "buffer":
                kind, index = where.get(value) or ("temp", to_expr(st.cuda_memory.offsets[value]))
                param = {"kind": kind, "value": index}
                if kind == "temp":
                    param["dtype"] = prog.buffers[value].dtype
            params.append(param)
        launches.append(Launch(launch.name, tuple(params), tuple(to_expr(g) for g in launch.grid),
                               dict(launch.constexprs), launch.num_warps, launch.num_stages, launch.index_bits))
    return CudaPlan(triton_version(), st.triton.index_bits, tuple(launches),
                    to_expr(st.cuda_memory.workspace_bytes), st.tuning)


def cubin_members(st, members: dict, folder: str) -> dict[int, tuple]:
    """Each arch's cubins, in launch order, added to ``members`` as ``kernels/cuda-sm_XX/<folder><kernel>.cubin``."""
    out = {}
    for arch, cubins in st.cubins.items():
        files = []
        for c in cubins:
            path = f"kernels/cuda-sm_{arch}/{folder}{c.kernel}.cubin"
            members[path] = c.data
            files.append(Cubin(c.kernel, path, c.function, c.shared, c.num_warps, c.dependent, c.global_scratch))
        out[arch] = tuple(files)
    return out


def _guards(guards) -> tuple:
    """Relations export found (capture's relations.Guard), in manifest form; duplicates dropped, order kept."""
    out, seen = [], set()
    for g in guards:
        e = to_expr(g.expr)
        key = ex.to_text(e) if not isinstance(e, int) else str(e)
        if e == 1 or key in seen:  # a relation sympy already proved true needs no check
            continue
        seen.add(key)
        out.append(Guard(e, g.message))
    return tuple(out)
