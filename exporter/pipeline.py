"""The pipeline as a visible list of named stages; each can be dumped for debugging (``--dump DIR``).

    capture → (autograd) → lower → fuse → plan → codegen → build (C++, .so)
                                            → schedule_cuda → codegen_triton → build_cuda (cubins) → package

A stage whose target is not requested is skipped: ``--target cuda:sm_90`` alone builds no C++. With
``--backward`` the autograd stage adds a training forward and a backward graph (``State.train_states``); lower,
fuse and plan then run on each graph in turn, the C++ holds one entry point per graph, and for CUDA targets each
training graph gets its own Triton module and cubins.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tcexport.exporter.cpu import build as build_mod
from tcexport.exporter.front import capture as capture_mod
from tcexport.exporter.cpu import codegen as codegen_cpp
from tcexport.exporter.cuda import module as codegen_triton
from tcexport.exporter.schedule import fuse as fuse_mod
from tcexport.exporter.lower import core as lower_mod
from tcexport.exporter.schedule import memory as plan_mod
from tcexport.exporter.errors import ExportError, output_error
from tcexport.exporter.front.model_file import ModelSpec, forward_input_names
from tcexport.exporter.options import CudaOptions

TARGET_HELP = "cpu, cuda:sm_XX or a comma-separated list, e.g. cpu,cuda:sm_80,sm_90"


@dataclass
class State:
    """Everything the stages produce, in order; a stage reads earlier fields and fills its own."""

    spec: ModelSpec
    dynamic: list
    targets: tuple
    cache_dir: Path | None = None
    captured: object = None
    program: object = None
    lowering: object = None
    kernels: list = field(default_factory=list)
    memory: object = None
    blas: list = field(default_factory=list)
    cpp: str = ""
    descriptor: bytes = b""                           # the interface compiled into the library (formats/abi.py)
    libraries: dict = field(default_factory=dict)
    triton: object = None                             # codegen_triton.TritonModule
    cuda_kernels: list = field(default_factory=list)  # the GPU's kernel list (attention fused: fuse_attention.py)
    cuda_memory: object = None                        # its memory plan (no scores or probabilities)
    cubins: dict = field(default_factory=dict)        # arch -> [build_cuda.Cubin] in launch order
    build_cubins: bool = True                         # False: Triton source only (runs in the interpreter)
    timings: dict = field(default_factory=dict)
    output_is_single: bool = True
    onnx: tuple | None = None  # (bytes, opset) when --onnx asked for it
    backward: bool = False                            # --backward: also package a training forward and backward
    grad_inputs: tuple = ()                           # inputs whose gradients the backward returns
    training: object = None                           # autograd.TrainingGraphs
    train_states: dict = field(default_factory=dict)  # entry name -> the State of that training graph
    lower_fn: Callable | None = None                  # lowering of this graph (None: lower.lower)
    tuning: dict | None = None                        # manifest cuda.tuning: configs chosen by --autotune
    cuda_options: CudaOptions = field(default_factory=CudaOptions)  # how CUDA kernels are generated and built


def stage_capture(st: State) -> str:
    # a training package shares its weights between every graph, so no graph may fold them
    st.captured = capture_mod.capture(st.spec, st.dynamic, fold=not st.backward)
    st.output_is_single = st.captured.program.call_spec.out_spec.is_leaf()
    return st.captured.program.graph_module.print_readable(print_output=False) + "\n" + \
        "\n".join(f"{name}: [{s.min}, {s.max}]" for name, s in st.captured.symbols.items())


def stage_autograd(st: State) -> str:
    from tcexport.exporter.front import autograd
    from tcexport.exporter.lower import training as autograd_lower

    st.training = autograd.capture_training(st.spec, st.captured, st.grad_inputs)
    st.train_states = {entry: State(st.spec, st.dynamic, st.targets, st.cache_dir, captured=captured,
                                    lower_fn=autograd_lower.lower_training, cuda_options=st.cuda_options)
                       for entry, captured in autograd.entries(st.training)}
    return autograd.describe(st.training)


def _each_graph(st: State, stage: Callable[[State], str]) -> str:
    """Run a per-graph stage on the inference graph, then on each training graph (dumped under its entry)."""
    texts = [stage(st)] + [f"== {entry} ==\n{stage(g)}" for entry, g in st.train_states.items()]
    return "\n\n".join(texts)


def _lower(st: State) -> str:
    st.program, st.lowering = (st.lower_fn or lower_mod.lower)(st.captured)
    st.program.verify()
    return str(st.program)


def _fuse(st: State) -> str:
    st.kernels = fuse_mod.fuse(st.program)
    used = {b for k in st.kernels for s in k.stages for b in s.node.inputs()}
    st.program.weights = [w for w in st.program.weights if w in used]
    st.program.verify()
    return str(st.program) + "\n\nkernels:\n" + "\n".join(str(k) for k in st.kernels)


def _plan(st: State) -> str:
    st.memory = plan_mod.plan_memory(st.program, st.kernels)
    return str(st.memory)


def stage_lower(st: State) -> str:
    return _each_graph(st, _lower)


def stage_fuse(st: State) -> str:
    return _each_graph(st, _fuse)


def stage_plan(st: State) -> str:
    text = _each_graph(st, _plan)
    if st.train_states:
        from tcexport.exporter.lower.training import share_weights

        share_weights(st, list(st.train_states.values()))
    return text


def stage_codegen(st: State) -> str:
    graphs = [st] + list(st.train_states.values())
    dtypes = {s.node.gemm.acc_dtype for g in graphs for k in g.kernels if k.kind == "gemm" for s in k.stages}
    st.blas = [r for r, dt in (("sgemm", "float32"), ("dgemm", "float64")) if dt in dtypes]
    extra = tuple((entry, g.program, g.kernels, g.memory) for entry, g in st.train_states.items())
    from tcexport.formats.abi import ISA_PLACEHOLDER, descriptor
    from tcexport.packager.package import interface

    st.descriptor = descriptor(interface(st), ISA_PLACEHOLDER)
    st.cpp = codegen_cpp.generate(st.program, st.kernels, st.memory, st.blas, extra, st.descriptor)
    return st.cpp


def stage_build(st: State) -> str:
    st.libraries = build_mod.build_all(st.cpp, cache_dir=st.cache_dir, descriptor=st.descriptor)
    return "\n".join(f"{isa}: {len(data)} bytes" for isa, data in st.libraries.items())


def stage_schedule_cuda(st: State) -> str:
    """The GPU's own kernel list and memory plan (schedule/gpu.py), for every graph."""
    from tcexport.exporter.schedule.gpu import schedule_cuda

    def one(g: State) -> str:
        schedule = schedule_cuda(g.program, g.kernels)
        g.cuda_kernels, g.cuda_memory = schedule.kernels, schedule.memory
        return str(schedule)
    return _each_graph(st, one)


