"""Option records, passed as values from the CLI or ``export()`` down to the stage that reads them: no stage reads
the process environment or a module global for a choice that changes what it generates, and every field of a
record that changes bytes is part of the cache key of what it builds."""

from __future__ import annotations

from dataclasses import dataclass

from tcexport.exporter.errors import ExportError

DEPENDENT_TRIGGERS = ("after_last_store", "top", "none")


@dataclass(frozen=True)
class CudaOptions:
    """How CUDA kernels are generated and built. The defaults are what ships; the other values exist for
    experiments (bench/probes/) and are recorded in the package like any other choice."""

    fp_fusion: bool = True                       # let Triton contract a*b+c into FMA (its enable_fp_fusion)
    tma: bool = True                             # persistent GEMMs reading through TMA descriptors where eligible
    dependent_trigger: str = "after_last_store"  # where a kernel lets the next one launch (programmatic dependent
                                                 # launch): after its last store, at its top, or never

    def __post_init__(self):
        if self.dependent_trigger not in DEPENDENT_TRIGGERS:
            raise ExportError(f"CudaOptions.dependent_trigger should be one of {DEPENDENT_TRIGGERS}, "
                             f"got {self.dependent_trigger!r}")
