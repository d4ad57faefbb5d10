"""The one table between manifest dtypes and the serving protocols' names for them.

KServe's Open Inference Protocol v2 names tensors' datatypes "FP32", "INT64", "BOOL", ...; Triton's model
configuration names the same types "TYPE_FP32", .... bfloat16 is "BF16" in both (Triton extends v2 with it); its
bytes travel as the raw 16 bits, as the loader holds them.
"""

from __future__ import annotations

from tcexport.formats.dtypes import DTYPE_INFO

_V2 = {
    "float64": "FP64", "float32": "FP32", "float16": "FP16", "bfloat16": "BF16",
    "int64": "INT64", "int32": "INT32", "int16": "INT16", "int8": "INT8", "uint8": "UINT8", "bool": "BOOL",
}
assert set(_V2) == set(DTYPE_INFO), "every manifest dtype needs a v2 name"

V2_DATATYPES = dict(_V2)                                  # manifest dtype -> v2 datatype
MANIFEST_DTYPES = {v: k for k, v in _V2.items()}          # v2 datatype -> manifest dtype


def v2_datatype(dtype: str) -> str:
    """The v2 datatype of a manifest dtype ("float32" -> "FP32")."""
    return V2_DATATYPES[dtype]


def triton_datatype(dtype: str) -> str:
    """Triton's model-configuration type of a manifest dtype ("float32" -> "TYPE_FP32")."""
    return "TYPE_" + V2_DATATYPES[dtype]


def manifest_dtype(datatype: str) -> str | None:
    """The manifest dtype of a v2 datatype name, or None for a name the packages cannot hold."""
    return MANIFEST_DTYPES.get(datatype)
