"""Drives op_db samples through the whole pipeline: export → package → load → run torch-free → compare.

Exporting costs about a second per package (torch.export + g++), so samples are batched: one module whose forward
runs many samples (of many ops) and returns all their results as one flat tuple. A batch that fails to export is
split in halves until the failing samples are isolated, so one bad sample never hides the others' results.
Samples listed in expected_failures.py are exported in their own batches (one per op and dtype), so a known gap
costs no bisection of the big batches.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.utils._pytree as pytree

from claimed_ops import CLAIMED, SAMPLES_PER_DTYPE, SAMPLES_PER_OP
from expected_failures import EXPECTED_FAILURES, XFail

DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "bool": torch.bool}
SUPPORTED = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
             torch.int8, torch.uint8, torch.bool}
# (rtol, atol) against eager in the same dtype; a float32 / 16-bit float result that misses is still accepted when
# it is at least as close to the float64 reference as eager's own result is (times a small factor). The 16-bit
# floats take torch.testing's defaults for them (torch.testing._comparison._DTYPE_PRECISIONS): eager rounds every
# op's result while fused kernels keep float32 between ops, so the two differ by a rounding or two.
TOLERANCE = {"float32": (1.3e-5, 1e-5), "float64": (1e-7, 1e-7), "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5)}
REF_FACTOR = 4.0
REFERENCED = ("float32", "float16", "bfloat16")  # dtypes whose cases also get a float64 reference
WORK = Path(tempfile.mkdtemp(prefix="tcexport-opinfo-"))
# "cpu" (default): packages built for and run on the CPU. "triton-interpreter": the same samples through the GPU
# backend (Triton source, no cubins), run in Triton's CPU interpreter: TCEXPORT_OPS_BACKEND=triton-interpreter.
# "cuda": packages with cubins for this machine's GPU (cuda:sm_XY from torch), loaded with device="cuda" and called
# with torch CUDA tensors. TCEXPORT_OPS_CUDA_ARCH=sm_90 names the arch instead; without a GPU the packages are then
# only built (outcome "built"), which finds Triton compile failures on a CPU-only machine.
BACKEND = os.environ.get("TCEXPORT_OPS_BACKEND", "cpu")
BACKENDS = ("cpu", "triton-interpreter", "cuda")
BUILT: list = []  # build-only cuda batches: (package path, cases, input tensors), for gpu_table.py --save
os.environ.setdefault("TCEXPORT_CACHE", str(WORK / "cache"))


@dataclass
class Case:
    op: str      # op_db name, with ".variant" when it has one
    dtype: str
    index: int   # position among the op's usable samples
    fn: object
    sample: object
    description: str
    expected: object = None       # eager outputs (flat list of tensors)
    reference: object = None      # the same computed in float64 from the same inputs (float cases only)
    outcome: str = "not run"      # "pass" | "export: ..." | "run: ..." | "mismatch: ..."
    xfail: XFail | None = field(default=None)

    @property
    def name(self) -> str:
        return f"{self.op}[{self.dtype}]#{self.index}"


def _opinfos() -> dict:
    from torch.testing._internal.common_methods_invocations import op_db
    return {o.name + (f".{o.variant_test_name}" if o.variant_test_name else ""): o for o in op_db}


def describe(sample) -> str:
    """A stable text for a sample that expected_failures patterns match against (fnmatch)."""
    def one(x):
        if isinstance(x, torch.Tensor):
            return f"{str(x.dtype).replace('torch.', '')}[{','.join(map(str, x.shape))}]"
        if isinstance(x, (list, tuple)):
            inner = ",".join(one(y) for y in x)
            return f"[{inner}]" if isinstance(x, list) else f"({inner})"
        if isinstance(x, dict):
            return "{" + ",".join(f"{k}={one(v)}" for k, v in x.items()) + "}"
        return repr(x)
    return f"input={one(sample.input)} args={one(tuple(sample.args))} kwargs={one(dict(sample.kwargs))}"


def _usable(sample) -> bool:
    leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    first = pytree.tree_leaves(sample.input)
    if not tensors or not first or not isinstance(first[0], torch.Tensor):
        return False  # scalar-only inputs
    for t in tensors:
        if t.dtype not in SUPPORTED or t.layout != torch.strided or t.requires_grad or t.device.type != "cpu":
            return False
    for x in leaves:
        if isinstance(x, torch.device) and x.type != "cpu" or isinstance(x, str) and x.startswith("cuda"):
            return False
        if isinstance(x, torch.dtype) and x not in SUPPORTED:
            return False
    return True


def _flat_outputs(out):
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(isinstance(t, torch.Tensor) and t.dtype in SUPPORTED for t in leaves):
        return None
    return leaves


def _to_float64(x):
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def collect(op_names=None, dtypes=None) -> list[Case]:
    """Usable samples for every claimed (op, dtype), at most SAMPLES_PER_OP each, with eager results."""
    infos = _opinfos()
    cases = []
    for op in op_names or CLAIMED:
        info = infos[op]
        for dt in CLAIMED[op]:
            if dtypes and dt not in dtypes:
                continue
            tdt = DTYPES[dt]
            if tdt not in info.supported_dtypes("cpu"):
                continue
            torch.manual_seed(0)
            usable = []
            for s in info.sample_inputs("cpu", tdt, requires_grad=False):
                if _usable(s):
                    usable.append(s)
            n = SAMPLES_PER_DTYPE.get(dt, SAMPLES_PER_OP)
            picked = [usable[round(k * (len(usable) - 1) / max(n - 1, 1))]
                      for k in range(min(n, len(usable)))] if len(usable) > n else usable
            k = 0
            for s in _unique(picked):
                case = _make_case(op, dt, k, info, s)
                if case is not None:
                    cases.append(case)
                    k += 1
    return cases


def _unique(xs):
    seen, out = set(), []
    for x in xs:
        if id(x) not in seen:
            seen.add(id(x))
            out.append(x)
    return out


def _make_case(op, dt, k, info, s) -> Case | None:
    with warnings.catch_warnings():  # op_db samples include degenerate ones (std over one element, ...)
        warnings.simplefilter("ignore")
        return _make_case_quiet(op, dt, k, info, s)


def _make_case_quiet(op, dt, k, info, s) -> Case | None:
    try:
        with torch.no_grad():
            expected = _flat_outputs(info.op(s.input, *s.args, **s.kwargs))
    except Exception:
        return None
    if expected is None:
        return None
    case = Case(op, dt, k, info.op, s, describe(s), [t.clone() for t in expected])
    if dt in REFERENCED:
        ref_s = s.transform(_to_float64)
        with torch.no_grad():
            try:
                case.reference = _flat_outputs(info.op(ref_s.input, *ref_s.args, **ref_s.kwargs))
            except Exception:
                case.reference = None
    case.xfail = next((x for x in EXPECTED_FAILURES if x.matches(case.op, case.dtype, case.description)), None)
    return case


# ---------------------------------------------------------------------------------------------------------
# batching


class Batch(torch.nn.Module):
    """forward(*tensors) runs every case on its slice of the inputs and returns all outputs, flattened."""

    def __init__(self, cases: list[Case]):
        super().__init__()
        self.plans = []
        self.inputs = []
        for c in cases:
            leaves, spec = pytree.tree_flatten((c.sample.input, tuple(c.sample.args), dict(c.sample.kwargs)))
            slots = []
            for x in leaves:
                if isinstance(x, torch.Tensor):
                    slots.append(len(self.inputs))
                    self.inputs.append(x.detach().clone().contiguous())
                else:
                    slots.append(None)
            self.plans.append((c.fn, leaves, spec, slots))

    def forward(self, *tensors):
        outs = []
        for fn, leaves, spec, slots in self.plans:
            args = [tensors[s] if s is not None else x for x, s in zip(leaves, slots)]
            inp, a, kw = pytree.tree_unflatten(args, spec)
            outs.extend(pytree.tree_leaves(fn(inp, *a, **kw)))
        return tuple(outs)


def native_isa_only():
    """A context in which exports build only the ISA level the loader picks on this CPU: what runs is what is
    tested, at a third of the compile time (the ISA matrix itself is covered by the end-to-end tests)."""
    from unittest import mock

    from tcexport.exporter.cpu import build
    from tcexport.loader.native_cpu import cpu_flags

    flags = cpu_flags() or set()
    best = next((isa for isa in build.ISA_LEVELS if set(isa.requires) <= flags), build.ISA_LEVELS[-1])
    real = build.build_all
    return mock.patch.object(build, "build_all", lambda source, isas=None, cache_dir=None, **kw:
                             real(source, (best,), cache_dir, **kw))


def _split_or_record(cases, tag: str, stage: str, error: Exception) -> None:
    """A failing batch is halved until the failing sample stands alone; its outcome then records the error."""
    if len(cases) > 1:
        half = _split_point(cases)
        run_batch(cases[:half], tag + "a")
        run_batch(cases[half:], tag + "b")
        return
    cases[0].outcome = f"{stage}: {type(error).__name__}: {_first_lines(str(error))}"


def run_batch(cases: list[Case], tag: str) -> None:
    """Export, package, load and run ``cases`` as one module; on an export failure, split and retry."""
    from tcexport.exporter.pipeline import export
    import tcexport.loader as L

    if not cases:
        return
    if BACKEND not in BACKENDS:
        raise ValueError(f"TCEXPORT_OPS_BACKEND={BACKEND!r}; expected one of {', '.join(BACKENDS)}")
    module = Batch(cases)
    triton, cuda = BACKEND == "triton-interpreter", BACKEND == "cuda"
    target = "cuda:sm_90" if triton else f"cuda:{cuda_arch()}" if cuda else "cpu"
    try:
        pkg = export(module, tuple(module.inputs), None, target, name=f"opinfo_{tag}", build_cubins=not triton)
        path = WORK / f"{'' if BACKEND == 'cpu' else BACKEND + '_'}{tag}.tcpkg"  # never replace a mapped package
        pkg.save(path)
        if cuda and not torch.cuda.is_available():  # build-only (TCEXPORT_OPS_CUDA_ARCH on a CPU-only machine)
            for c in cases:
                c.outcome = "built"
            BUILT.append((path, cases, list(module.inputs)))
            return
        model = _interpreted(path) if triton else L.load(path, device="cuda") if cuda else L.load(path)
    except Exception as e:
        return _split_or_record(cases, tag, "export", e)
    try:
        if cuda:
            got = _run_cuda(model, module.inputs)
        else:
            got = model(*[_loader_array(t) for t in module.inputs])
    except Exception as e:
        if cuda and not _cuda_alive():
            raise CudaContextLost(f"batch {tag} ({', '.join(sorted({c.op for c in cases}))}) left the CUDA context "
                                  f"unusable, so no later batch can run: {type(e).__name__}: {_first_lines(str(e))}") from e
        return _split_or_record(cases, tag, "run", e)
    got = list(got) if isinstance(got, tuple) else [got]
    pos = 0
    for c in cases:
        n = len(c.expected)
        c.outcome = compare(c, got[pos:pos + n])
        pos += n


def cuda_arch() -> str:
    """The arch the cuda backend builds for: TCEXPORT_OPS_CUDA_ARCH, else this machine's GPU."""
    arch = os.environ.get("TCEXPORT_OPS_CUDA_ARCH")
    if arch:
        return arch
    if not torch.cuda.is_available():
        raise RuntimeError("TCEXPORT_OPS_BACKEND=cuda needs a CUDA GPU (or TCEXPORT_OPS_CUDA_ARCH=sm_XX to build only)")
    return "sm_%d%d" % torch.cuda.get_device_capability()


