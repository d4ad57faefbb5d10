"""The pipeline: per-target lists of named stages over typed results, each stage's output dumpable (``--dump DIR``).

    front:    capture → (autograd)                                  Job → Captured graphs
    graphs:   lower → fuse → plan            (on every graph)       Captured → loop IR → kernels → memory plan
    cpu:      codegen_cpp → build_cpp        (one library)          kernels → C++ → one .so per ISA level
    cuda:     schedule_cuda → codegen_triton → build_cuda  (on every graph)
                                                                    kernels → GPU kernels and plan → Triton → cubins
    package:  the manifest and member bytes (exporter/package/), written by packager/

A stage whose target is not requested is not in the list: ``--target cuda:sm_90`` alone builds no C++. With
``--backward`` the autograd stage adds the training ``forward`` and ``backward`` graphs next to ``inference``;
every per-graph stage then runs on each of them, and their dumps hold one ``== name ==`` section per graph.
A model with methods (front/methods.py) is captured once per method: the first is ``inference``, each other a
graph named after it; every per-graph stage runs on each, and ``--dump`` writes each method's files into a folder
of its own (``DIR/<method>/ir.txt``...).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tcexport.exporter.errors import CaptureError, ExportError, MethodError, output_error
from tcexport.exporter.front.model_file import ModelSpec, forward_input_names, with_methods
from tcexport.exporter.options import CudaOptions
from tcexport.exporter.progress import Progress

TARGET_HELP = "cpu, cuda:sm_XX or a comma-separated list, e.g. cpu,cuda:sm_80,sm_90"
INFERENCE = "inference"


@dataclass(frozen=True)
class Job:
    """What to build, fixed before the first stage runs: the model and every option that changes the bytes."""

    spec: ModelSpec
    dynamic: tuple = ()                   # the CLI's --dynamic strings
    targets: tuple = ("cpu",)             # parse_targets' form: "cpu", "cuda:sm_90", ...
    cache_dir: Path | None = None         # the kernel cache (None: TCEXPORT_CACHE or ~/.cache/tcexport)
    backward: bool = False                # also package a training forward and backward
    grad_inputs: tuple = ()               # inputs whose gradients the backward returns
    build_cubins: bool = True             # False: Triton source only (runs in the interpreter)
    tuning: dict | None = None            # the manifest's cuda.tuning to build with (None: the heuristics)
    cuda_options: CudaOptions = field(default_factory=CudaOptions)
    onnx: bool = False                    # also export the model to ONNX
    precision: str | None = None          # "bf16"/"fp16": the model as it computes under autocast

    @property
    def cpu(self) -> bool:
        return "cpu" in self.targets

    @property
    def archs(self) -> list[int]:
        return cuda_archs(self.targets)

    @property
    def methods(self) -> tuple:
        """The model's declared methods (front/methods.MethodSpec, the first one first), or ()."""
        return self.spec.methods


@dataclass
class CudaGraph:
    """A graph's GPU schedule and what is built from it: its own kernel list (attention fused, split-K GEMMs)
    and memory plan, then the Triton module and each arch's cubins in launch order."""

    kernels: list
    memory: object                        # schedule.memory.MemoryPlan
    module: object = None                 # cuda.codegen.TritonModule
    cubins: dict = field(default_factory=dict)


@dataclass
class Graph:
    """One graph of the package as it goes through the stages: ``inference``, or the training ``forward`` and
    ``backward`` (named by their library entries). Each field is set by one stage."""

    name: str
    captured: object                      # front.capture.Captured                  (capture, autograd)
    program: object = None                # ir.loops.Program                         (lower; fuse drops weights)
    lowering: object = None               # lower.core.Lowering: weight values, names (lower)
    kernels: list = field(default_factory=list)  # schedule.fuse.Kernel, in order    (fuse)
    cpu_kernels: list = field(default_factory=list)  # the CPU's list: attention fused where it pays (plan)
    memory: object = None                 # schedule.memory.MemoryPlan of cpu_kernels  (plan)
    cuda: CudaGraph | None = None         #                                          (schedule_cuda and after)
    method: str | None = None             # the method it is, in a package with methods (its first: ``inference``)

    @property
    def entry(self) -> str:
        """The CPU library's entry point of an extra graph: a training graph's name is its entry; a method's is the
        ABI's name for the method."""
        from tcexport.formats.abi import method_entry

        return method_entry(self.method) if self.method is not None else self.name


