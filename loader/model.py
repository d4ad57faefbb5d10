"""A loaded package as a Python callable: verify, guard, run the native entry point, return outputs.

A Model holds only immutable state after ``load`` (the mapping, weight pointers, the guard plan, the
ctypes function), plus a cache of per-shape-signature entries that are immutable once made; every call has its
own outputs, and each thread its own workspace, context, error buffer and pointer arrays (reused across that
thread's calls), and ctypes releases the GIL during the native call, so threads may call one Model concurrently.

A call's Python work is kept to the guards and one call into the library: for numpy inputs of the right dtype
that are already C-contiguous, no conversion runs; a signature seen before reuses its bound symbols (a ctypes
array the library only reads), output shapes and workspace size; pointers are read straight from the arrays.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import threading

import numpy as np

from tcexport.formats import expr as ex
from tcexport.formats.errors import FormatError, RuntimeKernelError, WorkspaceLimitError
from tcexport.formats.manifest import CPU_ABI_VERSION, Manifest, TensorSpec

from .archive import Archive
from .arrays import convert_inputs, convert_outputs
from .call_args import gather
from .dtypes import numpy_dtype
from .guards import GuardPlan, SignatureCache
from .native_cpu import FORK, MAX_BLAS, NativeLibrary, TcContext

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


class Model:
    """Call with the inputs positionally (manifest order) or by name; returns one output or a tuple."""

    def __init__(self, archive: Archive, plan: GuardPlan, weights: dict[str, np.ndarray],
                 native: NativeLibrary, num_threads: int, max_workspace_bytes: int | None = None,
                 manifest: Manifest | None = None):
        m = archive.manifest if manifest is None else manifest  # a method's view (Manifest.method) runs one method
        self.archive = archive
        self.manifest: Manifest = m
        self.num_threads = num_threads
        self.max_workspace_bytes = max_workspace_bytes
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
        self._signatures = SignatureCache(plan, self._signature)
        self._exact_dtypes = plan.exact_dtypes
        self._single = m.output_structure == "single"

    @property
    def path(self) -> pathlib.Path:
        return self.archive.path

    @property
    def methods(self):
        """``forward`` alone, this model: a package without methods (SPEC §2c), so that code calling
        ``m.methods[name]`` runs any package."""
        from .method_table import Methods

        return Methods({"forward": self}, self.manifest.model)

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
        values = args if not kwargs and len(args) == len(self._input_names) else self._gather(args, kwargs)
        if self._plain_numpy(values):
            arrays, as_torch = values, False
        else:
            arrays, as_torch = convert_inputs(values, self._input_names)
        outputs = self._run(arrays, self._signatures.lookup(arrays))
        if as_torch:
            outputs = convert_outputs(outputs, True)
        return outputs[0] if self._single else tuple(outputs)

    def _plain_numpy(self, values) -> bool:
        """True when every input is a numpy array of exactly the expected dtype, C-contiguous and aligned: what
        ``convert_inputs`` would return unchanged, so the call skips it."""
        for v, dtype in zip(values, self._exact_dtypes):
            if type(v) is not np.ndarray or v.dtype is not dtype:
                return False
            flags = v.flags
            if not (flags.c_contiguous and flags.aligned):
                return False
        return True

    def _gather(self, args: tuple, kwargs: dict) -> list:
        return gather(self.manifest.model, self._input_names, args, kwargs)

    def _buffers(self) -> "_CallBuffers":
        buf = getattr(self._local, "buffers", None)
        if buf is None:
            buf = self._local.buffers = _CallBuffers(self)
        return buf

    def _signature(self, env: dict[str, int]) -> "_Signature":
        """What a call with these bound symbols needs besides its arrays (made once per input-shape signature)."""
        outputs = tuple((self._shape(shape, env), dtype) for shape, dtype in self._outputs)
        values = [env[s] for s in self._symbol_names]
        symbols = (ctypes.c_int64 * max(len(values), 1))(*values)
        workspace = self._workspace_bytes(env)
        self._check_workspace(workspace, env)
        return _Signature(env, symbols, outputs, workspace)

    def _check_workspace(self, workspace: int, env: dict) -> None:
        if workspace < 0:
            raise FormatError(f"manifest workspace_bytes evaluated to {workspace} for {env}; rebuild the package")
        limit = self.max_workspace_bytes
        if limit is not None and workspace > limit:
            raise WorkspaceLimitError(
                f"model {self.manifest.model!r}: a call with {env} needs {workspace} bytes of workspace; this model "
                f"was loaded with max_workspace_bytes={limit}. Pass smaller inputs, or load it with a larger "
                f"limit.", expected=limit, got=workspace, rule="max_workspace_bytes")

    def run_arrays(self, arrays: list, preset: dict | None = None) -> list[np.ndarray]:
        """One native call on ``arrays`` (every graph input, in manifest order): guards, then the library; the
        outputs whose index is in ``preset`` are written into the array given there (what a state is written
        into, loader/state.py), the others are new arrays."""
        return self._run(arrays, self._signatures.lookup(arrays), preset)

    def _allocate(self, b: "_CallBuffers", sig: "_Signature", preset: dict | None = None) \
            -> tuple[list[np.ndarray], object]:
        """The call's outputs and workspace; an allocation the machine cannot make is a typed error."""
        try:
            outputs = [np.empty(shape, dtype) if not preset or k not in preset else preset[k]
                       for k, (shape, dtype) in enumerate(sig.outputs)]
            return outputs, b.workspace_for(sig.workspace_bytes)
        except (MemoryError, ValueError) as e:
            raise WorkspaceLimitError(
                f"model {self.manifest.model!r}: cannot allocate the outputs and {sig.workspace_bytes} bytes of "
                f"workspace a call with {sig.env} needs ({type(e).__name__}). Pass smaller inputs.",
                expected=None, got=sig.workspace_bytes, rule="allocation") from None

    def _run(self, arrays: list[np.ndarray], sig: "_Signature", preset: dict | None = None) -> list[np.ndarray]:
        b = self._buffers()
        outputs, ws = self._allocate(b, sig, preset)
        fork = FORK
        if b.threads > 1 and self._native.openmp and (fork.broken or not fork.threads_started):
            b.set_threads(fork.threads(b.threads))
        pointers = b.inputs
        for k, a in enumerate(arrays):
            pointers[k] = data_address(a)
        pointers = b.outputs
        for k, o in enumerate(outputs):
            pointers[k] = data_address(o)
        rc = self._native.run(b.ctx_ref, sig.symbols, b.inputs, self._weight_ptrs, b.outputs, ws)
        if rc != 0:
            raise self._kernel_error(rc, b)
        return outputs

    def _kernel_error(self, rc: int, b: "_CallBuffers") -> RuntimeKernelError:
        """The library's message for a failed call; the buffer is cleared after reading, so the next failure
        never shows this one's text."""
        message = b.error.value.decode("utf-8", errors="replace") or "no message"
        b.error[0] = b"\0"
        return RuntimeKernelError(f"model {self.manifest.model!r}: kernel library {self._native.bundle.file!r} "
                                  f"failed with code {rc}: {message}")

    def _shape(self, shape: tuple, env: dict[str, int]) -> tuple[int, ...]:
        dims = tuple(d(env) for d in shape)
        if any(d < 0 for d in dims):
            raise FormatError(f"manifest output shape {dims} is negative for {env}; rebuild the package")
        return dims


