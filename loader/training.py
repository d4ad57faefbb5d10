"""Training from a package without PyTorch: forward with saved activations, backward, and the weights.

    m = L.load("model.tcpkg")                   # a package built with --backward
    out, saved = m.forward(x, grad=True)        # the training forward: outputs, and what the backward needs
    grads = m.backward(saved, grad_out)         # {"fc1.weight": array, ...} (and inputs named with --grad-inputs)
    for name, w in m.parameters().items():      # numpy views of the package's weights, updated in place
        w -= 0.1 * grads[name]
    m.save_weights("tuned.safetensors")         # loads back into the PyTorch module (load_state_dict)

Three entry points of one kernel library share one weights array (SPEC §6b): ``tc_run`` for inference, the
training forward and the backward; so a weight updated through ``parameters()`` or ``load_weights`` is what
every later call reads, inference included. The weights are this model's own copy-on-write mapping of the
archive: updating them never writes the file, and another ``load`` of the same package starts from the archive.

Calls are as thread-safe as inference calls, except that updating weights while another thread runs a call
races with it (as updating a PyTorch module's parameters during its forward would).
"""

from __future__ import annotations

import ctypes
import pathlib
import threading

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.abi import BACKWARD_ENTRY, TRAIN_FORWARD_ENTRY
from tcexport.formats.errors import (ArityError, DtypeError, FormatError, RankError, SymbolConflictError,
                                     TrainingError, WorkspaceLimitError)
from tcexport.formats.files import write_atomically

from .arrays import convert_inputs, convert_outputs, to_numpy
from .dtypes import dtype_name, numpy_dtype
from .model import Model, data_address
from .native_cpu import FORK
from .weights import read_safetensors, safetensors_bytes


class Saved:
    """What ``forward(..., grad=True)`` keeps for ``backward``: the bound shape symbols, the call's inputs (the
    backward reads some again: do not modify them in between), its outputs and the saved activations. A Saved
    may be passed to ``backward`` more than once."""

    __slots__ = ("model", "signature", "inputs", "forward_outputs", "as_torch")

    def __init__(self, model, signature, inputs: list, forward_outputs: list, as_torch: bool):
        self.model, self.signature, self.as_torch = model, signature, as_torch
        self.inputs, self.forward_outputs = inputs, forward_outputs

    @property
    def activations(self) -> list[np.ndarray]:
        """The saved activations (the training forward's outputs after the model's own)."""
        return self.forward_outputs[len(self.model.manifest.outputs):]

    @property
    def nbytes(self) -> int:
        """Bytes this Saved holds beyond the inputs and outputs: what training costs in memory per step."""
        return sum(a.nbytes for a in self.activations)

    def __repr__(self) -> str:
        return f"Saved({len(self.activations)} activations, {self.nbytes} bytes, symbols {self.signature.env})"


class TrainingCalls:
    """What the CPU and the CUDA trainable models share: the checks of a backward call's arguments and of weights
    coming in. A subclass provides ``manifest``, ``training`` and the hooks ``_unit_gradient(saved, k)`` (the
    gradient 1 of scalar output k, as the backward takes it) and ``_output_shape(saved, k)``."""

    def _check_saved(self, saved, kind: type) -> None:
        if not isinstance(saved, kind) or saved.model is not self:
            raise TrainingError(f"backward() needs the Saved that forward(..., grad=True) of this model "
                                f"({self.manifest.model!r}) returned, got {type(saved).__name__}",
                                name="saved", expected=kind.__name__, got=type(saved).__name__)

    def _grad_outputs(self, saved, given: tuple, gradient) -> list:
        """One gradient per model output (None where no backward input reads it): each given one checked
        against the output's dtype and the shape this forward call produced, then ``gradient(g, spec, shape)``
        (which makes it what the backward takes); with none given, 1 for each scalar output."""
        specs, n = self.manifest.outputs, len(self.manifest.outputs)
        needed = {k for kind, k in self.training.sources if kind == "grad"}
        if not given:
            return [self._unit_for(saved, k) if k in needed else None for k in range(n)]
        if len(given) != n:
            raise ArityError(f"backward() takes one gradient per model output ({n}: "
                             f"{', '.join(s.name for s in specs)}), got {len(given)}. Pass None for an output "
                             f"you do not differentiate through.", expected=n, got=len(given), rule="arity")
        grads = []
        for k, (spec, g) in enumerate(zip(specs, given)):
            if g is None:
                if k in needed:
                    raise ArityError(f"backward(): output {spec.name!r} needs a gradient (the backward reads it); "
                                     f"got None. Pass an array shaped like the output.", input=spec.name,
                                     rule="arity")
                grads.append(None)
                continue
            grads.append(gradient(g, spec, self._output_shape(saved, k)))
        return grads

    def _unit_for(self, saved, k: int):
        shape, spec = self._output_shape(saved, k), self.manifest.outputs[k]
        if len(shape) != 0:
            raise ArityError(f"backward() without output gradients needs scalar outputs (a loss); output "
                             f"{spec.name!r} has shape {list(shape)}. Pass its gradient.", input=spec.name,
                             expected="scalar", got=list(shape), rule="arity")
        return self._unit_gradient(saved, k)

    def _weights_to_load(self, values: dict, strict: bool, describe) -> dict:
        """``values`` checked against the package's weights: {name: what ``describe(value, name)`` returned}.
        ``describe`` returns an object with ``dtype`` (numpy) and ``shape``. Raises before anything is written."""
        known = {w.name: w for w in self.manifest.weights}
        unknown = sorted(set(values) - set(known))
        missing = sorted(set(self.training.trainable) - set(values))
        if strict and (unknown or missing):
            raise TrainingError(f"load_weights: {'unknown names ' + str(unknown) if unknown else ''}"
                                f"{'; ' if unknown and missing else ''}"
                                f"{'missing trainable weights ' + str(missing) if missing else ''} for model "
                                f"{self.manifest.model!r}. Pass the package's weight names (strict=False skips "
                                f"unknown names and allows a subset).", name=(unknown + missing)[0],
                                expected="the package's weight names", got=sorted(values))
        staged = {}
        for name in sorted(set(values) & set(known)):
            arr, want = describe(values[name], name), known[name]
            if dtype_name(arr.dtype) != want.dtype or tuple(arr.shape) != tuple(want.shape):
                raise TrainingError(f"load_weights: weight {name!r} should be {want.dtype}{list(want.shape)}, got "
                                    f"{dtype_name(arr.dtype)}{list(arr.shape)}. Convert it, or pass the weights "
                                    f"of this model.", name=name, expected=f"{want.dtype}{list(want.shape)}",
                                    got=f"{dtype_name(arr.dtype)}{list(arr.shape)}")
            staged[name] = arr
        return staged


