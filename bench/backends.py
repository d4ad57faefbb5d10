"""The backends a benchmark compares, each on the same module, inputs and thread count.

A backend builds an artifact (or nothing), loads it into a callable, and writes the Python source of a fresh
process that goes from its first import to its first result (the cold start).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .models import ROOT, BenchModel


@dataclass
class Context:
    device: str          # "cpu" or "cuda"
    threads: int
    workdir: Path
    dtype: torch.dtype = torch.float32
    packages: Path | None = None  # prebuilt .tcpkg files (e.g. built on a CPU-only machine for a GPU run)
    autotune_at: tuple = ()       # tcpkg built with --autotune at these sizes ("batch=8"); () builds without it
    precision: str | None = None  # "bf16"/"fp16": the float32 model run under torch.autocast (AMP); tcpkg --precision
    timing: dict = field(default_factory=dict)  # time_calls' keywords (the zoo suites take fewer, longer samples)
    concurrency: tuple = ()       # calling-thread counts for the concurrency row (empty: not measured)
    concurrency_seconds: float = 5.0


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def amp(ctx: Context):
    """torch.autocast at the run's precision, or nothing for a plain run."""
    if ctx.precision is None:
        return contextlib.nullcontext()
    return torch.autocast(ctx.device, dtype=AMP_DTYPES[ctx.precision])


def under_amp(fn, ctx: Context):
    """``fn`` called under the run's autocast (autocast state is per thread, so it is entered on every call)."""
    if ctx.precision is None:
        return fn

    def run(*xs):
        with amp(ctx):
            return fn(*xs)
    return run


def precision_label(ctx: Context) -> str:
    """The dtype part of a result key and a package name: "float32", "bfloat16", or "amp-bf16"."""
    return f"amp-{ctx.precision}" if ctx.precision else str(ctx.dtype).split(".")[-1]


class _Autocast(torch.nn.Module):
    """A module whose forward enters torch.autocast itself, so torch.export captures the autocast region (an
    export merely run under autocast records the ops uncast)."""

    def __init__(self, inner, device: str, dtype: torch.dtype):
        super().__init__()
        self.inner, self.device, self.dtype = inner, device, dtype

    def forward(self, *xs):
        with torch.autocast(self.device, dtype=self.dtype):
            return self.inner(*xs)


@dataclass
class Built:
    seconds: float
    size_bytes: int | None
    artifact: Path | None = None
    extra: dict = field(default_factory=dict)


def to_device(inputs: tuple, ctx: Context) -> tuple:
    out = []
    for t in inputs:
        t = t.to(ctx.device)
        out.append(t.to(ctx.dtype) if t.is_floating_point() else t)
    return tuple(out)


def module_for(bm: BenchModel, ctx: Context) -> torch.nn.Module:
    return bm.build().to(device=ctx.device, dtype=ctx.dtype)


def torch_dynamic_shapes(bm: BenchModel) -> dict:
    dims: dict = {}
    out = {}
    for name, spec in bm.dynamic_shapes.items():
        out[name] = {}
        for d, (sym, lo, hi) in spec.items():
            dims.setdefault(sym, torch.export.Dim(sym, min=lo, max=hi))
            out[name][d] = dims[sym]
    return out


def _weights_file(bm: BenchModel, ctx: Context) -> Path:
    """The module's weights as safetensors, so a cold-start process loads them as a server would."""
    from safetensors.torch import save_file

    path = ctx.workdir / f"{bm.name}-{str(ctx.dtype).split('.')[-1]}.safetensors"
    if not path.exists():
        state = {k: v.detach().cpu().contiguous().clone() for k, v in module_for(bm, Context("cpu", 1, ctx.workdir, ctx.dtype))
                 .state_dict().items()}
        save_file(state, str(path))
    return path


