"""A package with state (a static KV cache, a counter: formats/state.py) as a callable that keeps it.

The graphs take each state as an input and return its new value as an output; this wrapper hides both from the
caller and owns the arrays. Each ``Session`` has its own state over the one loaded model (weights, kernels,
CUDA graphs are shared), so concurrent conversations never see each other's values; the model's own calls use
a default session. A state marked ``in_place`` is one array the kernels read and write; any other is written into
a second array and the two swap after the call, so a call that fails leaves it as it was; an in-place state is
written by its own kernel, after that write's own checks (a position outside the cache fails before anything is
written), but a check that fails in a later kernel leaves the earlier writes done: ``reset_state()`` then.
"""

from __future__ import annotations

import threading

import numpy as np

from tcexport.formats.errors import FormatError

from .arrays import convert_inputs, convert_outputs
from .call_args import gather
from .dtypes import numpy_dtype
from .weights import parse_safetensors


class StatefulModel:
    """Call with the model's inputs (its state is not among them); ``state()``, ``reset_state()`` and
    ``new_session()`` manage what the calls keep. ``owner``: what keeps the state when several models share it (a
    package's methods, loader/methods.py: one state by name for all of them); by default this model itself."""

    def __init__(self, base, owner=None):
        m = base.manifest
        self.base = base
        self.manifest = m
        self.archive = base.archive
        self._on_device = hasattr(base, "device")  # a CudaModel: the state lives on its GPU
        state_in = {s.input for s in m.state}
        state_out = {s.output for s in m.state}
        self._user_in = [k for k in range(len(m.inputs)) if k not in state_in]
        self._user_out = [k for k in range(len(m.outputs)) if k not in state_out]
        self._names = tuple(m.inputs[k].name for k in self._user_in)
        self._single = m.output_structure == "single"
        self._specs = {s.name: m.inputs[s.input] for s in m.state}
        if owner is None:
            self._initial = initial_state(self.archive, m)
            self._default = Session(self)

    # --- what callers see ---------------------------------------------------------------------------------

    @property
    def path(self):
        return self.archive.path

    @property
    def methods(self):
        """``forward`` alone, this model: a package without methods (SPEC §2c), so that code calling
        ``m.methods[name]`` runs any package."""
        from .method_table import Methods

        return Methods({"forward": self}, self.manifest.model)

    @property
    def inputs(self) -> list:
        return [self.manifest.inputs[k] for k in self._user_in]

    @property
    def outputs(self) -> list:
        return [self.manifest.outputs[k] for k in self._user_out]

    @property
    def state_specs(self) -> list:
        """Each state's name, dtype and shape (the manifest's input spec of it)."""
        return list(self._specs.values())

    def __call__(self, *args, **kwargs):
        return self._default(*args, **kwargs)

    def state(self) -> dict:
        """The default session's state: name -> a numpy copy."""
        return self._default.state()

    def reset_state(self) -> None:
        self._default.reset_state()

    def new_session(self) -> "Session":
        """A new state, from the package's initial values, sharing this model's weights and kernels."""
        return Session(self)

    def close(self) -> None:
        if hasattr(self.base, "close"):
            self.base.close()

    def __repr__(self) -> str:
        names = ", ".join(s.name for s in self.manifest.state)
        return f"StatefulModel({self.base!r}, state=[{names}])"

    # --- one step -----------------------------------------------------------------------------------------

    def _fresh(self) -> dict:
        """New arrays holding the initial state (host or device, where the kernels read them)."""
        return {name: self._place(name) for name in self._initial}

    def _place(self, name: str):
        """A new array holding state ``name``'s initial value."""
        return place(self._initial[name], self._specs[name], self.base.device if self._on_device else None)

    def _session_methods(self, session: "Session"):
        """``session.methods``: a package without methods has one, ``forward`` (loader/methods.py)."""
        from .method_table import Methods

        return Methods({"forward": session}, self.manifest.model)

    def _step(self, session: "Session", args: tuple, kwargs: dict):
        values = gather(self.manifest.model, self._names, args, kwargs)
        m = self.manifest
        preset = {s.output: session.arrays[s.name] if s.in_place else session.spare(s.name) for s in m.state}
        if self._on_device:
            outs = self.base.outputs_of(self._with_state(values, session), preset)
            host = all(isinstance(v, np.ndarray) for v in values)
            result = [outs[k].numpy() if host and not isinstance(outs[k], np.ndarray) else outs[k]
                      for k in self._user_out]  # numpy in, numpy out (a torch caller keeps its tensors)
        else:
            arrays, as_torch = convert_inputs(values, self._names)
            outs = self.base.run_arrays(self._with_state(arrays, session), preset)
            result = [outs[k] for k in self._user_out]
            if as_torch:
                result = convert_outputs(result, True)
        for s in m.state:  # the call succeeded: the new values become the state
            if not s.in_place:
                session.swap(s.name, outs[s.output])
        return result[0] if self._single else tuple(result)

    def _with_state(self, values: list, session: "Session") -> list:
        """Every graph input in manifest order: the caller's values, and the session's state where it goes."""
        full = [None] * len(self.manifest.inputs)
        for k, v in zip(self._user_in, values):
            full[k] = v
        for s in self.manifest.state:
            full[s.input] = session.arrays[s.name]
        return full


