"""The Triton Python-backend model behind a repository written by ``tcpkg triton-repo``.

Triton runs ``TritonPythonModel`` in a stub process per model instance: ``initialize(args)`` loads the version
directory's ``model.tcpkg`` with ``tcexport.loader.load`` (on the instance's GPU for KIND_GPU), ``execute(requests)``
serves what Triton's dynamic batcher gathered (``loader.request_runner.RequestRunner``: each request checked alone, good
ones merged along the batch symbol, run once, split back; a request that breaks a guard gets an error response
with the typed error's message and its batch-mates are unaffected), ``finalize()`` drops the model.
``triton_python_backend_utils`` exists only inside Triton: it is imported when Triton constructs the model, or
passed in (``TritonPythonModel(pb_utils=...)``), so this module imports anywhere. BF16 tensors cross through
DLPack (``dlpack_bf16``), the only way the Python backend passes them.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from tcexport.formats.errors import GuardError, TcError
from tcexport.loader.load import load
from tcexport.loader.model import default_num_threads

from .dlpack_bf16 import Bf16DLPack, bf16_from_capsule
from tcexport.loader.request_runner import RequestRunner


class RequestError(TcError):
    """A Triton request this model cannot read (a missing input tensor)."""

    exit_code = 5


class TritonPythonModel:
    """One Triton model instance serving one package version."""

    def __init__(self, pb_utils=None):
        self._pb = pb_utils
        self.model = None
        self.runner: RequestRunner | None = None

    def initialize(self, args: dict) -> None:
        """Load ``<model_repository>/<model_version>/model.tcpkg`` for this instance's kind and device."""
        if self._pb is None:
            self._pb = importlib.import_module("triton_python_backend_utils")
        config = json.loads(args.get("model_config") or "{}")
        path = Path(args["model_repository"]) / str(args["model_version"]) / "model.tcpkg"
        kind = str(args.get("model_instance_kind", "CPU")).upper()
        if kind == "GPU":
            self.model = load(path, f"cuda:{int(args.get('model_instance_device_id') or 0)}")
        else:
            self.model = load(path, num_threads=_threads_per_instance(config))
        max_batch = int(config.get("max_batch_size") or 0)
        self.runner = RequestRunner(self.model, max_batch=max_batch if max_batch > 0 else None)
        self._inputs = [(s.name, s.dtype) for s in self.model.manifest.inputs]
        self._outputs = [(s.name, s.dtype) for s in self.model.manifest.outputs]

    def execute(self, requests) -> list:
        """One response per request, in order: its outputs, or an error naming what was wrong with it."""
        decoded = []
        for request in requests:
            try:
                decoded.append([self._input(request, name, dtype) for name, dtype in self._inputs])
            except Exception as e:  # noqa: BLE001 - a request that cannot be read is answered, never raised
                decoded.append(e)
        return [self._response(outcome) for outcome in self.runner.run(decoded)]

    def finalize(self) -> None:
        self.runner = None
        self.model = None

    def _input(self, request, name: str, dtype: str):
        tensor = self._pb.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise RequestError(f"request has no input tensor {name!r}; model {self.model.manifest.model!r} takes "
                               f"{', '.join(n for n, _ in self._inputs)}")
        if dtype == "bfloat16":
            return bf16_from_capsule(tensor.to_dlpack(), name)
        return tensor.as_numpy()

    def _response(self, outcome):
        pb = self._pb
        if outcome.error is not None:
            return pb.InferenceResponse(output_tensors=[], error=self._error(outcome.error))
        tensors = []
        for (name, dtype), array in zip(self._outputs, outcome.outputs):
            if dtype == "bfloat16":
                tensors.append(pb.Tensor.from_dlpack(name, Bf16DLPack(array)))
            else:
                tensors.append(pb.Tensor(name, array))
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, err: Exception):
        """A TritonError with the typed error's class and message; guard and request errors are INVALID_ARG."""
        pb = self._pb
        message = f"{type(err).__name__}: {err}"
        code = getattr(pb.TritonError, "INVALID_ARG", None) if isinstance(err, (GuardError, RequestError)) else None
        return pb.TritonError(message) if code is None else pb.TritonError(message, code)


def _threads_per_instance(config: dict) -> int:
    """The CPU threads one instance's loader uses: the cores this process may use, shared by the configured
    number of CPU instances (each runs in its own process), so K instances do not oversubscribe the cores."""
    count = 0
    for group in config.get("instance_group") or []:
        if str(group.get("kind", "KIND_CPU")) in ("KIND_CPU", "KIND_AUTO"):
            count += int(group.get("count") or 1)
    return max(1, default_num_threads() // max(count, 1))