@dataclass
class CpuLibrary:
    """The one C++ library every graph's entry point lives in."""

    blas: tuple                           # BLAS routines the kernels call
    descriptor: bytes                     # the interface compiled into it (formats/abi.py)
    source: str
    binaries: dict = field(default_factory=dict)  # ISA level -> .so bytes


@dataclass
class Results:
    """Everything the stages produced, typed; the package stage reads it."""

    job: Job
    graphs: dict = field(default_factory=dict)   # name -> Graph; inference first
    training: object = None                      # front.autograd.TrainingGraphs (autograd)
    cpu: CpuLibrary | None = None                # (codegen_cpp, build_cpp)
    onnx: tuple | None = None                    # (bytes, opset)                 (onnx)
    timings: dict = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)  # where stages report what they are doing

    @property
    def inference(self) -> Graph:
        return self.graphs[INFERENCE]


# ---- front ----

def stage_capture(r: Results) -> str | dict:
    from tcexport.exporter.front import capture

    if r.job.methods:
        return _capture_methods(r)
    # a training package shares its weights between every graph, so no graph may fold them
    captured = capture.capture(r.job.spec, list(r.job.dynamic), fold=not r.job.backward,
                               precision=r.job.precision, kn_weights=bool(r.job.archs),
                               panel_weights=not r.job.archs)
    r.graphs[INFERENCE] = Graph(INFERENCE, captured)
    if r.job.onnx and captured.state:
        from tcexport.formats.state import first_names

        names = first_names(b.name for b in captured.state)
        raise ExportError(f"--onnx: the model keeps state ({names}: buffers its forward writes), which an ONNX model "
                          f"cannot hold: its export would compute every call from the initial values. Drop --onnx "
                          f"(ONNX Runtime takes a KV cache as inputs and outputs: bench/decode.py shows that export).")
    return _captured_text(captured)


def _captured_text(captured) -> str:
    logged = "\n\n# torch's log during capture (kept off stderr)\n" + "\n".join(captured.torch_log) \
        if captured.torch_log else ""
    rewrites = "\n\n# weights rewritten at export\n" + "\n".join(captured.folded) if captured.folded else ""
    return captured.program.graph_module.print_readable(print_output=False) + "\n" + \
        "\n".join(f"{name}: [{s.min}, {s.max}]" for name, s in captured.symbols.items()) + rewrites + logged


def _capture_methods(r: Results) -> dict:
    """Each method captured on its own (its examples, dynamic dims, function), weights never folded: every method
    reads the one weights array. An error names the method it came from."""
    from tcexport.exporter.front import capture
    from tcexport.exporter.front.methods import check_shared_buffers, kept_buffers, split_dynamic

    methods = r.job.methods
    dynamic = split_dynamic(list(r.job.dynamic), tuple(m.name for m in methods))
    buffers = kept_buffers(r.job.spec.module)
    for k, m in enumerate(methods):
        try:
            with buffers:  # each method starts from the model's buffers (a capture may move a cache's counters)
                captured = capture.capture(r.job.spec.for_method(m), dynamic[m.name], fold=False)
        except ExportError as e:
            e.args = (f"method {m.name!r}: {e.args[0] if e.args else e}",) + e.args[1:]
            raise
        name = INFERENCE if k == 0 else m.name
        r.graphs[name] = Graph(name, captured, method=m.name)
    check_shared_buffers({g.method: g.captured for g in r.graphs.values()})
    return {g.method: _captured_text(g.captured) for g in r.graphs.values()}


def stage_autograd(r: Results) -> str:
    from tcexport.exporter.front import autograd

    r.training = autograd.capture_training(r.job.spec, r.inference.captured, r.job.grad_inputs)
    for entry, captured in autograd.entries(r.training):
        r.graphs[entry] = Graph(entry, captured)
    return autograd.describe(r.training)


# ---- graphs: run on every graph ----

def _each_graph(r: Results, stage: Callable[[Results, Graph], str]) -> str | dict:
    """A per-graph stage over every graph; the dump has the inference graph's text, then one section per other
    (with methods: each method's text, by method name, which run_stages writes into a folder per method)."""
    if r.job.methods:
        return {g.method: stage(r, g) for g in r.graphs.values()}
    texts = [stage(r, g) if g.name == INFERENCE else f"== {g.name} ==\n{stage(r, g)}" for g in r.graphs.values()]
    return "\n\n".join(texts)


