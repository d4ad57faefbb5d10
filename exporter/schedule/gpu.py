"""The GPU's schedule, a stage of its own (``schedule_cuda``, dumped to schedule_cuda.txt) between the shared
kernel list and the Triton codegen: the GPU runs a kernel list of its own and a memory plan for it.

    kernels (fuse) → fuse_attention (schedule/attention.py) → split_kv (schedule/split_kv.py)
    → split_k (schedule/split_k.py) → plan_memory

The CPU keeps the shared list: its GEMMs are faster than a per-row attention loop, and one BLAS call fills its
cores at any row count. The GPU's list is what its launch list, its manifest entry and its workspace describe.
"""

from __future__ import annotations

from dataclasses import dataclass

from tcexport.exporter.ir import loops as ir
from tcexport.exporter.ir.kernels import Kernel, verify_kernels
from tcexport.exporter.schedule.attention import fuse_attention
from tcexport.exporter.schedule.memory import MemoryPlan, plan_memory
from tcexport.exporter.schedule.split_k import split_k
from tcexport.exporter.schedule.split_kv import split_kv


@dataclass
class GpuSchedule:
    kernels: list  # [Kernel]: the shared list with attention fused (keys split for few query rows) and long-K
                   # GEMMs split for few rows
    memory: MemoryPlan  # its workspace (no attention scores or probabilities; split-K's and split-KV's partials)

    def __str__(self):
        return "kernels:\n" + "\n".join(str(k) for k in self.kernels) + "\n\nmemory:\n" + str(self.memory)


def schedule_cuda(prog: ir.Program, kernels: list[Kernel]) -> GpuSchedule:
    """The GPU's kernel list and memory plan from the shared kernel list (left as it is; ``prog`` gains
    split-K's partial buffers)."""
    mine = split_k(prog, split_kv(prog, fuse_attention(prog, kernels)))
    verify_kernels(mine)
    return GpuSchedule(mine, plan_memory(prog, mine))
