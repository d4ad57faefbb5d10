"""timm and torchvision for the zoo (test and bench code only, never the product).

PyPI's torchvision wheel is a CUDA build: next to a CPU torch its C ops library does not load (it needs
libc10_cuda.so), and ``import torchvision`` then fails in its fake-kernel registrations of ``nms`` and ``qnms`` -- the
two registered with ``torch.library.register_fake`` instead of behind its ``_has_ops()`` check. Their model code needs
none of the C ops. ``define_missing_ops()`` defines those two schemas (no kernels: calling nms still fails, loudly)
so the import succeeds; the caller keeps the returned library alive for as long as torchvision is used.
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

INSTALL = "pip install timm torchvision (torchvision's CUDA wheel works next to a CPU torch: tests/zoo/vision_libs.py)"


def _c_ops_load(folder: Path) -> bool:
    for lib in folder.glob("_C*.so"):
        try:
            ctypes.CDLL(str(lib))
            return True
        except OSError:
            return False
    return False


def define_missing_ops():
    """Make ``import torchvision`` and ``import timm`` work; returns (library handle or None, None) or (None, why
    they are unavailable)."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or importlib.util.find_spec("timm") is None:
        return None, f"timm or torchvision is not installed ({INSTALL})"
    lib = None
    if not _c_ops_load(Path(spec.submodule_search_locations[0])):
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
    try:
        import timm  # noqa: F401
        import torchvision  # noqa: F401
    except Exception as e:  # a broken install of either: the zoo skips their models and says why
        return None, f"importing timm/torchvision failed: {type(e).__name__}: {e}"
    return lib, None


def unavailable(library: str, why: str | None) -> str | None:
    """Why a zoo model from ``library`` cannot run here (``why`` from define_missing_ops), or None: transformers'
    models always can."""
    return why if library != "transformers" else None