COLD_PRELUDE = """import time, json, resource, sys
t0 = time.perf_counter()
"""
COLD_EPILOGUE = """
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
dev = None
if "torch" in sys.modules and sys.modules["torch"] is not None and sys.modules["torch"].cuda.is_available():
    dev = sys.modules["torch"].cuda.max_memory_allocated() / 2**20
print(json.dumps({"seconds": seconds, "peak_rss_mb": rss, "peak_device_mb": dev}))
"""


def _torch_inputs(ctx: Context, inputs_npz: Path) -> str:
    """Cold-start source that loads the saved inputs as tensors on the device, in the benchmark's dtype."""
    return f"""data = np.load({str(inputs_npz)!r})
xs = [torch.from_numpy(data[k]).to({ctx.device!r}) for k in sorted(data.files)]
xs = [x.to({ctx.dtype}) if x.is_floating_point() else x for x in xs]
"""


def _torch_sync(ctx: Context) -> str:
    return "torch.cuda.synchronize()\n" if ctx.device == "cuda" else ""


def _amp_code(ctx: Context) -> str:
    if ctx.precision is None:
        return "contextlib.nullcontext()"
    return f"torch.autocast({ctx.device!r}, dtype={AMP_DTYPES[ctx.precision]})"


def _torch_cold(bm: BenchModel, ctx: Context, inputs_npz: Path, make: str) -> str:
    return COLD_PRELUDE + f"""
import contextlib, torch, numpy as np
sys.path.insert(0, {str(ROOT)!r})
from bench.models import get
from safetensors.torch import load_file
torch.set_num_threads({ctx.threads})
bm = get({bm.name!r})
m = bm.build()
m.load_state_dict(load_file({str(_weights_file(bm, ctx))!r}), strict=False)
m = m.to(device={ctx.device!r}, dtype={ctx.dtype})
""" + _torch_inputs(ctx, inputs_npz) + f"""{make}
with torch.no_grad(), {_amp_code(ctx)}:
    y = run(*xs)
""" + _torch_sync(ctx) + COLD_EPILOGUE


class Eager:
    name = "eager"

    def build(self, bm, ctx) -> Built:
        m = module_for(bm, ctx)
        size = sum(t.numel() * t.element_size() for t in m.state_dict().values())
        return Built(0.0, size, extra={"module": m})

    def load(self, built, bm, ctx):
        m = built.extra["module"]
        return under_amp(lambda *xs: m(*xs), ctx)

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        return _torch_cold(bm, ctx, inputs_npz, "run = m")

    def activation_peak(self, built, bm, ctx, batch: int) -> int | None:
        """Measured: the most bytes the forward's own tensors hold at once (CPU only)."""
        from .memory import eager_activation_peak

        if ctx.device != "cpu" or ctx.precision is not None:
            return None
        return eager_activation_peak(built.extra["module"], to_device(bm.inputs(batch), ctx))


class Compile:
    """torch.compile; the build time is the first call's (compilation happens there)."""

    def __init__(self, mode: str | None = None):
        self.mode = mode
        self.name = "torch.compile" + (f"({mode})" if mode else "")

    def build(self, bm, ctx) -> Built:
        m = module_for(bm, ctx)
        fn = under_amp(torch.compile(m, mode=self.mode), ctx)
        xs = to_device(bm.inputs(1), ctx)
        t0 = time.perf_counter()
        with torch.no_grad():
            fn(*xs)
        _sync(ctx)
        return Built(time.perf_counter() - t0, None, extra={"fn": fn})

    def load(self, built, bm, ctx):
        return built.extra["fn"]

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        mode = repr(self.mode)
        return _torch_cold(bm, ctx, inputs_npz, f"run = torch.compile(m, mode={mode})")


