"""The CPU's kernel list: the shared list, with each attention (scores GEMM, softmax, PV GEMM) fused into one kernel
(cpu/attention.py) where the C++ renderer takes it. The scores then never reach memory (a 1024-token prefill's
[4, 1024, 1088] scores per layer streamed through it three times, 38% of the call), masked blocks of keys are
skipped (a decode step or a short prompt over a static KV cache reads only the filled part), and one kernel
replaces three. Measured against the three kernels, 1 and 2 threads (scratch A/B, interleaved runs): a BERT-base
encoder 0.89-0.98x at 64-512 tokens, a Llama-style decoder over a 1088-entry cache 0.38x / 0.65x at prefill
128 / 1024 and 0.40x / 0.61x a decode step at context 128 / 1024. Heads wider than the renderer's stack blocks
keep the three kernels. A window sum with many clamped taps (a depthwise convolution) reads a zero-padded copy
of its input (pad_windows.py), and one over rows shorter than a vector runs along that copy's rows laid end to end
(window_planes.py); a convolution's GEMM reads its taps from a zero-padded copy of its input instead
of im2col's columns (window_gemm.py). A pointwise loop over a small map runs over its positions as one loop
(coalesce.py).
"""

from __future__ import annotations

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, verify_kernels
from tcexport.exporter.schedule.attention import attention_triples
from tcexport.exporter.schedule.coalesce import coalesce
from tcexport.exporter.schedule.pad_windows import pad_windows
from tcexport.exporter.schedule.window_gemm import window_gemm
from tcexport.exporter.schedule.window_planes import window_planes


def schedule_cpu(prog: ir.Program, kernels: list[Kernel], supported) -> list[Kernel]:
    """The CPU's kernel list (a new list; ``kernels`` stays the shared one the GPU schedules). ``supported``:
    whether the C++ renderer takes an attention kernel (cpu/attention.supported)."""
    out = list(kernels)
    for a, b, c, merged in attention_triples(prog, kernels):
        if supported(prog, merged):
            out[out.index(c)] = merged
            out.remove(a)
            out.remove(b)
    out = window_gemm(prog, out)
    out = pad_windows(prog, out)
    out = coalesce(prog, window_planes(prog, out))
    verify_kernels(out)
    return out
