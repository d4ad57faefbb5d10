"""Convert call inputs to C-contiguous numpy arrays, and outputs back to the caller's kind, without torch.

Torch CPU tensors arrive through their own ``.numpy()`` (zero copy) and leave through ``torch.from_numpy``
looked up in ``sys.modules``: if the caller passed a torch tensor, torch is already imported, so the loader
never imports it itself. Other array libraries come in through DLPack or ``__array__``. bfloat16 travels as
uint16 bits tagged with dtypes.BFLOAT16 (numpy has no bfloat16); a torch bfloat16 tensor crosses as an int16
view of the same memory (every torch has int16 in ``.numpy()``; ``.numpy()`` costs a third of DLPack).

This runs on every call, so the torch paths avoid what costs a microsecond there: ``t.device.type`` (builds a
device object; ``t.is_cpu`` does not), ``str(t.dtype)``, a second pass over the inputs, and ``dtype.name`` on the
way out (numpy builds that string each time; only a tagged dtype, i.e. one with metadata, needs its name).
"""

from __future__ import annotations

import sys

import numpy as np

from tcexport.formats.errors import DtypeError, TargetError

from .dtypes import BFLOAT16, dtype_name


def _torch_tensor_type():
    """torch.Tensor if torch is imported, else None: without torch in sys.modules no input can be a tensor."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def is_torch_tensor(value) -> bool:
    tensor = _torch_tensor_type()
    return tensor is not None and isinstance(value, tensor)


def to_numpy(value, name: str) -> np.ndarray:
    """One input as an aligned C-contiguous numpy array (copied only if needed); never changes its dtype."""
    if isinstance(value, np.ndarray):
        arr = value
    elif is_torch_tensor(value):
        arr = _from_torch(value, name)
    else:
        arr = _from_other(value, name)
    return contiguous(arr)


def contiguous(arr: np.ndarray) -> np.ndarray:
    """C-contiguous and aligned, copied only when needed; 0-d stays 0-d (np.ascontiguousarray makes it 1-d)."""
    flags = arr.flags
    if flags.c_contiguous and flags.aligned:
        return arr
    return np.array(arr, order="C", copy=True)


def _from_other(value, name: str) -> np.ndarray:
    """Any non-numpy, non-torch array: DLPack first (zero copy), then the array protocol."""
    if hasattr(value, "__dlpack__"):
        return np.from_dlpack(value)
    if hasattr(value, "__array__"):
        return np.asarray(value)
    raise DtypeError(f"input {name!r}: expected a numpy array or a tensor, got {type(value).__name__}. "
                     f"Pass an array with an explicit dtype, e.g. np.asarray(x, dtype='float32').",
                     input=name, expected="array", got=type(value).__name__, rule="type")


def _from_torch(t, name: str) -> np.ndarray:
    """A CPU tensor's memory as numpy; bfloat16 as tagged uint16 bits."""
    if not t.is_cpu:
        raise TargetError(f"input {name!r} is on device {t.device}; this model runs on cpu. Pass {name}.cpu(), "
                          f"or load a package built for that device.")
    torch = sys.modules["torch"]
    if t.dtype is torch.bfloat16:
        return _tensor_numpy(t.view(torch.int16)).view(BFLOAT16)
    return _tensor_numpy(t)  # zero-copy like DLPack on CPU, at a quarter of its per-call cost


def _tensor_numpy(t) -> np.ndarray:
    """``t.numpy()``; grad is checked first because torch's C++ exceptions cost ~8 us a call, the lazy conj/neg
    views (complex tensors only) are left to numpy()'s RuntimeError."""
    if t.requires_grad:
        t = t.detach()
    try:
        return t.numpy()
    except RuntimeError:
        return t.resolve_conj().resolve_neg().numpy()


def convert_inputs(values, names) -> tuple[list[np.ndarray], bool]:
    """All inputs as numpy arrays, and whether any came as a torch tensor (then outputs go back as torch).
    One pass; a CPU tensor that is not bfloat16 goes straight to ``.numpy()``."""
    torch = sys.modules.get("torch")
    tensor, bf16 = (torch.Tensor, torch.bfloat16) if torch is not None else (None, None)
    arrays = []
    as_torch = False
    for v, n in zip(values, names):
        if type(v) is np.ndarray:
            arr = v
        elif tensor is not None and isinstance(v, tensor):
            as_torch = True
            arr = _tensor_numpy(v) if v.is_cpu and v.dtype is not bf16 else _from_torch(v, n)
        elif isinstance(v, np.ndarray):
            arr = v
        else:
            arr = _from_other(v, n)
        flags = arr.flags
        arrays.append(arr if flags.c_contiguous and flags.aligned else contiguous(arr))
    return arrays, as_torch


def to_torch(arr: np.ndarray):
    """A numpy output as a torch tensor sharing its memory; only called when torch is already imported."""
    torch = sys.modules["torch"]
    if arr.dtype.metadata is None:   # untagged: a dtype torch.from_numpy knows
        return torch.from_numpy(arr)
    if dtype_name(arr.dtype) == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def convert_outputs(arrays: list[np.ndarray], as_torch: bool) -> list:
    return [to_torch(a) for a in arrays] if as_torch else arrays
