"""The one table of tensor dtypes a `.tcpkg` may hold (SPEC §2): everything else derives from it.

A manifest names a dtype by its key here; safetensors headers use the code; numpy (the loader, without torch) uses
the numpy name, with bfloat16 travelling as uint16 bits (numpy has no bfloat16; loader/dtypes.py tags them). The
exporter's own tables (C types, Triton types, torch dtypes) are keyed by the same names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DtypeInfo:
    name: str          # the manifest's name
    itemsize: int      # bytes per element
    numpy: str         # numpy's name for the storage (bfloat16: "uint16", its bits)
    safetensors: str   # the safetensors header's code
    floating: bool


_ROWS = (  # name, itemsize, numpy storage, safetensors code, floating point
    ("float64", 8, "float64", "F64", True),
    ("float32", 4, "float32", "F32", True),
    ("float16", 2, "float16", "F16", True),
    ("bfloat16", 2, "uint16", "BF16", True),
    ("int64", 8, "int64", "I64", False),
    ("int32", 4, "int32", "I32", False),
    ("int16", 2, "int16", "I16", False),
    ("int8", 1, "int8", "I8", False),
    ("uint8", 1, "uint8", "U8", False),
    ("bool", 1, "bool", "BOOL", False),
)

DTYPE_INFO = {row[0]: DtypeInfo(*row) for row in _ROWS}
DTYPES = {name: info.itemsize for name, info in DTYPE_INFO.items()}  # name -> itemsize in bytes
SAFETENSORS_DTYPES = {info.safetensors: name for name, info in DTYPE_INFO.items()}  # header code -> name


def itemsize(name: str) -> int:
    """Bytes per element of manifest dtype ``name`` (KeyError for a name the format does not have)."""
    return DTYPE_INFO[name].itemsize
