"""Probe (`python -m bench.probes.dependent_launch` on a GPU machine, sm_90+): where a kernel lets the next one
launch (programmatic dependent launch: CudaOptions.dependent_trigger, exporter/options.py). GPT-2 small bf16 is
exported three times: the trigger after the last store (what ships), right after the wait at the top, and nowhere
(the wait only: the next kernel launches when this one exits); each is timed at batches 1 and 8 (the harness's
time_calls: CUDA events, median of 60; three interleaved rounds) against ordinary graph edges.

Results: bench/results/nvidia-h200-2026-11-30-late-gpt2-call-path.md."""
from __future__ import annotations

from bench.probes.common import export_gpt2, parser, require_gpu, work_folder

PLACES = {"after the last store": "after_last_store", "at the top": "top", "none": "none"}


def main(argv=None):
    args = parser(__doc__, work=True).parse_args(argv)
    require_gpu()
    import torch

    import tcexport.loader as L
    from bench.models import get
    from bench.run import compare_interleaved
    from tcexport.exporter.options import CudaOptions

    work = work_folder(args)
    paths = {place: export_gpt2(work / f"gpt2_{trigger}.tcpkg", work / "cache", CudaOptions(dependent_trigger=trigger),
                                label=f"trigger {place}")
             for place, trigger in PLACES.items()}
    models = {f"trigger {place}": L.load(path, device="cuda") for place, path in paths.items()}
    models["ordinary edges"] = L.load(paths["after the last store"], device="cuda", dependent_launch=False)
    bm = get("gpt2-small")
    inputs = {batch: bm.inputs(batch)[0].cuda() for batch in (1, 8)}
    compare_interleaved(models, inputs)
    want = models["ordinary edges"](inputs[8])
    for name, m in models.items():
        if not torch.equal(m(inputs[8]), want):  # the same kernels but for where they trigger: the same bits
            raise SystemExit(f"{name}: a different result from ordinary edges")


if __name__ == "__main__":
    main()
