"""A loaded package as a Python callable: verify, guard, run the native entry point, return outputs.

A Model holds only immutable state after ``load`` (the mapping, weight pointers, the guard plan, the
ctypes function); every call has its own outputs, and each thread its own workspace, context and error buffer
(reused across that thread's calls), and
ctypes releases the GIL during the native call, so threads may call one Model concurrently.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.errors import ArityError, FormatError, RuntimeKernelError, TargetError, TcError
from tcexport.formats.manifest import CPU_ABI_VERSION, Manifest, TensorSpec

from . import native_cpu
from .archive import Archive, open_archive
from .arrays import convert_inputs, convert_outputs
from .dtypes import numpy_dtype
from .guards import GuardPlan
from .weights import load_weights

WORKSPACE_ALIGNMENT = 64
ERROR_BUFFER_BYTES = 4096


def default_num_threads() -> int:
    """CPUs this process may use, capped by OMP_NUM_THREADS; read at load time, not import time."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if omp.isdigit() and int(omp) >= 1:
        n = min(n, int(omp))
    return max(n, 1)


def load(path, device="cpu", *, num_threads: int | None = None, isa: str | None = None, cache_dir=None) -> "Model":
    """Open, verify and load a `.tcpkg` for ``device``; return a callable Model.

    Every member is hashed before native code is loaded. ``isa`` forces a CPU kernel bundle by name;
    ``cache_dir`` is where kernel libraries are extracted (default $TCEXPORT_CACHE or ~/.cache/tcexport).
    """
    if str(device) != "cpu":
        raise TargetError(f"device {str(device)!r}: this package/loader build supports cpu; GPU packages come "
                          f"with --target cuda:sm_XX. Load with device='cpu'.")
    threads = default_num_threads() if num_threads is None else num_threads
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise TcError(f"num_threads should be an integer >= 1, got {num_threads!r}")
    archive = open_archive(path)
    plan = GuardPlan(archive.manifest)
    weights = load_weights(archive)
    native = native_cpu.load(archive, isa=isa, cache_dir=cache_dir, num_threads=threads)
    return Model(archive, plan, weights, native, threads)