def _lower(r: Results, g: Graph) -> str:
    from tcexport.exporter.lower import core

    # the rule table is a value of the pipeline: the inference graph's, or the training graphs' (plus gradients)
    rules = core.INFERENCE_RULES if g.name == INFERENCE or g.method is not None else core.TRAINING_RULES
    g.program, g.lowering = core.lower(g.captured, rules)
    g.program.verify()
    return str(g.program)


def _fuse(r: Results, g: Graph) -> str:
    from tcexport.exporter.schedule import fuse

    g.kernels = fuse.fuse(g.program)
    used = {b for k in g.kernels for s in k.stages for b in s.node.inputs()}
    g.program.weights = [w for w in g.program.weights if w in used]
    g.program.verify()
    return str(g.program) + "\n\nkernels:\n" + "\n".join(str(k) for k in g.kernels)


def _plan(r: Results, g: Graph) -> str:
    from tcexport.exporter.cpu.attention import supported
    from tcexport.exporter.schedule import memory
    from tcexport.exporter.schedule.cpu import schedule_cpu

    g.cpu_kernels = schedule_cpu(g.program, g.kernels, supported)
    g.memory = memory.plan_memory(g.program, g.cpu_kernels)
    fused = [str(k) for k in g.cpu_kernels if k.kind == "attention"]
    return str(g.memory) + ("\n\nCPU attention kernels:\n" + "\n".join(fused) if fused else "")


def stage_lower(r: Results) -> str:
    return _each_graph(r, _lower)


def stage_fuse(r: Results) -> str:
    return _each_graph(r, _fuse)


def stage_plan(r: Results) -> str:
    text = _each_graph(r, _plan)
    if r.training is not None:
        from tcexport.exporter.lower.training import share_weights

        share_weights(r.inference, [g for g in r.graphs.values() if g.name != INFERENCE])
    if r.job.methods:
        from tcexport.exporter.lower.methods import share_method_weights

        share_method_weights(list(r.graphs.values()))
    return text


# ---- cpu: one library for every graph ----

def stage_codegen_cpp(r: Results) -> str:
    from tcexport.exporter.cpu import codegen
    from tcexport.exporter.package.interface import interface
    from tcexport.formats.abi import ISA_PLACEHOLDER, descriptor

    graphs = list(r.graphs.values())
    dtypes = {s.node.gemm.acc_dtype for g in graphs for k in g.cpu_kernels for s in k.stages if s.node.gemm}
    blas = tuple(routine for routine, dt in (("sgemm", "float32"), ("dgemm", "float64")) if dt in dtypes)
    face = descriptor(interface(r, blas), ISA_PLACEHOLDER)
    main = r.inference
    extra = tuple((g.entry, g.program, g.cpu_kernels, g.memory) for g in graphs[1:])
    r.cpu = CpuLibrary(blas, face, codegen.generate(main.program, main.cpu_kernels, main.memory, list(blas), extra,
                                                    face))
    return r.cpu.source


def stage_build_cpp(r: Results) -> str:
    from tcexport.exporter.cpu import build

    r.cpu.binaries = build.build_all(r.cpu.source, cache_dir=r.job.cache_dir, descriptor=r.cpu.descriptor,
                                     on_built=lambda done, total: r.progress.step(done, total, "CPU bundles"))
    return "\n".join(f"{isa}: {len(data)} bytes" for isa, data in r.cpu.binaries.items())


# ---- cuda: on every graph ----

def _schedule_cuda(r: Results, g: Graph) -> str:
    from tcexport.exporter.schedule.gpu import schedule_cuda

    schedule = schedule_cuda(g.program, g.kernels)
    g.cuda = CudaGraph(schedule.kernels, schedule.memory)
    return str(schedule)


def _codegen_triton(r: Results, g: Graph) -> str:
    from tcexport.exporter.cuda import module

    # a tuning names the inference graph's launches; training graphs build with the heuristics
    configs = (r.job.tuning or {}).get("configs") if g.name == INFERENCE else None
    g.cuda.module = module.generate(g.program, g.cuda.kernels, configs, r.job.cuda_options)
    return g.cuda.module.source


