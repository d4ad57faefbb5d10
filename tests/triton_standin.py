"""A stand-in for the part of Triton's ``triton_python_backend_utils`` API a Python model uses, for driving
``serving.triton_backend.TritonPythonModel`` outside Triton.

It mimics the API only (names, signatures, the BF16 rule), after python_backend's README and src/pb_tensor.cc:
``Tensor(name, numpy_array)`` with ``name()``/``as_numpy()``/``to_dlpack()``/``Tensor.from_dlpack(name, obj)``,
``as_numpy()`` refused for BF16 tensors (as the real one does), ``get_input_tensor_by_name``,
``InferenceRequest``, ``InferenceResponse(output_tensors=..., error=...)`` and ``TritonError`` with its codes.
BF16 data is held as a torch tensor, so DLPack goes through torch's implementation, which checks the
backend's producer and consumer independently of them.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.utils.dlpack


class TritonError:
    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int = 1):  # INTERNAL, the real default
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    pass


class Tensor:
    def __init__(self, name: str, data):
        if not isinstance(name, str):
            raise TritonModelException(f"tensor name must be a str, got {type(name).__name__}")
        if isinstance(data, torch.Tensor):
            self._bf16 = data
            self._array = None
        else:
            if not isinstance(data, np.ndarray) or data.dtype.kind not in "biuf":
                raise TritonModelException(f"Tensor({name!r}) takes a numpy array of a Triton type, got {data!r}")
            if data.dtype.metadata:  # a tagged dtype is not a Triton type: BF16 must come through from_dlpack
                raise TritonModelException(f"Tensor({name!r}): numpy dtype {data.dtype} with metadata is not a "
                                           f"Triton type; use Tensor.from_dlpack for BF16")
            self._array, self._bf16 = np.ascontiguousarray(data), None
        self._name = name

    def name(self) -> str:
        return self._name

    def triton_dtype(self) -> str:
        return "BF16" if self._bf16 is not None else str(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def as_numpy(self) -> np.ndarray:
        if self._bf16 is not None:
            raise TritonModelException("Tensor.as_numpy() is not supported for BF16 tensors; use to_dlpack()")
        return self._array

    def to_dlpack(self):
        return torch.utils.dlpack.to_dlpack(self._bf16 if self._bf16 is not None else torch.from_numpy(self._array))

    @staticmethod
    def from_dlpack(name: str, obj) -> "Tensor":
        if not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")):
            raise TritonModelException("Provided tensor must have __dlpack__ and __dlpack_device__ attributes")
        t = torch.from_dlpack(obj)
        if not t.is_contiguous():
            raise TritonModelException("DLPack tensor is not contiguous")
        return Tensor(name, t.clone() if t.dtype == torch.bfloat16 else t.numpy().copy())

    @staticmethod
    def bf16(name: str, t: torch.Tensor) -> "Tensor":
        """A BF16 tensor as Triton would hand it to the model (test helper, not part of the real API)."""
        return Tensor(name, t.to(torch.bfloat16).contiguous())


class InferenceRequest:
    def __init__(self, inputs: list[Tensor], requested_output_names: list[str] | None = None):
        self._inputs = list(inputs)
        self._requested = requested_output_names or []

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested


class InferenceResponse:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None):
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException(f"error must be a TritonError, got {type(error).__name__}")
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None