class CudaContextLost(RuntimeError):
    """A kernel broke the CUDA context (an illegal address, a trap): every later call fails, so the table stops."""


def _cuda_alive() -> bool:
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").add(1).item() == 2
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return False


def _run_cuda(model, inputs: list) -> list:
    """Inputs as torch CUDA tensors (bfloat16 included: the loader reads their memory); outputs (torch CUDA
    tensors) back as the numpy arrays compare() takes. A sticky CUDA error (an illegal address) would poison
    every later batch, so the call is synchronised here and such an error raised for this batch."""
    got = model(*[t.cuda() for t in inputs])
    torch.cuda.synchronize()
    got = list(got) if isinstance(got, tuple) else [got]
    return [_loader_array(g.cpu()) if isinstance(g, torch.Tensor) else np.asarray(g) for g in got]


def _interpreted(path):
    """The package's Triton kernels in Triton's CPU interpreter (a process of its own), called like a model."""
    from tcexport.exporter.check.interpret import run_interpreted

    def call(*arrays):
        outs = run_interpreted(path, [list(arrays)])[0]
        return tuple(outs) if len(outs) != 1 else outs[0]
    return call


def _loader_array(t: torch.Tensor) -> np.ndarray:
    """An input as the numpy array the loader takes: bfloat16 (no numpy dtype) as its tagged uint16 bits."""
    from tcexport.loader.dtypes import BFLOAT16

    return t.view(torch.uint16).numpy().view(BFLOAT16) if t.dtype == torch.bfloat16 else t.numpy()