def _build_cuda(r: Results, g: Graph) -> str:
    from tcexport.exporter.build_cache import default_cache_dir
    from tcexport.exporter.cuda import build

    g.cuda.cubins = build.build_cubins(g.cuda.module, r.job.archs, r.job.cache_dir or default_cache_dir(),
                                       r.job.cuda_options,
                                       on_built=lambda done, total: r.progress.step(done, total, "cubins"))
    lines = [launch.describe() for launch in g.cuda.module.launches]
    for arch, cubins in g.cuda.cubins.items():
        lines += [f"sm_{arch} {c.kernel}: {len(c.data)} bytes, shared {c.shared}, warps {c.num_warps}"
                  for c in cubins]
    return "\n".join(lines)


def stage_schedule_cuda(r: Results) -> str:
    return _each_graph(r, _schedule_cuda)


def stage_codegen_triton(r: Results) -> str:
    return _each_graph(r, _codegen_triton)


def stage_build_cuda(r: Results) -> str:
    return _each_graph(r, _build_cuda)


def stage_onnx(r: Results) -> str:
    from tcexport.exporter.check.onnx import export_onnx_bytes

    reference = r.inference.captured.reference  # --precision: the autocast module is what the package computes
    spec = r.job.spec if reference is None else dataclasses.replace(r.job.spec, module=reference)
    r.onnx = export_onnx_bytes(spec, r.inference.captured.dynamic_shapes)
    return f"ONNX opset {r.onnx[1]}, {len(r.onnx[0])} bytes"


def _cpu_bundles_text(r: Results) -> str:
    from tcexport.exporter.cpu.build import ISA_LEVELS

    return f"building {len(ISA_LEVELS)} CPU bundles"


def _cubins_text(r: Results) -> str:
    launches = sum(len(g.cuda.module.launches) for g in r.graphs.values() if g.cuda is not None)
    archs = r.job.archs
    return f"building {launches * len(archs)} cubins ({launches} kernels for {', '.join(f'sm_{a}' for a in archs)})"


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Results], str]
    dump: str                             # file name under --dump
    when: Callable[[Job], bool] = lambda job: True
    detail: Callable[[Results], str] = lambda r: ""   # what the progress line says while it runs


FRONT = [Stage("capture", stage_capture, "graph.txt", detail=lambda r: "torch.export"),
         Stage("autograd", stage_autograd, "graph_train.txt", lambda job: job.backward,
               lambda r: "joint forward and backward graphs")]
GRAPHS = [Stage("lower", stage_lower, "ir.txt", detail=lambda r: f"{len(r.graphs)} graph(s) to loop IR"),
          Stage("fuse", stage_fuse, "kernels.txt", detail=lambda r: "fusing loops into kernels"),
          Stage("plan", stage_plan, "plan.txt", detail=lambda r: "memory plan")]
CPU = [Stage("codegen_cpp", stage_codegen_cpp, "model.cpp", detail=lambda r: "generating C++"),
       Stage("build_cpp", stage_build_cpp, "build.txt", detail=_cpu_bundles_text)]
CUDA = [Stage("schedule_cuda", stage_schedule_cuda, "schedule_cuda.txt", detail=lambda r: "GPU schedule"),
        Stage("codegen_triton", stage_codegen_triton, "model_triton.py", detail=lambda r: "generating Triton"),
        Stage("build_cuda", stage_build_cuda, "build_cuda.txt", lambda job: job.build_cubins, _cubins_text)]
CHECKS = [Stage("onnx", stage_onnx, "onnx.txt", lambda job: job.onnx, lambda r: "exporting ONNX")]


def stages(job: Job) -> list[Stage]:
    """The stages this job runs, in order."""
    listed = FRONT + GRAPHS + (CPU if job.cpu else []) + (CUDA if job.archs else []) + CHECKS
    return [s for s in listed if s.when(job)]


