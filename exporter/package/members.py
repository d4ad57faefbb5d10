"""Where each generated member lives in a `.tcpkg` archive (formats/SPEC.md lists them)."""

from __future__ import annotations

WEIGHTS_FILE = "weights.safetensors"
CPP_SOURCE = "src/cpu/model.cpp"
TRITON_SOURCE = "src/cuda/model_triton.py"
KERNELS_TEXT = "src/kernels.txt"
ONNX_FILE = "model.onnx"
STATE_FILE = "state.safetensors"


def cpu_library(isa: str) -> str:
    """The member of the CPU library built for ``isa``."""
    return f"kernels/cpu-{isa}.so"


def cubin(arch: int, folder: str, kernel: str) -> str:
    """The member of ``kernel``'s cubin for ``sm_<arch>``; ``folder`` ("" or "<entry>/") keeps training graphs'
    kernel names apart from the inference graph's."""
    return f"kernels/cuda-sm_{arch}/{folder}{kernel}.cubin"


def training_source(entry: str) -> str:
    """The member of a training graph's Triton source."""
    return f"src/cuda/training/{entry}.py"


def method_source(name: str) -> str:
    """The member of the Triton source of a method after the first (the first's is TRITON_SOURCE)."""
    return f"src/cuda/methods/{name}.py"


def method_cubins(name: str) -> str:
    """The folder (under kernels/cuda-sm_XX/) of the cubins of a method after the first."""
    return f"methods/{name}/"
