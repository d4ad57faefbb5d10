"""Manifest dtype names <-> numpy dtypes.

numpy has no bfloat16, so bfloat16 tensors travel as uint16 bits whose dtype carries a metadata tag;
the guards read the tag, so a plain uint16 array is never silently taken for bfloat16. An array whose
dtype is named "bfloat16" (ml_dtypes) is accepted as well.
"""

from __future__ import annotations

import numpy as np

BFLOAT16 = np.dtype(np.uint16, metadata={"tcexport_dtype": "bfloat16"})

_NUMPY = {
    "float64": np.dtype(np.float64), "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "bfloat16": BFLOAT16, "int64": np.dtype(np.int64), "int32": np.dtype(np.int32),
    "int16": np.dtype(np.int16), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "bool": np.dtype(np.bool_),
}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype the loader uses for a manifest dtype name (bfloat16: tagged uint16)."""
    return _NUMPY[name]


def dtype_name(dtype: np.dtype) -> str:
    """The manifest name of a numpy dtype, e.g. "float32"; bfloat16 bits report "bfloat16"."""
    tag = (dtype.metadata or {}).get("tcexport_dtype")
    return tag or dtype.name