def stage_codegen_triton(st: State) -> str:
    st.triton = codegen_triton.generate(st.program, st.cuda_kernels, (st.tuning or {}).get("configs"),
                                        st.cuda_options)
    return st.triton.source


def stage_build_cuda(st: State) -> str:
    from tcexport.exporter.cuda import build as build_cuda

    st.cubins = build_cuda.build_cubins(st.triton, cuda_archs(st.targets),
                                        st.cache_dir or build_mod.default_cache_dir(), st.cuda_options)
    lines = [launch.describe() for launch in st.triton.launches]
    for arch, cubins in st.cubins.items():
        lines += [f"sm_{arch} {c.kernel}: {len(c.data)} bytes, shared {c.shared}, warps {c.num_warps}"
                  for c in cubins]
    return "\n".join(lines)


def stage_codegen_triton_train(st: State) -> str:
    """Each training graph's own Triton module (its kernels, launch list and index width), as for inference."""
    return "\n\n".join(f"== {entry} ==\n{stage_codegen_triton(g)}" for entry, g in st.train_states.items())


def stage_build_cuda_train(st: State) -> str:
    return "\n\n".join(f"== {entry} ==\n{stage_build_cuda(g)}" for entry, g in st.train_states.items())


def _cpu(st: State) -> bool:
    return "cpu" in st.targets