class Session:
    """One conversation's state over a loaded StatefulModel (or a package's methods, which share it); calls on one
    session run one at a time. ``model``: what owns the state (its ``_fresh``, ``_place``, ``_initial``); a call of
    the session itself runs that model (``session.methods[name]`` runs a method)."""

    def __init__(self, model):
        self._model = model
        self._lock = threading.Lock()
        self.arrays = model._fresh()
        self._spares: dict = {}

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._model._step(self, args, kwargs)

    @property
    def methods(self):
        """Name -> a callable running that method against this session's state (SPEC §2c; ``forward`` alone for
        a package without methods)."""
        return self._model._session_methods(self)

    def run(self, model: StatefulModel, args: tuple, kwargs: dict):
        """One call of ``model`` (a method sharing this session's state) on this session."""
        with self._lock:
            return model._step(self, args, kwargs)

    def state(self) -> dict:
        with self._lock:
            return {name: a.copy() if isinstance(a, np.ndarray) else a.numpy() for name, a in self.arrays.items()}

    def reset_state(self) -> None:
        """Every state back to the package's initial value (the arrays are kept)."""
        with self._lock:
            for name, value in self._model._initial.items():
                a = self.arrays[name]
                if isinstance(a, np.ndarray):
                    a[...] = value
                else:
                    a.copy_from(np.array(value, order="C"))

    def spare(self, name: str):
        """The array a state that is not updated in place is written into (made once, then swapped)."""
        spare = self._spares.get(name)
        if spare is None:
            spare = self._spares[name] = self._model._place(name)
        return spare

    def swap(self, name: str, written) -> None:
        self._spares[name], self.arrays[name] = self.arrays[name], written


def place(value: np.ndarray, spec, device):
    """A new array holding ``value`` (a state's initial value, of ``spec``'s dtype and shape): a numpy copy, or on
    ``device`` (a CUDA model's) a device array."""
    if device is None:
        return value.copy()
    from .cuda_arrays import DeviceArray  # only for a CUDA model: the driver is already loaded

    arr = DeviceArray(device, tuple(spec.shape), spec.dtype)
    arr.copy_from(np.array(value, order="C"))  # keeps a 0-d value 0-d (ascontiguousarray would not)
    return arr


def initial_state(archive, m) -> dict:
    """name -> the state's initial value (host numpy), checked against its input spec: zeros, or the tensor of
    that name in the verified state file."""
    stored = {}
    if m.state_file is not None and any(s.initial == "file" for s in m.state):
        where = f"{archive.path}: {m.state_file}"
        stored = parse_safetensors(archive.view(m.state_file), where)
    out = {}
    for s in m.state:
        spec = m.inputs[s.input]
        dtype = numpy_dtype(spec.dtype)
        if s.initial == "zeros":
            out[s.name] = np.zeros(tuple(spec.shape), dtype)
            continue
        value = stored.get(s.name)
        if value is None or value.dtype != dtype or tuple(value.shape) != tuple(spec.shape):
            found = "nothing" if value is None else f"{value.dtype}{list(value.shape)}"
            raise FormatError(f"{archive.path}: state {s.name!r} should start from a {spec.dtype}{list(spec.shape)} "
                              f"tensor in {m.state_file}, found {found}; rebuild the package")
        out[s.name] = np.array(value)
    return out
