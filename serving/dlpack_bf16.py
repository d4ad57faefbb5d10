"""bfloat16 tensors across DLPack without torch: read a DLPack capsule into tagged uint16 bits, and hand tagged
bits out as a DLPack producer.

Triton's Python backend gives and takes BF16 tensors only through DLPack (``as_numpy()`` cannot hold them,
numpy having no bfloat16), and numpy's own DLPack support refuses the bfloat16 type code. The loader holds
bfloat16 as uint16 bits tagged with ``loader.dtypes.BFLOAT16``, so the bits only need to cross: this module reads
and writes the DLPack structs (dlpack.h, the unversioned "dltensor" capsule every producer still speaks) with
ctypes. Only host memory is read; the bits are copied, so no lifetime crosses the boundary. The Python C-API
functions are bound privately here (never by setting ``ctypes.pythonapi``'s shared prototypes).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tcexport.formats.errors import TcError
from tcexport.loader.dtypes import BFLOAT16

KDL_CPU = 1
KDL_BFLOAT = 4
_NAME = b"dltensor"
_USED = b"used_dltensor"  # lives as long as the module: PyCapsule_SetName keeps the pointer


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

_api = ctypes.pythonapi
_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_capsule_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
_CAPSULE_DESTRUCTOR = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR)(
    ("PyCapsule_New", _api))
_incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", _api))
_decref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_DecRef", _api))


class DLPackError(TcError):
    """A DLPack tensor this module cannot read as bfloat16 (another dtype, device memory, a strided layout)."""


def bf16_from_capsule(capsule, name: str) -> np.ndarray:
    """The bits of a bfloat16 DLPack capsule (unconsumed, host memory) as a new ``BFLOAT16`` array; consumes it.

    ``name`` names the tensor in errors."""
    ptr = _capsule_pointer(capsule, _NAME)
    managed = DLManagedTensor.from_address(ptr)
    t = managed.dl_tensor
    try:
        if t.device.device_type != KDL_CPU:
            raise DLPackError(f"tensor {name!r}: DLPack device type {t.device.device_type} is not host memory "
                              f"({KDL_CPU}); keep the model's inputs on the CPU (Triton's default "
                              f"FORCE_CPU_ONLY_INPUT_TENSORS)")
        if (t.dtype.code, t.dtype.bits, t.dtype.lanes) != (KDL_BFLOAT, 16, 1):
            raise DLPackError(f"tensor {name!r}: expected a bfloat16 DLPack tensor (code {KDL_BFLOAT}, 16 bits, 1 "
                              f"lane), got code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes")
        shape = tuple(t.shape[i] for i in range(t.ndim))
        bits = _copy_bits(t, shape, name)
    finally:
        _capsule_set_name(capsule, _USED)
        if managed.deleter:
            managed.deleter(ptr)
    return bits.view(BFLOAT16)


def _copy_bits(t: DLTensor, shape: tuple, name: str) -> np.ndarray:
    size = math.prod(shape)
    if size == 0:
        return np.empty(shape, np.uint16)
    compact = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    if t.strides:
        strides = [t.strides[i] for i in range(len(shape))]
        if any(s != c for s, c, n in zip(strides, compact, shape) if n > 1):
            raise DLPackError(f"tensor {name!r}: strides {strides} are not C-contiguous for shape {list(shape)}; "
                              f"pass a contiguous tensor")
    buf = (ctypes.c_uint16 * size).from_address(t.data + t.byte_offset)
    return np.frombuffer(buf, np.uint16).reshape(shape).copy()


class Bf16DLPack:
    """A DLPack producer of a ``BFLOAT16`` (or uint16) array's bits as bfloat16, e.g. for
    ``pb_utils.Tensor.from_dlpack(name, Bf16DLPack(bits))``. Holds a contiguous copy of the bits."""

    def __init__(self, bits: np.ndarray):
        self.bits = np.ascontiguousarray(bits).view(np.uint16)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (KDL_CPU, 0)

    def __dlpack__(self, stream=None):
        """A "dltensor" capsule; the bits stay alive until its consumer calls the deleter (or, unconsumed, until
        the capsule dies)."""
        return _Export(self.bits).capsule()


class _Export:
    """One export's structs; keeps itself alive (one reference) until the deleter runs."""

    def __init__(self, bits: np.ndarray):
        self.bits = bits
        self.shape = (ctypes.c_int64 * max(bits.ndim, 1))(*bits.shape)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data = bits.ctypes.data if bits.size else None
        t.device = DLDevice(KDL_CPU, 0)
        t.ndim = bits.ndim
        t.dtype = DLDataType(KDL_BFLOAT, 16, 1)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = None
        t.byte_offset = 0
        self.managed.manager_ctx = id(self)
        self.managed.deleter = _delete_export

    def capsule(self):
        _incref(self)
        return _capsule_new(ctypes.addressof(self.managed), _NAME, _destroy_capsule)


@_DELETER
def _delete_export(ptr):
    managed = DLManagedTensor.from_address(ptr)
    owner = ctypes.cast(managed.manager_ctx, ctypes.py_object).value
    _decref(owner)


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule):
    """An unconsumed capsule (still named "dltensor") releases its export; a consumed one was released by its
    consumer through the deleter."""
    if _capsule_is_valid(capsule, _NAME):
        _delete_export(_capsule_pointer_raw(capsule, _NAME))