def check_gradient(spec, dtype: np.dtype, shape: tuple, out_shape: tuple) -> None:
    """A caller's gradient of output ``spec``: the output's dtype and the shape this forward call produced."""
    name = f"grad of {spec.name}"
    if dtype_name(dtype) != spec.dtype or not dtype.isnative:
        raise DtypeError(f"{name}: expected dtype {spec.dtype} (the output's), got {dtype_name(dtype)}. "
                         f"Convert it, e.g. g.astype('{spec.dtype}').", input=name, expected=spec.dtype,
                         got=dtype_name(dtype), rule="dtype")
    if len(shape) != len(out_shape):
        raise RankError(f"{name}: expected shape {list(out_shape)} (the output's in this forward call), got "
                        f"{list(shape)}.", input=name, expected=len(out_shape), got=len(shape), rule="rank")
    for d, (want, got) in enumerate(zip(out_shape, shape)):
        if want != got:
            raise SymbolConflictError(f"{name} dim {d}: expected {want} (the output's size in this forward "
                                      f"call), got {got}. Pass a gradient shaped {list(out_shape)}.",
                                      input=name, dim=d, expected=want, got=got, rule="grad == output shape")


class _Entry:
    """One extra entry point: its ctypes function (by the name the ABI fixes, which the manifest repeats),
    compiled output shapes and workspace size."""

    def __init__(self, cdll: ctypes.CDLL, graph, outputs, entry: str):
        try:
            self.run = getattr(cdll, entry)
        except AttributeError:
            raise FormatError(f"kernel library lacks the training entry point {entry!r}; rebuild the "
                              f"package") from None
        self.run.restype, self.run.argtypes = ctypes.c_int32, None  # ctypes objects only, as Model's entry
        self.outputs = tuple((tuple(ex.compile_expr(d) for d in s.shape), numpy_dtype(s.dtype)) for s in outputs)
        self.workspace = ex.compile_expr(graph.workspace_bytes)
        self.num_inputs = len(graph.inputs)