def _cuda(st: State) -> bool:
    return bool(cuda_archs(st.targets))


# (name, stage, dump file, runs when)
STAGES: list[tuple[str, Callable[[State], str], str, Callable[[State], bool]]] = [
    ("capture", stage_capture, "graph.txt", lambda st: True),
    ("autograd", stage_autograd, "graph_train.txt", lambda st: st.backward),
    ("lower", stage_lower, "ir.txt", lambda st: True),
    ("fuse", stage_fuse, "kernels.txt", lambda st: True),
    ("plan", stage_plan, "plan.txt", lambda st: True),
    ("codegen", stage_codegen, "model.cpp", _cpu),
    ("build", stage_build, "build.txt", _cpu),
    ("schedule_cuda", stage_schedule_cuda, "schedule_cuda.txt", _cuda),
    ("codegen_triton", stage_codegen_triton, "model_triton.py", _cuda),
    ("build_cuda", stage_build_cuda, "build_cuda.txt", lambda st: _cuda(st) and st.build_cubins),
    ("codegen_triton_train", stage_codegen_triton_train, "model_triton_train.py", lambda st: _cuda(st) and st.backward),
    ("build_cuda_train", stage_build_cuda_train, "build_cuda_train.txt",
     lambda st: _cuda(st) and st.backward and st.build_cubins),
]


def stage_onnx(st: State) -> str:
    from tcexport.exporter.check.onnx import export_onnx_bytes

    st.onnx = export_onnx_bytes(st.spec, st.captured.dynamic_shapes)
    return f"ONNX opset {st.onnx[1]}, {len(st.onnx[0])} bytes"