class Model:
    """Call with the inputs positionally (manifest order) or by name; returns one output or a tuple."""

    def __init__(self, archive: Archive, plan: GuardPlan, weights: dict[str, np.ndarray],
                 native: native_cpu.NativeLibrary, num_threads: int):
        m = archive.manifest
        self.archive = archive
        self.manifest: Manifest = m
        self.num_threads = num_threads
        self.isa = native.bundle.isa
        self._plan = plan
        self._native = native
        self._input_names = tuple(s.name for s in m.inputs)
        self._symbol_names = tuple(m.symbol_names())
        self._weights = tuple(weights[w.name] for w in m.weights)   # keeps the views (and mapping) alive
        self._weight_ptrs = (ctypes.c_void_p * len(self._weights))(*[w.ctypes.data for w in self._weights])
        self._outputs = tuple((tuple(ex.compile_expr(d) for d in s.shape), numpy_dtype(s.dtype)) for s in m.outputs)
        self._workspace_bytes = ex.compile_expr(m.workspace_bytes)
        self._local = threading.local()  # per-thread ctypes call buffers, reused across calls

    @property
    def path(self) -> pathlib.Path:
        return self.archive.path

    @property
    def inputs(self) -> list[TensorSpec]:
        return list(self.manifest.inputs)

    @property
    def outputs(self) -> list[TensorSpec]:
        return list(self.manifest.outputs)

    @property
    def symbols(self) -> list:
        return list(self.manifest.symbols)

    def __repr__(self) -> str:
        sig = lambda specs: ", ".join(f"{s.name}: {s.dtype}{s.shape_text()}" for s in specs)
        return (f"Model({self.manifest.model!r}, inputs=[{sig(self.manifest.inputs)}], "
                f"outputs=[{sig(self.manifest.outputs)}], isa={self.isa!r})")

    def __call__(self, *args, **kwargs):
        values = self._gather(args, kwargs)
        arrays, as_torch = convert_inputs(values, self._input_names)
        env = self._plan.check(arrays)
        outputs = convert_outputs(self._run(arrays, env), as_torch)
        return outputs[0] if self.manifest.output_structure == "single" else tuple(outputs)

    def _gather(self, args: tuple, kwargs: dict) -> list:
        """Positional then keyword inputs, in manifest order; unknown, repeated or missing names are ArityErrors."""
        names = self._input_names
        if not kwargs and len(args) == len(names):
            return args  # the common call: every input positionally
        if len(args) > len(names):
            raise ArityError(f"model {self.manifest.model!r} takes {len(names)} input(s) ({', '.join(names)}), "
                             f"got {len(args)} positional. Pass exactly these inputs.",
                             expected=len(names), got=len(args), rule="arity")
        values = dict(zip(names, args))
        for key, value in kwargs.items():
            if key not in names:
                raise ArityError(f"model {self.manifest.model!r} has no input named {key!r}; inputs: "
                                 f"{', '.join(names)}.", input=key, expected=list(names), got=key, rule="arity")
            if key in values:
                raise ArityError(f"input {key!r} was passed both positionally and by name; pass it once.",
                                 input=key, rule="arity")
            values[key] = value
        missing = [n for n in names if n not in values]
        if missing:
            raise ArityError(f"model {self.manifest.model!r} is missing input(s) {', '.join(missing)}; it takes "
                             f"{', '.join(names)}.", input=missing[0], expected=list(names),
                             got=sorted(values), rule="arity")
        return [values[n] for n in names]

    def _buffers(self) -> "_CallBuffers":
        buf = getattr(self._local, "buffers", None)
        if buf is None:
            buf = self._local.buffers = _CallBuffers(self)
        return buf

    def _run(self, arrays: list[np.ndarray], env: dict[str, int]) -> list[np.ndarray]:
        outputs = [np.empty(self._shape(shape, env), dtype) for shape, dtype in self._outputs]
        b = self._buffers()
        ws_ptr = b.workspace_for(self._workspace_bytes(env))
        for k, s in enumerate(self._symbol_names):
            b.symbols[k] = env[s]
        for k, a in enumerate(arrays):
            b.inputs[k] = a.ctypes.data
        for k, o in enumerate(outputs):
            b.outputs[k] = o.ctypes.data
        b.error[0] = b"\0"
        rc = self._native.run(b.ctx_ref, b.symbols, b.inputs, self._weight_ptrs, b.outputs, ws_ptr)
        if rc != 0:
            message = b.error.value.decode("utf-8", errors="replace") or "no message"
            raise RuntimeKernelError(f"model {self.manifest.model!r}: kernel library {self._native.bundle.file!r} "
                                     f"failed with code {rc}: {message}")
        return outputs

    def _shape(self, shape: tuple, env: dict[str, int]) -> tuple[int, ...]:
        dims = tuple(d(env) for d in shape)
        if any(d < 0 for d in dims):
            raise FormatError(f"manifest output shape {dims} is negative for {env}; rebuild the package")
        return dims


class _CallBuffers:
    """The ctypes objects one call needs, made once per thread: the context, its error buffer, and the
    pointer arrays. Threads never share them, so concurrent calls stay independent."""

    def __init__(self, model: Model):
        n = lambda k: max(k, 1)
        self.error = ctypes.create_string_buffer(ERROR_BUFFER_BYTES)
        self.ctx = native_cpu.TcContext(CPU_ABI_VERSION, model.num_threads,
                                        (ctypes.c_void_p * native_cpu.MAX_BLAS)(*model._native.blas),
                                        ctypes.addressof(self.error), ERROR_BUFFER_BYTES)
        self.ctx_ref = ctypes.byref(self.ctx)
        self.symbols = (ctypes.c_int64 * n(len(model._symbol_names)))()
        self.inputs = (ctypes.c_void_p * n(len(model._input_names)))()
        self.outputs = (ctypes.c_void_p * n(len(model._outputs)))()
        self.workspace: np.ndarray | None = None
        self.workspace_ptr: int | None = None

    def workspace_for(self, nbytes: int) -> int | None:
        """This thread's scratch buffer, grown when a call needs more (kept: the next call reuses it)."""
        if nbytes <= 0:
            return _workspace(nbytes)[1]  # NULL for none; a negative size raises
        if self.workspace is None or self.workspace.nbytes - WORKSPACE_ALIGNMENT < nbytes:
            self.workspace, self.workspace_ptr = _workspace(nbytes)
        return self.workspace_ptr


def _workspace(nbytes: int) -> tuple[np.ndarray | None, int | None]:
    """A 64-byte-aligned scratch buffer of at least ``nbytes`` (NULL when the plan needs none)."""
    if nbytes < 0:
        raise FormatError(f"manifest workspace_bytes evaluated to {nbytes}; rebuild the package")
    if nbytes == 0:
        return None, None
    buf = np.empty(nbytes + WORKSPACE_ALIGNMENT, np.uint8)
    address = buf.ctypes.data
    return buf, address + (-address) % WORKSPACE_ALIGNMENT