def _write_dump(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise output_error("the --dump folder", path.parent, e, "pass another folder to --dump") from e


def run_stages(job: Job, dump: Path | None = None,
               on_stage: Callable[[str, float], None] | None = None, progress: Progress | None = None) -> Results:
    """Run ``stages(job)`` in order; ``on_stage(name, seconds)`` after each, ``progress`` told as they run."""
    if dump is not None:
        try:
            dump.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise output_error("the --dump folder", dump, e, "pass another folder to --dump") from e
    r = Results(job, progress=progress or Progress())
    names = [m.name for m in job.methods]
    if dump is not None:
        for name in names:
            try:
                (dump / name).mkdir(exist_ok=True)
            except OSError as e:
                raise output_error("the --dump folder", dump / name, e, "pass another folder to --dump") from e
    for stage in stages(job):
        t0 = time.perf_counter()
        r.progress.stage(stage.name, stage.detail(r))
        try:
            text = stage.run(r)
        except CaptureError as e:  # torch's full report (graph dumps included) belongs in the dump, not stderr
            if dump is not None and e.torch_log:
                _write_dump(dump / "capture_log.txt", e.torch_log)
            raise
        r.timings[stage.name] = time.perf_counter() - t0
        if dump is not None and isinstance(text, dict):  # a per-graph stage of a model with methods
            for name, part in text.items():
                _write_dump(dump / name / stage.dump, part)
        elif dump is not None:
            _write_dump(dump / stage.dump, text)
        r.progress.stage_done(stage.name, r.timings[stage.name])
        if on_stage is not None:
            on_stage(stage.name, r.timings[stage.name])
    return r


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


def make_job(model: torch.nn.Module, example_inputs, dynamic_shapes: dict | None = None, targets=("cpu",), *,
             dynamic=(), cache_dir=None, source_path: str | None = None, backward: bool = False, grad_inputs=(),
             build_cubins: bool = True, tuning=None, cuda_options: CudaOptions | None = None,
             onnx: bool = False, precision: str | None = None, methods=None) -> Job:
    """The Job for ``export``'s arguments, every option checked before any stage runs."""
    if methods is not None:
        spec = _methods_spec(model, example_inputs, dynamic_shapes, methods, source_path)
    else:
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        if example_inputs is None:
            raise ExportError("export() needs example_inputs (a tuple of tensors, one per forward() argument), or "
                              "methods={name: {'example_inputs': ...}}")
        example_inputs = tuple(example_inputs)
        spec = ModelSpec(path=Path(source_path or "<model>"), module=model.eval(), example_inputs=example_inputs,
                         input_names=forward_input_names(model, len(example_inputs)), dynamic_shapes=dynamic_shapes)
    job = Job(spec, tuple(dynamic), parse_targets(targets), Path(cache_dir) if cache_dir else None, backward,
              tuple(grad_inputs), build_cubins, read_tuning(tuning), cuda_options or CudaOptions(), onnx, precision)
    _check_precision(job)
    _check_methods(job)
    if job.tuning is not None and not job.archs:
        raise ExportError("--tuning sets CUDA kernels' tiles; add a cuda target, e.g. --target cuda:sm_90")
    return job


def _methods_spec(model, example_inputs, dynamic_shapes, methods, source_path) -> ModelSpec:
    """The spec of a model exported with ``methods`` (raw declarations, or MethodSpecs already checked)."""
    from tcexport.exporter.front.methods import MethodSpec, parse_methods

    if example_inputs is not None or dynamic_shapes is not None:
        raise MethodError("export(): pass example_inputs and dynamic_shapes inside each method "
                          "(methods={'forward': {'example_inputs': ..., 'dynamic_shapes': ...}}), not beside methods",
                          expected="methods alone", got="example_inputs" if example_inputs is not None
                          else "dynamic_shapes")
    checked = methods if isinstance(methods, tuple) and methods and all(isinstance(m, MethodSpec) for m in methods) \
        else parse_methods(model, methods)
    spec = ModelSpec(path=Path(source_path or "<model>"), module=model.eval(), example_inputs=checked[0].example_inputs,
                     input_names=[], dynamic_shapes=None)
    return with_methods(spec, checked)


# options whose graphs one package's methods cannot share: what the user should do instead
_NOT_WITH_METHODS = {
    "backward": "--backward (training graphs are built for one forward): export the methods without it, or the "
                "model's forward alone with --backward",
    "onnx": "--onnx (an ONNX model has one graph): export the methods without it",
    "precision": "--precision (autocast makes a module of its own per capture, so the methods' weights would no "
                 "longer be one set): export the model in that dtype instead (model.to(torch.bfloat16))",
}


def _check_methods(job: Job) -> None:
    """Options that cannot keep methods are a MethodError before anything is captured; so is a METHOD:SPEC
    --dynamic naming no method."""
    from tcexport.exporter.front.methods import split_dynamic

    split_dynamic(list(job.dynamic), tuple(m.name for m in job.methods))
    if not job.methods:
        return
    for option, text in _NOT_WITH_METHODS.items():
        if getattr(job, option):
            names = [m.name for m in job.methods]
            raise MethodError(f"the model declares methods {names}; {text}", expected="no --" + option,
                              got="--" + option)


def _check_precision(job: Job) -> None:
    from tcexport.exporter.front.autocast import precision_dtype

    precision_dtype(job.precision)  # an unknown name is an ExportError naming the known ones
    if job.precision is not None and job.backward:
        raise ExportError(f"--precision {job.precision} exports the inference graph under autocast; training "
                          "graphs (--backward) keep the model's own dtypes. Drop one of the two options.")


def export(model: torch.nn.Module, example_inputs=None, dynamic_shapes: dict | None = None, targets=("cpu",), *,
           dynamic: list[str] = (), name: str | None = None, dump: str | Path | None = None,
           cache_dir: str | Path | None = None, on_stage=None, source_path: str | None = None,
           onnx: str | None = None, backward: bool = False, grad_inputs=(), build_cubins: bool = True,
           tuning=None, cuda_options: CudaOptions | None = None, precision: str | None = None,
           progress: Progress | None = None, model_version: str | None = None, metadata: dict | None = None,
           methods=None):
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
    ``cuda_options`` (exporter/options.py) says how CUDA kernels are generated and built. ``progress``
    (exporter/progress.py) is told what runs; ``model_version`` and ``metadata`` (str -> str) go into the
    manifest's ``model`` (informational, shown by ``tcpkg inspect``).
    ``precision`` ("bf16" or "fp16") exports the model as it computes under ``torch.autocast("cuda", dtype)``
    (front/autocast.py): GEMMs, convolutions and attention in 16 bits, norms, softmax and reductions in float32,
    GEMM weights stored in 16 bits; ``package.reference`` is that module, for comparisons.
    ``methods`` (name -> {"example_inputs", "dynamic_shapes"?, "function"?}, front/methods.py; instead of
    ``example_inputs``/``dynamic_shapes``) exports several named entry points sharing weights and state (SPEC §2c):
    ``load(path).methods[name]``. ``dynamic`` then applies a plain SPEC to every method, ``METHOD:SPEC`` to one.
    """
    from tcexport.exporter.package.build import package

    if onnx not in (None, "file", "embed"):
        raise ExportError(f"onnx should be None, 'file' or 'embed', got {onnx!r}")
    job = make_job(model, example_inputs, dynamic_shapes, targets, dynamic=dynamic, cache_dir=cache_dir,
                   source_path=source_path, backward=backward, grad_inputs=grad_inputs, build_cubins=build_cubins,
                   tuning=tuning, cuda_options=cuda_options, onnx=onnx is not None, precision=precision,
                   methods=methods)
    info = check_model_info(model_version, metadata)
    results = run_stages(job, Path(dump) if dump else None, on_stage, progress)
    t0 = time.perf_counter()
    results.progress.stage("package", "manifest and members")
    pkg = package(results, name or type(model).__name__, embed_onnx=onnx == "embed", model_info=info)
    results.timings["package"] = pkg.timings["package"] = time.perf_counter() - t0
    results.progress.stage_done("package", results.timings["package"])
    if on_stage is not None:
        on_stage("package", results.timings["package"])
    return pkg


def check_model_info(model_version: str | None, metadata: dict | None) -> tuple[str | None, dict]:
    """``model_version`` and ``metadata`` as the manifest checks them, checked before anything is built."""
    from tcexport.formats.errors import FormatError
    from tcexport.formats.manifest import parse_model_info

    info = {**({"version": model_version} if model_version is not None else {}), "metadata": dict(metadata or {})}
    try:
        return parse_model_info(info)
    except FormatError as e:
        raise ExportError(str(e).replace("manifest: model.version", "--model-version")
                          .replace("manifest: model.metadata", "--meta")) from None


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
