"""Training from a package on the GPU: the CPU TrainableModel's API over the CUDA training entry points.

    m = L.load("model.tcpkg", device="cuda")     # a package built with --backward --target cuda:sm_XX
    out, saved = m.forward(x, grad=True)         # x a torch CUDA tensor: out too; saved stays on the device
    grads = m.backward(saved, grad_out)          # {"fc1.weight": tensor, ...} on the device
    with torch.no_grad():
        for name, w in m.parameters().items():   # torch tensors aliasing the model's device weights
            w -= 0.1 * grads[name]
    m.save_weights("tuned.safetensors")          # loads back into the PyTorch module (load_state_dict)

The training forward and the backward launch their own kernels (SPEC §6b) kernel by kernel on the caller's stream,
reading the same device weights as inference, so an update through ``parameters()`` or ``load_weights`` reaches
every later call. Inference calls (``m(x)``) are CudaModel's, unchanged (CUDA graphs included). The saved
activations are fresh device arrays of the caller's kind, freed when the Saved is; arrays come and go as for
inference calls: torch in, torch out; CuPy in, CuPy out; other CUDA arrays in, DeviceArrays out; numpy in, numpy
out (the saved activations still stay on the device).
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.files import write_atomically

from .arrays import contiguous
from .cuda_arrays import DeviceArray, aligned, caller_stream, describe, is_torch, pointer, torch_module
from .cuda_model import CudaModel
from .dtypes import numpy_dtype
from .training import TrainingCalls, check_gradient
from .weights import read_safetensors, safetensors_bytes


def _contiguous(value):
    """A weight value as something ``_describe`` takes: a torch CPU tensor becomes numpy (bfloat16 as tagged bits),
    numpy arrays and torch tensors become contiguous."""
    if is_torch(value):
        value = value.detach().contiguous()
        if value.device.type == "cpu":
            torch = torch_module()
            return value.view(torch.int16).numpy().view(numpy_dtype("bfloat16")) \
                if value.dtype == torch.bfloat16 else value.numpy()
        return value
    return contiguous(value) if isinstance(value, np.ndarray) else value


class CudaSaved:
    """What ``forward(..., grad=True)`` keeps for ``backward``: the bound symbols, the call's inputs (the backward
    reads some again by address: do not modify them in between), its outputs and the saved activations, all on
    the device. A CudaSaved may be passed to ``backward`` more than once."""

    __slots__ = ("model", "env", "values", "input_ptrs", "forward_outputs", "shapes", "host", "_keep")

    def __init__(self, model, env: dict, values: list, input_ptrs: list, forward_outputs: list, shapes: list,
                 host: bool, keep: list):
        self.model, self.env, self.values, self.input_ptrs = model, env, values, input_ptrs
        self.forward_outputs, self.shapes, self.host, self._keep = forward_outputs, shapes, host, keep

    @property
    def activations(self) -> list:
        """The saved activations (the training forward's outputs after the model's own), as device arrays."""
        return self.forward_outputs[len(self.model.manifest.outputs):]

    @property
    def nbytes(self) -> int:
        """Device bytes this Saved holds beyond the inputs and outputs: what training costs in memory per step."""
        n = len(self.model.manifest.outputs)
        specs = self.model.training.forward.outputs[n:]
        return sum(int(np.prod(s, dtype=np.int64)) * numpy_dtype(spec.dtype).itemsize
                   for s, spec in zip(self.shapes[n:], specs))

    def __repr__(self) -> str:
        return f"CudaSaved({len(self.activations)} activations, {self.nbytes} bytes, symbols {self.env})"


class _CudaEntry:
    """One training graph on this GPU: its kernels, output specs and workspace expression."""

    def __init__(self, model: CudaModel, graph, isa: str):
        c = graph.cuda
        self.name = graph.name
        self.kernels = model._load_kernels(c.launches, c.cubins[isa])
        self.outputs = [(s.shape, s.dtype) for s in graph.outputs]
        self.workspace = c.workspace_bytes
        self.checked = any(p["kind"] == "error" for k in self.kernels for p in k.params)


class TrainableCudaModel(TrainingCalls, CudaModel):
    """A CudaModel whose package has CUDA training entry points (``tcexport --backward --target cuda:sm_XX``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        t = self.manifest.training
        self.training = t
        self._forward = _CudaEntry(self, t.forward, self.bundle.isa)
        self._backward = _CudaEntry(self, t.backward, self.bundle.isa)
        self._weight_index = {w.name: k for k, w in enumerate(self.manifest.weights)}
        self._train_workspace = (0, 0)  # (pointer, bytes), grown as calls need
        self._ones: dict = {}           # dtype -> a device scalar 1, the gradient of a scalar loss

    # --- calls ---------------------------------------------------------------------------------------------

    def forward(self, *args, grad: bool = False, stream: int | None = None, **kwargs):
        """``m(*inputs)``; with ``grad=True`` the training forward, returning ``(outputs, saved)``."""
        if not grad:
            return self(*args, stream=stream, **kwargs)
        with self._lock:
            values, metas, env, stream = self._bind(args, kwargs, stream)
            keep: list = []
            ptrs = [self._on_device(m, spec.dtype, stream, keep) for m, spec in zip(metas, self.manifest.inputs)]
            outs = self._run(self._forward, values, ptrs, env, stream)
            host = bool(values) and all(m.host for m in metas)
            shapes = [tuple(ex.evaluate(d, env) for d in shape) for shape, _ in self._forward.outputs]
            saved = CudaSaved(self, env, values, ptrs, outs, shapes, host, keep)
            shown = outs[:len(self.manifest.outputs)]
            if host:
                shown = [o.numpy() for o in shown]
            return (shown[0] if self._single else tuple(shown)), saved

    def backward(self, saved: CudaSaved, *grad_outputs, stream: int | None = None) -> dict:
        """Gradients of every trainable weight (and of each input named with ``--grad-inputs``), by name, for the
        forward call ``saved`` came from and the outputs' gradients ``grad_outputs`` (one per model output, in
        order; ``None`` for an output nothing is differentiated through). With no ``grad_outputs``, every
        differentiable output must be a scalar (a loss): its gradient is 1."""
        self._check_saved(saved, CudaSaved)
        self._require_open()
        with self._lock:
            self.device.make_current()
            given = [g for g in grad_outputs if g is not None]
            stream = caller_stream(list(saved.values) + given, self.device) if stream is None else int(stream)
            keep: list = []  # copied gradients, alive until the backward is enqueued

            def gradient(g, spec, out_shape: tuple) -> int:
                v = contiguous(g) if isinstance(g, np.ndarray) else g
                meta = describe(v, f"grad of {spec.name}", self.device)
                check_gradient(spec, meta.dtype, meta.shape, out_shape)
                keep.append(v)
                return self._on_device(meta, spec.dtype, stream, keep)

            grads = self._grad_outputs(saved, grad_outputs, gradient)
            sources = {"input": saved.input_ptrs, "forward": [pointer(o) for o in saved.forward_outputs],
                       "grad": grads}
            ptrs = [sources[kind][k] for kind, k in self.training.sources]
            outs = self._run(self._backward, list(saved.values) + given, ptrs, saved.env, stream)
            if keep or any(isinstance(o, DeviceArray) for o in saved.forward_outputs):
                # memory no stream-ordered allocator tracks (copies made here; a Saved's own DeviceArrays, which
                # the caller may drop on return) must outlive the kernels that read it
                self.device.synchronize(stream)
            if saved.host:
                outs = [o.numpy() for o in outs]
            return {s.name: o for s, o in zip(self.training.backward.outputs, outs)}

    @staticmethod
    def _output_shape(saved: CudaSaved, k: int) -> tuple:
        return saved.shapes[k]

    def _unit_gradient(self, saved: CudaSaved, k: int) -> int:
        dtype = self.manifest.outputs[k].dtype
        if dtype not in self._ones:
            one = DeviceArray(self.device, (), dtype)
            one.copy_from(np.ones((), numpy_dtype(dtype)))
            self._ones[dtype] = one
        return self._ones[dtype].ptr

    def _on_device(self, meta, dtype: str, stream: int, keep: list) -> int:
        """A device address of ``meta``'s data that kernels may read: its own, or (for host memory or a pointer
        that is not 16-byte aligned) a copy kept alive in ``keep``."""
        if not meta.host and meta.ptr % 16 == 0:
            return meta.ptr
        copy = DeviceArray(self.device, meta.shape, dtype)
        if meta.nbytes:
            (self.device.upload_async if meta.host else self.device.copy_async)(copy.ptr, meta.ptr, meta.nbytes,
                                                                                stream)
        keep.append(copy)
        return copy.ptr

    def _run(self, entry: _CudaEntry, values: list, inputs: list, env: dict, stream: int) -> list:
        """Launch ``entry``'s kernels on ``stream``; returns its outputs as fresh arrays of ``values``' kind."""
        outs = self._new_outputs([v for v in values if not isinstance(v, np.ndarray)], env, entry.outputs)
        need = self._arena(entry.workspace, env)
        ptr, size = self._train_workspace
        if size < need:
            if ptr:
                self.device.synchronize_context()  # earlier calls may still use it
                self.device.free(ptr)
            size = aligned(need) * 2
            ptr = self.device.alloc(size)
            self._train_workspace = (ptr, size)
        self._launch_all(self._blocks(inputs, [pointer(o) for o in outs], ptr, env, entry.kernels), stream)
        if entry.checked and self.check_indices:
            self._raise_on_bad_index(stream, entry.kernels)
        return outs

    def _free_memory(self) -> None:
        self._ones.clear()  # DeviceArrays: they free themselves
        if self._train_workspace[0]:
            self.device.free(self._train_workspace[0])
        super()._free_memory()

    # --- weights -------------------------------------------------------------------------------------------

    def parameters(self) -> dict:
        """The trainable weights by name, as device arrays that alias the weights every call reads: torch CUDA
        tensors when torch is imported, else CuPy arrays when CuPy is, else DeviceArrays. Update them in place
        (``w -= lr * g`` under ``torch.no_grad()``), on the stream the calls run on."""
        return {name: self._weight_array(self._weight_index[name]) for name in self.training.trainable}

    def weights(self) -> dict:
        """Every weight of the package (trainable or not, e.g. batch-norm statistics), as ``parameters()``."""
        return {w.name: self._weight_array(k) for k, w in enumerate(self.manifest.weights)}

    def _weight_array(self, k: int):
        self._require_open()
        spec = self.manifest.weights[k]
        view = DeviceArray.alias(self.device, self._weight_ptrs[k], spec.shape, spec.dtype, owner=self)
        torch = torch_module()
        if torch is not None:
            t = torch.as_tensor(view, device=f"cuda:{self.device.ordinal}")  # zero-copy, keeps ``view`` alive
            return t.view(torch.bfloat16) if spec.dtype == "bfloat16" else t
        cupy = sys.modules.get("cupy")
        if cupy is not None and spec.dtype != "bfloat16":
            return cupy.asarray(view)
        return view

    def load_weights(self, source, strict: bool = True) -> None:
        """Copy weights in from a dict of arrays (numpy, torch tensors on any device, CuPy or other CUDA arrays)
        or a safetensors file. Each must be one of the package's weights with its dtype and shape; ``strict`` also
        requires every trainable weight to be there and no unknown name (``strict=False`` ignores unknown names,
        e.g. a PyTorch state dict's extra buffers). Waits for the GPU's queued work before writing."""
        self._require_open()
        values = read_safetensors(source) if isinstance(source, (str, pathlib.Path)) else dict(source)
        keep: list = []  # converted values: the memory each copy reads stays alive until it is done

        def on_device(value, name: str):
            value = _contiguous(value)
            keep.append(value)
            return describe(value, name, self.device)

        staged = self._weights_to_load(values, strict, on_device)
        self.device.make_current()
        self.device.synchronize_context()
        for name, meta in staged.items():  # every check passed: nothing is half-loaded
            dst = self._weight_ptrs[self._weight_index[name]]
            if meta.nbytes:
                (self.device.upload_async if meta.host else self.device.copy_async)(dst, meta.ptr, meta.nbytes, 0)
        self.device.synchronize_context()

    def save_weights(self, path, trainable_only: bool = False) -> pathlib.Path:
        """Write the weights (all, or only the trainable ones) as a safetensors file, atomically, after the GPU's
        queued work. Names are the PyTorch module's state-dict keys: ``module.load_state_dict(
        safetensors.torch.load_file(path), strict=False)`` loads them back (``strict=True`` with every weight)."""
        self._require_open()
        names = self.training.trainable if trainable_only else [w.name for w in self.manifest.weights]
        self.device.make_current()
        self.device.synchronize_context()
        host = {}
        for name in names:
            k = self._weight_index[name]
            spec = self.manifest.weights[k]
            host[name] = DeviceArray.alias(self.device, self._weight_ptrs[k], spec.shape, spec.dtype, self).numpy()
        return write_atomically(pathlib.Path(path), safetensors_bytes(host))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", trainable={len(self.training.trainable)})"
