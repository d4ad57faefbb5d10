"""What the probes share instead of importing each other: the command-line options every probe has (a work folder
that defaults to a fresh temporary one, never a fixed /tmp path), the interpreter check of the `--check` modes,
GPT-2 small bf16 exported the way the probes compare it, a CUDA-graph timer, and where a probe's kernels run (GPU,
or the CPU interpreter). torch and triton are imported by the functions that need them: importing this does nothing."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def parser(doc: str, work: bool = False) -> argparse.ArgumentParser:
    """An argument parser whose description is the probe's docstring; ``work``: with the ``--work`` folder option
    (for a probe that writes packages)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if not work:
        return p
    p.add_argument("--work", type=Path, default=None,
                   help="folder for the packages and the kernel cache the probe writes (default: a fresh "
                        "temporary folder)")
    return p


def work_folder(args: argparse.Namespace) -> Path:
    """The probe's work folder: ``--work``, created if missing, or a fresh temporary folder (kept, and printed, so
    that its packages can be looked at or reused with ``--package``)."""
    if args.work is None:
        folder = Path(tempfile.mkdtemp(prefix="tcexport-probe-"))
        print(f"work folder: {folder}", flush=True)
        return folder
    args.work.mkdir(parents=True, exist_ok=True)
    return args.work


def add_check_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true",
                   help="correctness only, on small shapes on the CPU, in Triton's interpreter (run with "
                        "TRITON_INTERPRET=1)")


def require_interpreter() -> None:
    """`--check` runs the kernels in Triton's interpreter, which Triton chooses when a kernel is decorated (at the
    probe's import), so the variable must be set before Python starts, not here."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--check runs in Triton's interpreter: TRITON_INTERPRET=1 python -m bench.probes.NAME --check")


def require_gpu() -> None:
    """A probe times kernels on a GPU: say so on a machine without one, rather than fail deep inside torch."""
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("this probe runs on a CUDA GPU and there is none here (split_k, epilogue and ln_gemm "
                         "have a --check that runs on the CPU)")


def export_gpt2(path: Path, cache_dir: Path, cuda_options=None, label: str = "gpt2", **export_kw) -> Path:
    """GPT-2 small in bf16 (the harness's ``gpt2-small``: dynamic batch, 128 tokens), exported for sm_90 with
    ``cuda_options`` (a tcexport.exporter.options.CudaOptions; None: the defaults that ship) and saved to ``path``."""
    import torch

    from bench.models import get
    from tcexport.exporter import export

    bm = get("gpt2-small")
    if cuda_options is not None:
        export_kw["cuda_options"] = cuda_options
    t0 = time.perf_counter()
    pkg = export(bm.build().to(torch.bfloat16), bm.inputs(2), dynamic_shapes=bm.dynamic_shapes,
                 targets=("cuda:sm_90",), cache_dir=cache_dir, **export_kw)
    pkg.save(path)
    print(f"{label}: export {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return path


def graph_us(fns, reps: int = 30) -> float:
    """Median per-launch time, in us, of ``fns`` captured in one CUDA graph (replayed ``reps`` times)."""
    import torch

    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / len(fns))
    return sorted(ts)[len(ts) // 2]


def torch_allocator_for_triton() -> None:
    """Let Triton kernels that build TMA descriptors on the device (tl.make_tensor_descriptor) take their scratch
    from torch. This sets Triton's process-wide allocator, so a probe calls it from main(), never at import."""
    import torch
    import triton

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


@dataclass(frozen=True)
class Mode:
    """Where a probe's kernels run: on the GPU in bf16, timed; or (``check``) on the CPU in Triton's interpreter,
    in fp16 (the interpreter, Triton 3.9, misreads bf16 torch tensors), for correctness only."""

    check: bool = False

    @property
    def device(self) -> str:
        return "cpu" if self.check else "cuda"

    @property
    def dtype(self):
        import torch

        return torch.float16 if self.check else torch.bfloat16


def run_mode(args: argparse.Namespace) -> Mode:
    """The Mode ``--check`` (add_check_option) asks for, once this machine can run it: the interpreter for
    ``--check``, a GPU otherwise."""
    if args.check:
        require_interpreter()
    else:
        require_gpu()
    return Mode(args.check)