def _write_dump(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise output_error("the --dump folder", path.parent, e, "pass another folder to --dump") from e


def run_stages(st: State, dump: Path | None = None, on_stage: Callable[[str, float], None] | None = None,
               onnx: bool = False) -> State:
    if dump is not None:
        try:
            dump.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise output_error("the --dump folder", dump, e, "pass another folder to --dump") from e
    for name, fn, dump_name, when in STAGES + ([("onnx", stage_onnx, "onnx.txt", lambda st: True)] if onnx else []):
        if not when(st):
            continue
        t0 = time.perf_counter()
        text = fn(st)
        st.timings[name] = time.perf_counter() - t0
        if dump is not None:
            _write_dump(dump / dump_name, text)
        if on_stage is not None:
            on_stage(name, st.timings[name])
    return st


def parse_targets(targets) -> tuple:
    """``"cpu,cuda:sm_80,sm_90"`` (or a list of such strings) → ("cpu", "cuda:sm_80", "cuda:sm_90"); a bare
    ``sm_XX`` continues the cuda list before it."""
    if isinstance(targets, str):
        targets = [targets]
    out: list[str] = []
    in_cuda = False
    for part in (p.strip() for t in targets for p in t.split(",")):
        if not part:
            continue
        if part.startswith("cuda:"):
            in_cuda, part = True, part[5:]
        if part == "cpu":
            in_cuda = False
            out.append("cpu")
        elif in_cuda and part.startswith("sm_") and part[3:].isdigit() and int(part[3:]) >= 70:
            out.append(f"cuda:{part}")
        else:
            raise ExportError(f"target {part!r} is not supported; targets are {TARGET_HELP} "
                              "(CUDA archs sm_70 and newer)")
    if not out:
        raise ExportError(f"no target given; targets are {TARGET_HELP}")
    return tuple(dict.fromkeys(out))


def cuda_archs(targets) -> list[int]:
    return [int(t.split("_")[1]) for t in targets if t.startswith("cuda:")]


def export(model: torch.nn.Module, example_inputs, dynamic_shapes: dict | None = None, targets=("cpu",), *,
           dynamic: list[str] = (), name: str | None = None, dump: str | Path | None = None,
           cache_dir: str | Path | None = None, on_stage=None, source_path: str | None = None,
           onnx: str | None = None, backward: bool = False, grad_inputs=(), build_cubins: bool = True,
           tuning=None, cuda_options: CudaOptions | None = None):
    """Compile ``model`` ahead of time; returns a ``tcexport.packager.Package`` (call ``.save(path)``).

    ``dynamic_shapes`` maps input names to ``{dim: "symbol"}`` or ``{dim: ("symbol", min, max)}``;
    ``dynamic`` takes the CLI's `--dynamic` strings. ``onnx="file"`` also exports the model to ONNX
    (``package.onnx`` holds the bytes), ``onnx="embed"`` stores it inside the archive as well.
    ``backward=True`` also packages a training forward and a backward (for every target), with gradients for every
    parameter that requires grad and for the inputs named in ``grad_inputs``. ``build_cubins=False`` (with a cuda
    target) packages the Triton source and launch list without cubins: such a package runs only in Triton's
    interpreter (exporter/check/interpret.py), which is how tests check many kernels quickly.
    ``tuning`` (a .tcpkg path, or its manifest's ``cuda.tuning``) builds with a recorded tuning instead of the
    heuristics, no GPU needed; ``tcexport.exporter.export(..., autotune=True)`` makes one first (tune/autotune.py).
    ``cuda_options`` (exporter/options.py) says how CUDA kernels are generated and built.
    """
    from tcexport.packager.package import package

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    spec = ModelSpec(path=Path(source_path or "<model>"), module=model.eval(), example_inputs=example_inputs,
                     input_names=forward_input_names(model, len(example_inputs)), dynamic_shapes=dynamic_shapes)
    st = State(spec, list(dynamic), parse_targets(targets), Path(cache_dir) if cache_dir else None,
               backward=backward, grad_inputs=tuple(grad_inputs), build_cubins=build_cubins,
               cuda_options=cuda_options or CudaOptions())
    st.tuning = read_tuning(tuning)
    if st.tuning is not None and not cuda_archs(st.targets):
        raise ExportError("--tuning sets CUDA kernels' tiles; add a cuda target, e.g. --target cuda:sm_90")
    if onnx not in (None, "file", "embed"):
        raise ExportError(f"onnx should be None, 'file' or 'embed', got {onnx!r}")
    run_stages(st, Path(dump) if dump else None, on_stage, onnx=onnx is not None)
    t0 = time.perf_counter()
    pkg = package(st, name or type(model).__name__, embed_onnx=onnx == "embed")
    st.timings["package"] = time.perf_counter() - t0
    if on_stage is not None:
        on_stage("package", st.timings["package"])
    return pkg


def read_tuning(tuning) -> dict | None:
    """``--tuning``: a package built with --autotune (its manifest's cuda.tuning), or that object itself, checked
    as the manifest checks it (launch names are checked against the module when it is generated)."""
    if tuning is None:
        return None
    if isinstance(tuning, dict):
        from tcexport.formats.errors import FormatError
        from tcexport.formats.manifest import check_tuning

        try:
            return check_tuning(tuning)
        except FormatError as e:
            raise ExportError(f"tuning: {e}; pass a package built with --autotune, or its manifest's "
                              "cuda.tuning") from None
    from tcexport.loader.archive import open_archive

    cuda = open_archive(tuning).manifest.cuda
    if cuda is None or cuda.tuning is None:
        raise ExportError(f"--tuning {tuning}: this package has no cuda.tuning; take one built with --autotune")
    return cuda.tuning
