"""Manifest dtype names <-> numpy dtypes, derived from the format's one table (formats/dtypes.py).

numpy has no bfloat16, so bfloat16 tensors travel as uint16 bits whose dtype carries a metadata tag;
the guards read the tag, so a plain uint16 array is never silently taken for bfloat16. An array whose
dtype is named "bfloat16" (ml_dtypes) is accepted as well.
"""

from __future__ import annotations

import numpy as np

from tcexport.formats.dtypes import DTYPE_INFO

BFLOAT16 = np.dtype(np.uint16, metadata={"tcexport_dtype": "bfloat16"})

_NUMPY = {name: BFLOAT16 if name == "bfloat16" else np.dtype(info.numpy) for name, info in DTYPE_INFO.items()}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype the loader uses for a manifest dtype name (bfloat16: tagged uint16)."""
    return _NUMPY[name]


def dtype_name(dtype: np.dtype) -> str:
    """The manifest name of a numpy dtype, e.g. "float32"; bfloat16 bits report "bfloat16"."""
    tag = (dtype.metadata or {}).get("tcexport_dtype")
    return tag or dtype.name
