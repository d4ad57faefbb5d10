"""Convert call inputs to C-contiguous numpy arrays, and outputs back to the caller's kind, without torch.

Torch CPU tensors arrive through their own ``.numpy()`` (zero copy) and leave through ``torch.from_numpy``
looked up in ``sys.modules``: if the caller passed a torch tensor, torch is already imported, so the loader
never imports it itself. Other array libraries come in through DLPack or ``__array__``. bfloat16 travels as
uint16 bits tagged with dtypes.BFLOAT16 (numpy has no bfloat16); a torch bfloat16 tensor crosses as an int16
view of the same memory (every torch has int16 in ``.numpy()``; ``.numpy()`` costs a third of DLPack).
"""

from __future__ import annotations

import sys

import numpy as np

from tcexport.formats.errors import DtypeError, TargetError

from .dtypes import BFLOAT16, dtype_name


def is_torch_tensor(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__")


def to_numpy(value, name: str) -> np.ndarray:
    """One input as an aligned C-contiguous numpy array (copied only if needed); never changes its dtype."""
    if type(value) is np.ndarray:
        if value.flags.c_contiguous and value.flags.aligned:
            return value
        arr = value
    elif isinstance(value, np.ndarray):
        arr = value
    elif is_torch_tensor(value):
        arr = _from_torch(value, name)
    elif hasattr(value, "__dlpack__"):
        arr = np.from_dlpack(value)
    elif hasattr(value, "__array__"):
        arr = np.asarray(value)
    else:
        raise DtypeError(f"input {name!r}: expected a numpy array or a tensor, got {type(value).__name__}. "
                         f"Pass an array with an explicit dtype, e.g. np.asarray(x, dtype='float32').",
                         input=name, expected="array", got=type(value).__name__, rule="type")
    if not (arr.flags.c_contiguous and arr.flags.aligned):
        arr = np.array(arr, order="C", copy=True)   # np.ascontiguousarray would turn 0-d into 1-d
    return arr


def _from_torch(t, name: str) -> np.ndarray:
    device = getattr(t.device, "type", "cpu")
    if device != "cpu":
        raise TargetError(f"input {name!r} is on device {t.device}; this model runs on cpu. Pass {name}.cpu(), "
                          f"or load a package built for that device.")
    if getattr(t, "requires_grad", False):
        t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if str(t.dtype) == "torch.bfloat16":
        torch = sys.modules["torch"]
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()  # zero-copy like DLPack on CPU, at a quarter of its per-call cost


def convert_inputs(values, names) -> tuple[list[np.ndarray], bool]:
    """All inputs as numpy arrays, and whether any came as a torch tensor (then outputs go back as torch)."""
    as_torch = any(type(v) is not np.ndarray and is_torch_tensor(v) for v in values)
    return [to_numpy(v, n) for v, n in zip(values, names)], as_torch


def to_torch(arr: np.ndarray):
    """A numpy output as a torch tensor sharing its memory; only called when torch is already imported."""
    torch = sys.modules["torch"]
    if dtype_name(arr.dtype) == "bfloat16":
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def convert_outputs(arrays: list[np.ndarray], as_torch: bool) -> list:
    return [to_torch(a) for a in arrays] if as_torch else arrays
