"""Arrays on both sides of a CUDA call: what the loader reads from a caller's array (torch, CuPy, anything with
``__cuda_array_interface__``, or numpy in host memory), the caller's stream, and ``DeviceArray``, the loader's own
device memory for callers that passed neither torch nor CuPy. Shared by the inference and training models.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from tcexport.formats.errors import DtypeError, TargetError

from .arrays import contiguous
from .dtypes import BFLOAT16, numpy_dtype
from .native_cuda import Device

ALIGN = 256


def aligned(n: int) -> int:
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN




@dataclass
class ArrayMeta:
    """What the guards look at (shape, ndim, numpy dtype) and where the data is."""

    shape: tuple
    dtype: np.dtype
    ptr: int
    nbytes: int
    host: bool = False  # a numpy array: ``ptr`` is host memory, copied up before the kernels run

    @property
    def ndim(self) -> int:
        return len(self.shape)


class DeviceArray:
    """A package output in device memory, for callers that passed neither torch nor CuPy arrays: it exposes
    ``__cuda_array_interface__`` (v3) and ``numpy()`` (a synchronous copy to the host)."""

    def __init__(self, device: Device, shape: tuple, dtype: str):
        self.device = device
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize
        self.ptr = device.alloc(self.nbytes)
        self.owner = None  # None: this array owns ``ptr`` and frees it

    @classmethod
    def alias(cls, device: Device, ptr: int, shape: tuple, dtype: str, owner) -> "DeviceArray":
        """A view of memory ``owner`` holds (a model's weights): never freed by the view, and it keeps ``owner``
        alive while it (or a torch tensor / CuPy array made from it) is in use."""
        a = cls.__new__(cls)
        a.device, a.shape, a.dtype, a.ptr, a.owner = device, tuple(int(s) for s in shape), dtype, int(ptr), owner
        a.nbytes = int(np.prod(a.shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize
        return a

    @property
    def __cuda_array_interface__(self) -> dict:
        typestr = "<u2" if self.dtype == "bfloat16" else numpy_dtype(self.dtype).str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False), "strides": None, "version": 3}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.shape, dtype=numpy_dtype(self.dtype))
        if self.nbytes:
            self.device.download(out.ctypes.data, self.ptr, self.nbytes)
        return out

    def copy_from(self, host: np.ndarray) -> None:
        """Overwrite the contents with a host array of the same shape and dtype (a synchronous copy)."""
        a = contiguous(host)
        if a.shape != self.shape or a.nbytes != self.nbytes:
            raise DtypeError(f"copy_from: expected shape {list(self.shape)} of {self.dtype}, got {list(a.shape)} of "
                             f"{a.dtype}", expected=list(self.shape), got=list(a.shape), rule="shape")
        if self.nbytes:
            self.device.upload(self.ptr, a.ctypes.data, self.nbytes)

    def __del__(self):
        if getattr(self, "owner", None) is not None:
            return
        try:
            self.device.free(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown or a dead context: nothing to free into
            pass


def torch_module():
    return sys.modules.get("torch")


def is_torch(v) -> bool:
    t = torch_module()
    return t is not None and isinstance(v, t.Tensor)


_TORCH_DTYPES: dict = {}  # torch dtype -> the loader's numpy dtype object, one per dtype (CudaModel._guarded)


def numpy_dtype_of(dtype):
    dt = _TORCH_DTYPES.get(dtype)
    if dt is None:
        name = str(dtype).replace("torch.", "")
        dt = _TORCH_DTYPES[dtype] = BFLOAT16 if name == "bfloat16" else np.dtype(name if name != "bool" else np.bool_)
    return dt


def describe(v, name: str, device: Device) -> ArrayMeta:
    if isinstance(v, np.ndarray):
        a = contiguous(v)
        return ArrayMeta(a.shape, a.dtype, a.ctypes.data, a.nbytes, host=True)
    if is_torch(v):
        if v.get_device() != device.ordinal:
            raise TargetError(f"input {name!r} is on {v.device}; this model runs on cuda:{device.ordinal}. "
                              f"Move it with {name}.to('cuda:{device.ordinal}').")
        if not v.is_contiguous():
            raise DtypeError(f"input {name!r} is not contiguous (strides {v.stride()}); pass {name}.contiguous()",
                             input=name, expected="contiguous", got=str(v.stride()), rule="layout")
        return ArrayMeta(tuple(v.shape), numpy_dtype_of(v.dtype), v.data_ptr(), v.numel() * v.element_size())
    if isinstance(v, DeviceArray):  # its own dtype: the interface can only say "<u2" for bfloat16
        return ArrayMeta(v.shape, numpy_dtype(v.dtype), v.ptr, v.nbytes)
    cai = getattr(v, "__cuda_array_interface__", None)
    if cai is None:
        raise DtypeError(f"input {name!r}: expected a CUDA array (a torch CUDA tensor, a CuPy array, or anything with "
                         f"__cuda_array_interface__), got {type(v).__name__}. A host array must be copied to the "
                         f"GPU first.", input=name, expected="cuda array", got=type(v).__name__, rule="type")
    dt = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    if strides is not None and strides != tuple(np.empty(0, dt).itemsize * int(np.prod(shape[k + 1:]))
                                                for k in range(len(shape))):
        raise DtypeError(f"input {name!r} is not C-contiguous (strides {strides}); pass a contiguous copy",
                         input=name, expected="contiguous", got=str(strides), rule="layout")
    return ArrayMeta(shape, dt, int(cai["data"][0]), int(np.prod(shape, dtype=np.int64)) * dt.itemsize)


def caller_stream(values, device: Device) -> int:
    for v in values:
        if is_torch(v):
            torch = torch_module()
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what torch.compile's wrappers call
            return int(raw(device.ordinal)) if raw is not None else \
                int(torch.cuda.current_stream(device.ordinal).cuda_stream)
    cupy = sys.modules.get("cupy")
    if cupy is not None and any(isinstance(v, cupy.ndarray) for v in values):
        return int(cupy.cuda.get_current_stream().ptr)
    return 0



def pointer(o) -> int:
    if is_torch(o):
        return o.data_ptr()
    if isinstance(o, DeviceArray):
        return o.ptr
    return int(o.__cuda_array_interface__["data"][0])