class _Signature:
    """One input-shape signature's bound symbols (``env``, and as the ctypes array the library reads, never
    writes), output shapes and dtypes, and workspace size. Immutable once made, so threads share it."""

    __slots__ = ("env", "symbols", "outputs", "workspace_bytes")

    def __init__(self, env: dict, symbols, outputs: tuple, workspace_bytes: int):
        self.env, self.symbols, self.outputs, self.workspace_bytes = env, symbols, outputs, workspace_bytes


class _CallBuffers:
    """The ctypes objects one call needs, made once per thread: the context, its error buffer, the pointer
    arrays and the workspace. Threads never share them, so concurrent calls stay independent."""

    def __init__(self, model: Model):
        n = lambda k: max(k, 1)
        self.error = ctypes.create_string_buffer(ERROR_BUFFER_BYTES)
        self.ctx = TcContext(CPU_ABI_VERSION, model.num_threads,
                                        (ctypes.c_void_p * MAX_BLAS)(*model._native.blas),
                                        ctypes.addressof(self.error), ERROR_BUFFER_BYTES)
        self.ctx_ref = ctypes.byref(self.ctx)
        self.threads = model.num_threads  # what ctx.num_threads holds (reading a ctypes field costs more)
        self.inputs = (ctypes.c_void_p * n(len(model._input_names)))()
        self.outputs = (ctypes.c_void_p * n(len(model._outputs)))()
        self.workspace: np.ndarray | None = None
        self.workspace_ptr: ctypes.c_void_p | None = None

    def set_threads(self, n: int) -> None:
        self.threads = self.ctx.num_threads = n

    def workspace_for(self, nbytes: int) -> ctypes.c_void_p | None:
        """This thread's scratch buffer, grown when a call needs more (kept: the next call reuses it); None
        (NULL) when the plan needs none. A ctypes object, as ``native_cpu``'s untyped entry point requires."""
        if nbytes == 0:
            return None
        if self.workspace is None or self.workspace.nbytes - WORKSPACE_ALIGNMENT < nbytes:
            self.workspace, self.workspace_ptr = _workspace(nbytes)
        return self.workspace_ptr


def _workspace(nbytes: int) -> tuple[np.ndarray, ctypes.c_void_p]:
    """A 64-byte-aligned scratch buffer of at least ``nbytes`` and its aligned address."""
    buf = np.empty(nbytes + WORKSPACE_ALIGNMENT, np.uint8)
    address = buf.ctypes.data
    return buf, ctypes.c_void_p(address + (-address) % WORKSPACE_ALIGNMENT)


# --- array data pointers --------------------------------------------------------------------------------------

# numpy's PyArrayObject (ndarraytypes.h, PyArrayObject_fields) starts with the object header, then ``char *data``;
# reading that field costs ~0.15 us where ``a.ctypes.data`` costs ~0.8 us (it builds a helper object per call).
_DATA_OFFSET = object.__basicsize__
_read_pointer = ctypes.c_void_p.from_address


def _data_field(a: np.ndarray) -> int:
    return _read_pointer(id(a) + _DATA_OFFSET).value or 0


def _ctypes_data(a: np.ndarray) -> int:
    return a.ctypes.data


def _layout_matches() -> bool:
    """The header-offset read agrees with numpy's own answer on arrays of several kinds (fresh, an offset
    view, read-only, 0-d); if this numpy or interpreter lays arrays out differently, use ``a.ctypes.data``."""
    base = np.arange(24, dtype=np.float64)
    readonly = np.frombuffer(bytes(16), np.uint8)
    probes = [base, base[5:], base.reshape(2, 12)[1], readonly, np.array(3.0), np.empty((0, 4), np.float32)]
    try:
        return all(_data_field(p) == p.ctypes.data for p in probes)
    except (OSError, ValueError, OverflowError):
        return False


data_address = _data_field if _layout_matches() else _ctypes_data
