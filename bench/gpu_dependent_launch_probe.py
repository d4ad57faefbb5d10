"""Probe (`python -m bench.gpu_dependent_launch_probe` on a GPU machine, sm_90+): where a kernel lets the next one
launch (programmatic dependent launch, codegen_triton.DEPENDENT_HEAD / DEPENDENT_TAIL). GPT-2 small bf16 is exported
three times: the trigger after the last store (what the code does), right after the wait at the top, and nowhere
(the wait only: the next kernel launches when this one exits); each is timed at batches 1 and 8 (the harness's
time_calls: CUDA events, median of 60; three interleaved rounds) against ordinary graph edges. Results:
bench/results/nvidia-h200-2026-11-30-late-gpt2-call-path.md."""
import os, sys, time
sys.path.insert(0, os.getcwd())
import torch
from bench.models import get
from tcexport.exporter import export
from tcexport.exporter.cuda import codegen as codegen_triton
import tcexport.loader as L
from bench.run import compare_interleaved

bm = get("gpt2-small")
HEAD, TAIL = list(codegen_triton.DEPENDENT_HEAD), list(codegen_triton.DEPENDENT_TAIL)
PLACES = {"after the last store": (HEAD, TAIL), "at the top": (HEAD + TAIL[1:], []), "none": (HEAD, [])}


def build(place: str) -> str:
    codegen_triton.DEPENDENT_HEAD, codegen_triton.DEPENDENT_TAIL = PLACES[place]
    try:
        t0 = time.perf_counter()
        pkg = export(bm.build().to(torch.bfloat16), bm.inputs(2), dynamic_shapes=bm.dynamic_shapes,
                     targets=("cuda:sm_90",), cache_dir="/tmp/tccache")
    finally:
        codegen_triton.DEPENDENT_HEAD, codegen_triton.DEPENDENT_TAIL = HEAD, TAIL
    path = f"/tmp/gpt2_{place.replace(' ', '_')}.tcpkg"
    pkg.save(path)
    print(f"trigger {place}: export {time.perf_counter() - t0:.1f} s", flush=True)
    return path


paths = {place: build(place) for place in PLACES}
models = {f"trigger {place}": L.load(path, device="cuda") for place, path in paths.items()}
models["ordinary edges"] = L.load(paths["after the last store"], device="cuda", dependent_launch=False)
inputs = {batch: bm.inputs(batch)[0].cuda() for batch in (1, 8)}
compare_interleaved(models, inputs)
want = models["ordinary edges"](inputs[8])
for name, m in models.items():
    assert torch.equal(m(inputs[8]), want), name  # the same kernels, so the same bits