def _float64(arr: np.ndarray) -> np.ndarray:
    """A loader output of a float dtype as float64 (bfloat16 bits widened by hand)."""
    from tcexport.loader.dtypes import dtype_name

    if dtype_name(arr.dtype) == "bfloat16":
        return (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def _split_point(cases: list[Case]) -> int:
    """Halve at an op boundary when there is one near the middle (failures are usually per op)."""
    mid = len(cases) // 2
    for d in range(len(cases) // 2):
        for k in (mid - d, mid + d):
            if 0 < k < len(cases) and cases[k].op != cases[k - 1].op:
                return k
    return mid


def _first_lines(text: str, n: int = 3) -> str:
    return " | ".join(line for line in text.strip().splitlines()[:n])


def compare(c: Case, got: list) -> str:
    if len(got) != len(c.expected):
        return f"mismatch: {len(got)} outputs, eager has {len(c.expected)}"
    from tcexport.loader.dtypes import dtype_name

    for k, (g, w) in enumerate(zip(got, c.expected)):
        g = np.asarray(g)
        got_dtype, want_dtype = dtype_name(g.dtype), str(w.dtype).replace("torch.", "")
        if g.shape != tuple(w.shape) or got_dtype != want_dtype:
            return f"mismatch: output {k} is {got_dtype}{list(g.shape)}, eager gives {want_dtype}{list(w.shape)}"
        if w.is_floating_point():
            ref = c.reference[k].double().numpy() if c.reference is not None else None
            msg = _close(_float64(g), w.double().numpy(), ref, want_dtype)
            if msg:
                return f"mismatch: output {k}: {msg}"
            continue
        w_np = w.numpy()
        if not np.array_equal(g, w_np):
            bad = np.argwhere(g != w_np)[:3].tolist()
            return f"mismatch: output {k} differs (exact dtype {w_np.dtype}) at {bad}"
    return "pass"


def _close(got, want, ref, dtype: str) -> str | None:
    rtol, atol = TOLERANCE.get(dtype, TOLERANCE["float32"])
    ok = np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
    if ok.all():
        return None
    if ref is not None:
        ours = np.abs(got - ref)
        theirs = np.abs(want - ref)
        near = (ours <= REF_FACTOR * theirs + atol + rtol * np.abs(ref)) | (np.isnan(got) & np.isnan(ref))
        ok = ok | near
        if ok.all():
            return None
    bad = np.argwhere(~ok)
    where = tuple(bad[0])
    diff = np.nanmax(np.abs(got - want)[~ok]) if want.size else math.nan
    return f"{len(bad)} of {want.size} elements off (max |diff| {diff:.3g}); first at {list(where)}: " \
           f"got {got[where]!r}, eager {want[where]!r}"


def run_all(cases: list[Case], group_size: int = 60, isolate=frozenset()) -> None:
    """Every case through the pipeline: known gaps (expected_failures.py, and the (op, dtype, index) keys in
    ``isolate``) batched per (op, dtype), the rest in large batches."""
    with native_isa_only():
        _run_all(cases, group_size, isolate)


def run_through(backend: str, cases: list[Case], group_size: int, isolate=frozenset()) -> list[Case]:
    """run_all with BACKEND set to ``backend`` for the run (and restored after); returns ``cases``."""
    global BACKEND
    previous, BACKEND = BACKEND, backend
    try:
        run_all(cases, group_size, isolate)
    finally:
        BACKEND = previous
    return cases


def _run_all(cases: list[Case], group_size: int, isolate=frozenset()) -> None:
    known = {}
    rest: dict[str, list] = {}
    for c in cases:
        if c.xfail is not None or (c.op, c.dtype, c.index) in isolate:
            known.setdefault((c.op, c.dtype), []).append(c)
        else:
            rest.setdefault(c.dtype, []).append(c)
    for dt, cs in rest.items():
        for g in range(0, len(cs), group_size):
            run_batch(cs[g:g + group_size], f"{dt}_{g // group_size}")
    for (op, dt), cs in known.items():
        run_batch(cs, f"xfail_{_tag(op)}_{dt}")


def _tag(op: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in op)