class AOTInductor:
    name = "AOTInductor"

    def build(self, bm, ctx) -> Built:
        m = module_for(bm, ctx)
        xs = to_device(bm.inputs(2), ctx)
        path = ctx.workdir / f"{bm.name}-{precision_label(ctx)}-{ctx.device}.pt2"
        shapes = torch_dynamic_shapes(bm)
        auto = {n: {d: torch.export.Dim.AUTO for d in spec} for n, spec in bm.dynamic_shapes.items()}
        if ctx.precision is not None:  # exported under autocast: the wrapper's forward takes the inputs as *xs
            names = list(inspect.signature(m.forward).parameters)[:len(xs)]
            shapes, auto = ((tuple(shapes.get(n) for n in names),), (tuple(auto.get(n) for n in names),))
            m = _Autocast(m, ctx.device, AMP_DTYPES[ctx.precision])
        t0 = time.perf_counter()
        note = None
        with torch.no_grad():
            try:
                ep = torch.export.export(m, xs, dynamic_shapes=shapes)
            except torch._dynamo.exc.UserError as e:  # e.g. CUDA SDPA wants seq % 8: let export choose
                note = f"exported with Dim.AUTO after: {str(e).splitlines()[0]}"
                ep = torch.export.export(m, xs, dynamic_shapes=auto)
            torch._inductor.aoti_compile_and_package(ep, package_path=str(path))
        return Built(time.perf_counter() - t0, path.stat().st_size, path, extra={"note": note} if note else {})

    def load(self, built, bm, ctx):
        return torch._inductor.aoti_load_package(str(built.artifact))

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        return COLD_PRELUDE + f"""
import torch, numpy as np
torch.set_num_threads({ctx.threads})
run = torch._inductor.aoti_load_package({str(built.artifact)!r})
""" + _torch_inputs(ctx, inputs_npz) + "y = run(*xs)\n" + _torch_sync(ctx) + COLD_EPILOGUE


class OnnxRuntime:
    """ONNX Runtime on the file `tcexport --onnx` writes for the same model."""

    name = "onnxruntime"
    float32_only = True

    def build(self, bm, ctx) -> Built:
        from tcexport.exporter.front.dynamic import SymbolSpec, to_torch_dynamic_shapes
        from tcexport.exporter.front.model_file import ModelSpec, forward_input_names
        from tcexport.exporter.check.onnx import export_onnx_bytes, write_onnx

        _require_float32(self.name, ctx)
        if ctx.device == "cuda":  # before the export, which takes minutes for a large model
            self._check_cuda_provider()
        m = bm.build()
        xs = bm.inputs(2)
        names = forward_input_names(m, len(xs))
        symbols = {s: SymbolSpec(s, lo, hi) for spec in bm.dynamic_shapes.values() for s, lo, hi in spec.values()}
        places = {n: {d: s for d, (s, _, _) in spec.items()} for n, spec in bm.dynamic_shapes.items()}
        t0 = time.perf_counter()
        shapes = to_torch_dynamic_shapes(names, xs, symbols, places)
        data, _ = export_onnx_bytes(ModelSpec(Path(bm.name), m, xs, names, None), shapes)
        path = write_onnx(data, ctx.workdir / f"{bm.name}.onnx")
        return Built(time.perf_counter() - t0, path.stat().st_size, path, extra={"names": names})

    @staticmethod
    def _check_cuda_provider() -> None:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("onnxruntime here has no CUDAExecutionProvider (install onnxruntime-gpu)")

    def _session(self, path, ctx):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = ctx.threads
        opts.inter_op_num_threads = 1
        providers = ["CUDAExecutionProvider"] if ctx.device == "cuda" else ["CPUExecutionProvider"]
        if ctx.device == "cuda":
            self._check_cuda_provider()
        return ort.InferenceSession(str(path), opts, providers=providers)

    def load(self, built, bm, ctx):
        sess = self._session(built.artifact, ctx)
        names = [i.name for i in sess.get_inputs()]
        return lambda *xs: sess.run(None, {n: x.cpu().numpy() for n, x in zip(names, xs)})[0]

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        return COLD_PRELUDE + f"""
import numpy as np, onnxruntime as ort
opts = ort.SessionOptions()
opts.intra_op_num_threads = {ctx.threads}
opts.inter_op_num_threads = 1
sess = ort.InferenceSession({str(built.artifact)!r}, opts, providers=["CPUExecutionProvider"])
data = np.load({str(inputs_npz)!r})
names = [i.name for i in sess.get_inputs()]
y = sess.run(None, {{n: data[k] for n, k in zip(names, sorted(data.files))}})
""" + COLD_EPILOGUE


