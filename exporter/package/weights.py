"""The model's weights as the archive's safetensors member, and as the manifest's weight specs."""

from __future__ import annotations

import numpy as np
import safetensors.numpy
import torch

from tcexport.formats.manifest import TensorSpec


def weights_bytes(g) -> bytes:
    """The weights under their public names, in safetensors form."""
    low, prog = g.lowering, g.program
    arrays = {low.public_names[name]: weight_array(low.weight_values[name]) for name in prog.weights}
    return safetensors.numpy.save(arrays)


def weight_specs(g) -> tuple:
    """Each weight's public name, dtype and (static) shape, in the program's weight order."""
    low, prog = g.lowering, g.program
    return tuple(TensorSpec(low.public_names[name], prog.buffers[name].dtype,
                            tuple(int(s) for s in low.weight_values[name].shape)) for name in prog.weights)


def weight_array(t: torch.Tensor) -> np.ndarray:
    """A weight as a contiguous numpy array for safetensors. numpy has no bfloat16: its bits go in as
    ml_dtypes.bfloat16 (installed with onnx, an export dependency), which safetensors labels BF16. The reshape keeps
    a 0-d weight 0-d: ``np.ascontiguousarray`` returns at least one dimension (Gemma's ``embed_scale`` was stored
    as [1], a package its loader refused)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return np.ascontiguousarray(t.view(torch.uint16).numpy()).view(ml_dtypes.bfloat16).reshape(t.shape)
    return np.ascontiguousarray(t.numpy()).reshape(t.shape)
