"""The torch-free loader: open, verify, guard and run a `.tcpkg` package.

    import tcexport.loader as L
    model = L.load("model.tcpkg")          # verifies every member, picks the kernels for this CPU
    y = model(x)                            # numpy arrays or torch tensors in, the same kind out

This package imports neither torch, triton, sympy, the exporter nor the packager.
"""

from tcexport.formats.manifest import TensorSpec

from .archive import Archive, open_archive
from .batcher import Batcher
from .guards import GuardPlan, bind_and_check
from .load import load
from .model import Model

__all__ = ["Archive", "Batcher", "GuardPlan", "Model", "TensorSpec", "bind_and_check", "load", "open_archive"]