class OpenVino:
    """OpenVINO on the CPU, from the same ONNX file ONNX Runtime runs (written here when that backend has not run),
    in float32 (``INFERENCE_PRECISION_HINT`` f32: on CPUs with bf16 units OpenVINO would otherwise compute in bf16;
    the IR is saved without OpenVINO's default fp16 weight compression), ``INFERENCE_NUM_THREADS`` = threads,
    latency hint (one stream), dynamic batch as the ONNX file declares it. Threads are not pinned to cores, as no
    other backend's are (pinned, its mobilenetv3-small call took 3x longer on a shared 2-core machine)."""

    name = "openvino"
    float32_only = True

    def build(self, bm, ctx) -> Built:
        _require_float32(self.name, ctx)
        if ctx.device != "cpu":
            raise NotImplementedError("the OpenVINO backend is benchmarked on the CPU only")
        try:
            import openvino as ov
        except ImportError as e:
            raise RuntimeError("openvino is not installed here (pip install openvino)") from e
        onnx = ctx.workdir / f"{bm.name}.onnx"
        t0 = time.perf_counter()
        note = None
        if onnx.exists():
            note = "converted from onnxruntime's ONNX file: build s is the conversion only"
        else:
            onnx = OnnxRuntime().build(bm, ctx).artifact
        xml = ctx.workdir / f"{bm.name}-openvino.xml"
        ov.save_model(ov.convert_model(str(onnx)), str(xml), compress_to_fp16=False)
        size = xml.stat().st_size + xml.with_suffix(".bin").stat().st_size
        return Built(time.perf_counter() - t0, size, xml, extra={"note": note} if note else {})

    @staticmethod
    def config(ctx: Context) -> dict:
        return {"INFERENCE_NUM_THREADS": ctx.threads, "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
                "ENABLE_CPU_PINNING": False}

    def load(self, built, bm, ctx):
        import openvino as ov

        compiled = ov.Core().compile_model(str(built.artifact), "CPU", self.config(ctx))
        local = threading.local()  # an infer request serves one caller at a time: one per calling thread

        def run(*xs):
            if not hasattr(local, "request"):
                local.request = compiled.create_infer_request()
            out = local.request.infer([x.cpu().numpy() for x in xs])
            return out[compiled.output(0)]
        return run

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        return COLD_PRELUDE + f"""
import numpy as np, openvino as ov
compiled = ov.Core().compile_model({str(built.artifact)!r}, "CPU", {self.config(ctx)!r})
data = np.load({str(inputs_npz)!r})
y = compiled([data[k] for k in sorted(data.files)])
""" + COLD_EPILOGUE