class TrainableModel(TrainingCalls, Model):
    """A Model whose package has a training forward and a backward (``tcexport --backward``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        t = self.manifest.training
        self.training = t
        self._forward = _Entry(self._native.cdll, t.forward, t.forward.outputs, TRAIN_FORWARD_ENTRY)
        self._backward = _Entry(self._native.cdll, t.backward, t.backward.outputs, BACKWARD_ENTRY)
        self._backward.num_inputs = len(t.backward.inputs)
        self._forward.num_inputs = len(self.manifest.inputs)
        self._weight_index = {w.name: k for k, w in enumerate(self.manifest.weights)}
        self._train_local = threading.local()

    # --- calls ---------------------------------------------------------------------------------------------

    def forward(self, *args, grad: bool = False, **kwargs):
        """``m(*inputs)``; with ``grad=True`` the training forward, returning ``(outputs, saved)``."""
        if not grad:
            return self(*args, **kwargs)
        values = args if not kwargs and len(args) == len(self._input_names) else self._gather(args, kwargs)
        arrays, as_torch = convert_inputs(values, self._input_names)
        sig = self._signatures.lookup(arrays)
        outputs = self._call(self._forward, sig, arrays)
        n = len(self.manifest.outputs)
        shown = convert_outputs(outputs[:n], as_torch)
        return (shown[0] if self._single else tuple(shown)), Saved(self, sig, arrays, outputs, as_torch)

    def backward(self, saved: Saved, *grad_outputs) -> dict:
        """Gradients of every trainable weight (and of each input named with ``--grad-inputs``), by name, for the
        forward call ``saved`` came from and the outputs' gradients ``grad_outputs`` (one per model output, in
        order; ``None`` for an output nothing is differentiated through). With no ``grad_outputs``, every
        differentiable output must be a scalar (a loss): its gradient is 1."""
        self._check_saved(saved, Saved)
        grads = self._grad_outputs(saved, grad_outputs, self._gradient)
        sources = {"input": saved.inputs, "forward": saved.forward_outputs, "grad": grads}
        arrays = [sources[kind][k] for kind, k in self.training.sources]
        results = self._call(self._backward, saved.signature, arrays)
        results = convert_outputs(results, saved.as_torch)
        return {s.name: r for s, r in zip(self.training.backward.outputs, results)}

    @staticmethod
    def _gradient(g, spec, out_shape: tuple) -> np.ndarray:
        g = to_numpy(g, f"grad of {spec.name}")
        check_gradient(spec, g.dtype, g.shape, out_shape)
        return g

    @staticmethod
    def _output_shape(saved: Saved, k: int) -> tuple:
        return saved.forward_outputs[k].shape

    @staticmethod
    def _unit_gradient(saved: Saved, k: int) -> np.ndarray:
        return np.ones((), dtype=saved.forward_outputs[k].dtype)

    def _call(self, entry: _Entry, sig, arrays: list) -> list[np.ndarray]:
        env = sig.env
        try:
            outputs = [np.empty(tuple(d(env) for d in shape), dtype) for shape, dtype in entry.outputs]
        except (MemoryError, ValueError) as e:
            raise WorkspaceLimitError(f"model {self.manifest.model!r}: cannot allocate the outputs of a training "
                                      f"call with {env} ({type(e).__name__}). Pass smaller inputs.",
                                      rule="allocation") from None
        b = self._buffers()
        ins, outs = self._pointer_arrays(entry)
        for k, a in enumerate(arrays):
            ins[k] = data_address(a)
        for k, o in enumerate(outputs):
            outs[k] = data_address(o)
        nbytes = entry.workspace(env)
        self._check_workspace(nbytes, env)
        ws = b.workspace_for(nbytes)
        if b.threads > 1 and self._native.openmp:
            b.set_threads(FORK.threads(b.threads))
        rc = entry.run(b.ctx_ref, sig.symbols, ins, self._weight_ptrs, outs, ws)
        if rc != 0:
            raise self._kernel_error(rc, b)
        return outputs

    def _pointer_arrays(self, entry: _Entry):
        """This thread's pointer arrays for ``entry`` (made once per thread and entry)."""
        arrays = getattr(self._train_local, "arrays", None)
        if arrays is None:
            arrays = self._train_local.arrays = {}
        if id(entry) not in arrays:
            arrays[id(entry)] = ((ctypes.c_void_p * max(entry.num_inputs, 1))(),
                                 (ctypes.c_void_p * max(len(entry.outputs), 1))())
        return arrays[id(entry)]

    # --- weights -------------------------------------------------------------------------------------------

    def parameters(self) -> dict[str, np.ndarray]:
        """The trainable weights by name: writable numpy views of the arrays every call reads. Update them in
        place (``w -= lr * g``); rebinding a name changes nothing."""
        return {name: self._weights[self._weight_index[name]] for name in self.training.trainable}

    def weights(self) -> dict[str, np.ndarray]:
        """Every weight of the package (trainable or not, e.g. batch-norm statistics) as writable views."""
        return {w.name: self._weights[k] for k, w in enumerate(self.manifest.weights)}

    def load_weights(self, source, strict: bool = True) -> None:
        """Copy weights in from a dict of arrays (numpy or torch) or a safetensors file. Each must be one of the
        package's weights with its dtype and shape; ``strict`` also requires every trainable weight to be there
        and no unknown name (``strict=False`` ignores unknown names, e.g. a PyTorch state dict's extra buffers)."""
        values = read_safetensors(source) if isinstance(source, (str, pathlib.Path)) else dict(source)
        staged = self._weights_to_load(values, strict, to_numpy)
        known = self.weights()
        for name, arr in staged.items():  # every check passed: nothing is half-loaded
            np.copyto(known[name], arr.view(known[name].dtype))

    def save_weights(self, path, trainable_only: bool = False) -> pathlib.Path:
        """Write the weights (all, or only the trainable ones) as a safetensors file, atomically. Names are the
        PyTorch module's state-dict keys: ``module.load_state_dict(safetensors.torch.load_file(path),
        strict=False)`` loads them back."""
        names = self.training.trainable if trainable_only else [w.name for w in self.manifest.weights]
        known = self.weights()
        return write_atomically(pathlib.Path(path), safetensors_bytes({n: known[n] for n in names}))

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", trainable={len(self.training.trainable)})"
