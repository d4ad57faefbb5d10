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
from tcexport.formats.errors import (ArityError, DtypeError, FormatError, RankError, SymbolConflictError,
                                     TcError)
from tcexport.formats.files import write_atomically

from .arrays import convert_inputs, convert_outputs, to_numpy
from .dtypes import dtype_name, numpy_dtype
from .model import Model, data_address
from .weights import read_safetensors, safetensors_bytes


class TrainingError(TcError):
    """A training call got something it cannot use: the saved state of another model or call, or weights whose
    names, dtypes or shapes are not the package's."""


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


class _Entry:
    """One extra entry point: its ctypes function, compiled output shapes and workspace size."""

    def __init__(self, cdll: ctypes.CDLL, graph, outputs):
        try:
            self.run = getattr(cdll, graph.entry)
        except AttributeError:
            raise FormatError(f"kernel library lacks the entry point {graph.entry!r} the manifest's training "
                              f"section names; rebuild the package") from None
        self.run.restype, self.run.argtypes = ctypes.c_int32, None  # ctypes objects only, as Model's entry
        self.outputs = tuple((tuple(ex.compile_expr(d) for d in s.shape), numpy_dtype(s.dtype)) for s in outputs)
        self.workspace = ex.compile_expr(graph.workspace_bytes)
        self.num_inputs = len(graph.inputs)


class TrainableModel(Model):
    """A Model whose package has a training forward and a backward (``tcexport --backward``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        t = self.manifest.training
        self.training = t
        self._forward = _Entry(self._native.cdll, t.forward, t.forward.outputs)
        self._backward = _Entry(self._native.cdll, t.backward, t.backward.outputs)
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
        if not isinstance(saved, Saved) or saved.model is not self:
            raise TrainingError(f"backward() needs the Saved that forward(..., grad=True) of this model "
                                f"({self.manifest.model!r}) returned, got {type(saved).__name__}")
        grads = self._grad_outputs(saved, grad_outputs)
        sources = {"input": saved.inputs, "forward": saved.forward_outputs, "grad": grads}
        arrays = [sources[kind][k] for kind, k in self.training.sources]
        results = self._call(self._backward, saved.signature, arrays)
        results = convert_outputs(results, saved.as_torch)
        return {s.name: r for s, r in zip(self.training.backward.outputs, results)}

    def _grad_outputs(self, saved: Saved, given: tuple) -> list:
        """One gradient array per model output (None where no backward input reads it), checked against the
        output's dtype and the shape this forward call produced."""
        specs, n = self.manifest.outputs, len(self.manifest.outputs)
        needed = {k for kind, k in self.training.sources if kind == "grad"}
        if not given:
            given = tuple(self._unit_gradient(saved, k) if k in needed else None for k in range(n))
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
            grads.append(self._check_gradient(spec, to_numpy(g, f"grad of {spec.name}"), saved.forward_outputs[k]))
        return grads

    def _unit_gradient(self, saved: Saved, k: int) -> np.ndarray:
        out, spec = saved.forward_outputs[k], self.manifest.outputs[k]
        if out.ndim != 0:
            raise ArityError(f"backward() without output gradients needs scalar outputs (a loss); output "
                             f"{spec.name!r} has shape {list(out.shape)}. Pass its gradient.", input=spec.name,
                             expected="scalar", got=list(out.shape), rule="arity")
        return np.ones((), dtype=out.dtype)

    @staticmethod
    def _check_gradient(spec, g: np.ndarray, out: np.ndarray) -> np.ndarray:
        name = f"grad of {spec.name}"
        if dtype_name(g.dtype) != spec.dtype or not g.dtype.isnative:
            raise DtypeError(f"{name}: expected dtype {spec.dtype} (the output's), got {dtype_name(g.dtype)}. "
                             f"Convert it, e.g. g.astype('{spec.dtype}').", input=name, expected=spec.dtype,
                             got=dtype_name(g.dtype), rule="dtype")
        if g.ndim != out.ndim:
            raise RankError(f"{name}: expected shape {list(out.shape)} (the output's in this forward call), got "
                            f"{list(g.shape)}.", input=name, expected=out.ndim, got=g.ndim, rule="rank")
        for d, (want, got) in enumerate(zip(out.shape, g.shape)):
            if want != got:
                raise SymbolConflictError(f"{name} dim {d}: expected {want} (the output's size in this forward "
                                          f"call), got {got}. Pass a gradient shaped {list(out.shape)}.",
                                          input=name, dim=d, expected=want, got=got, rule="grad == output shape")
        return g

    def _call(self, entry: _Entry, sig, arrays: list) -> list[np.ndarray]:
        env = sig.env
        outputs = [np.empty(tuple(d(env) for d in shape), dtype) for shape, dtype in entry.outputs]
        b = self._buffers()
        ins, outs = self._pointer_arrays(entry)
        for k, a in enumerate(arrays):
            ins[k] = data_address(a)
        for k, o in enumerate(outputs):
            outs[k] = data_address(o)
        ws = b.workspace_for(entry.workspace(env))
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
        known = self.weights()
        unknown = sorted(set(values) - set(known))
        missing = sorted(set(self.training.trainable) - set(values))
        if strict and (unknown or missing):
            raise TrainingError(f"load_weights: {'unknown names ' + str(unknown) if unknown else ''}"
                                f"{'; ' if unknown and missing else ''}"
                                f"{'missing trainable weights ' + str(missing) if missing else ''} for model "
                                f"{self.manifest.model!r}. Pass the package's weight names (strict=False skips "
                                f"unknown names and allows a subset).")
        staged = {}
        for name in sorted(set(values) & set(known)):
            arr, dst = to_numpy(values[name], name), known[name]
            if dtype_name(arr.dtype) != dtype_name(dst.dtype) or arr.shape != dst.shape:
                raise TrainingError(f"load_weights: weight {name!r} should be {dtype_name(dst.dtype)}"
                                    f"{list(dst.shape)}, got {dtype_name(arr.dtype)}{list(arr.shape)}. Convert "
                                    f"it, or pass the weights of this model.")
            staged[name] = arr
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