class Tcpkg:
    """The `.tcpkg` package, built with a fresh kernel cache so the build time includes the C++ compile."""

    name = "tcpkg"

    def build(self, bm, ctx) -> Built:
        from tcexport.exporter import export

        name = package_name(bm, ctx)
        if ctx.packages is not None:  # built elsewhere: the build figure comes from that machine's run
            path = ctx.packages / name
            if not path.is_file():
                raise FileNotFoundError(f"no prebuilt package {path}; build it with --build-packages {ctx.packages}")
            return Built(float("nan"), path.stat().st_size, path)
        m = bm.build()
        path = ctx.workdir / name
        # this GPU's arch when there is one; sm_90 when building on a CPU-only machine for a later GPU run
        target = "cpu" if ctx.device == "cpu" else \
            "cuda:sm_%d%d" % (torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0))
        t0 = time.perf_counter()
        dump = ctx.workdir / f"dump-{bm.name}-{os.getpid()}"
        xs = tuple(x.to(ctx.dtype) if x.is_floating_point() else x for x in bm.inputs(2))
        pkg = export(m.to(ctx.dtype), xs, dynamic_shapes=bm.dynamic_shapes, targets=(target,),
                     cache_dir=ctx.workdir / f"cache-{bm.name}-{os.getpid()}-{time.time_ns()}",
                     autotune=bool(ctx.autotune_at), autotune_at=ctx.autotune_at,
                     dump=dump if ctx.autotune_at else None, precision=ctx.precision)
        pkg.save(path)
        # the tuning's summary line (the whole report is in the dump's autotune.txt)
        note = (dump / "autotune.txt").read_text().splitlines()[-1] if ctx.autotune_at else ""
        return Built(time.perf_counter() - t0, path.stat().st_size, path, extra={"note": note} if note else {})

    def load(self, built, bm, ctx):
        import tcexport.loader as L

        model = L.load(built.artifact, device=ctx.device, num_threads=ctx.threads)
        return lambda *xs: model(*xs)

    def activation_peak(self, built, bm, ctx, batch: int) -> int | None:
        """Planned: the manifest's peak (workspace + outputs) at this batch's symbol values."""
        from tcexport.formats.expr import evaluate
        from tcexport.loader.archive import open_archive
        from tcexport.loader.guards import GuardPlan

        if ctx.dtype != torch.float32:  # the guards want 16-bit arrays, which numpy lacks
            return None
        manifest = open_archive(built.artifact).manifest
        env = GuardPlan(manifest).check([x.numpy() for x in bm.inputs(batch)])
        return evaluate(manifest.plan["peak_bytes"], env) if "peak_bytes" in manifest.plan else None

    def cold_start_code(self, built, bm, ctx, inputs_npz) -> str:
        return COLD_PRELUDE + f"""
sys.modules["torch"] = None  # a server without torch
import numpy as np
import tcexport.loader as L
m = L.load({str(built.artifact)!r}, device={ctx.device!r}, num_threads={ctx.threads})
data = np.load({str(inputs_npz)!r})
y = m(*[data[k] for k in sorted(data.files)])
""" + COLD_EPILOGUE


def package_name(bm: BenchModel, ctx: Context) -> str:
    return f"{bm.name}-{precision_label(ctx)}-{ctx.device}.tcpkg"


def _sync(ctx: Context) -> None:
    if ctx.device == "cuda":
        torch.cuda.synchronize()


def not_measured(backend, ctx: Context) -> str | None:
    """Why ``backend`` has no row in this run by design (shown as n/a, not as a failure), or None."""
    if getattr(backend, "float32_only", False) and (ctx.dtype != torch.float32 or ctx.precision is not None):
        return f"n/a: {backend.name} runs float32 models only (this run is {precision_label(ctx)})"
    return None


def _require_float32(name: str, ctx: Context) -> None:
    if ctx.dtype != torch.float32 or ctx.precision is not None:
        raise NotImplementedError(f"{name} is benchmarked on the float32 model only (this run is "
                                  f"{precision_label(ctx)}); its row stays empty by design")


def backends_for(device: str, zoo: bool = False) -> list:
    """The backends a suite compares; the zoo suites add OpenVINO on the CPU and max-autotune on the GPU."""
    if device == "cuda":
        return [Eager(), Compile(), Compile("reduce-overhead"), *([Compile("max-autotune")] if zoo else []),
                AOTInductor(), OnnxRuntime(), Tcpkg()]
    return [Eager(), Compile(), AOTInductor(), OnnxRuntime(), *([OpenVino()] if zoo else []), Tcpkg()]


def as_numpy(y) -> np.ndarray:
    if isinstance(y, (tuple, list)):
        y = y[0]
    if isinstance(y, torch.Tensor):
        return y.detach().float().cpu().numpy() if y.dtype == torch.bfloat16 else y.detach().cpu().numpy()
    return np.asarray(y)
