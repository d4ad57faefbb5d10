"""The GPU test models and their shapes; ``python tests/gpu_packages.py DIR [TARGETS]`` builds their packages
on any machine (no GPU needed), for test_cuda_gpu.py to run elsewhere with TCEXPORT_PREBUILT=DIR."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "examples"

# name -> (model file, [input shapes per call]); shapes include the ends of each symbol's range
MODELS = {
    "mlp": (EXAMPLES / "mlp.py", [[(1, 64)], [(7, 64)], [(1024, 64)]]),
    "decoder": (EXAMPLES / "decoder.py", [[(1, 1)], [(3, 17)], [(16, 128)]]),
    "cnn": (EXAMPLES / "cnn.py", [[(1, 3, 32, 32)], [(5, 3, 32, 32)]]),
    "attention": (HERE / "models" / "attention.py", [[(1, 1, 16)], [(3, 5, 16)], [(16, 64, 16)]]),
    "hf_gpt2": (HERE / "models" / "hf_gpt2.py", [[(1, 1)], [(3, 17)], [(16, 128)]]),
    "hf_bert": (HERE / "models" / "hf_bert.py", [[(1, 1), (1, 1)], [(3, 17), (3, 17)]]),
    "hf_llama": (HERE / "models" / "hf_llama.py", [[(1, 1)], [(3, 17)]]),
    # split-K (exporter/schedule/split_k.py) up to 256 rows = batch 32, the one GEMM from batch 33
    "long_k": (HERE / "models" / "long_k.py", [[(1, 8, 64)], [(32, 8, 64)], [(33, 8, 64)], [(64, 8, 64)]]),
    # bfloat16 (its own tolerance): persistent GEMMs with TMA loads over 256 rows, tiles up to 256
    "lm_head": (HERE / "models" / "lm_head.py", [[(1, 1, 64)], [(4, 64, 64)], [(5, 60, 64)], [(16, 64, 64)]]),
}
BFLOAT16 = {"lm_head"}


def build(name: str, folder: Path, targets: str) -> Path:
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    out = Path(folder) / f"{name}.tcpkg"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    path = MODELS[name][0]
    spec = load_model_file(path)
    export(spec.module, spec.example_inputs, spec.dynamic_shapes, targets, name=name,
           source_path=str(path)).save(out)
    return out


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        print(build(name, folder, sys.argv[2] if len(sys.argv) > 2 else "cuda:sm_80,sm_90"), flush=True)
