"""Run a CUDA package's Triton kernels on the CPU, in Triton's interpreter (``TRITON_INTERPRET=1``).

It follows the package exactly as the CUDA loader does: the generated source and the launch list from the
manifest, guards and symbol binding from the loader, temps at their planned offsets in one workspace, grids
evaluated from their expressions, the error word checked after the last kernel. Tests use it to check every
generated kernel without a GPU; users can use it to debug a GPU package on a laptop (slowly). A ``--backward``
package's training entry points run the same way (``InterpretedPackage.train``, ``run_training_interpreted``):
the training forward's launches, then the backward's over the forward's inputs, outputs and saved activations.

libdevice calls have no interpreter implementation, so while interpreting, the module's ``libdevice`` is
replaced by numpy versions of the same functions; everything else is the source the cubins were built from.

Triton decides at import time whether its own library functions are interpreted, so the interpreter needs a
process in which ``TRITON_INTERPRET=1`` was set before triton was imported: ``run_interpreted`` starts one
(``python -m tcexport.exporter.check.interpret``) and passes arrays through .npy files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

from tcexport.formats import expr as ex
from tcexport.formats.errors import RuntimeKernelError
from tcexport.formats.dtypes import DTYPE_INFO
from tcexport.loader.archive import open_archive
from tcexport.loader.guards import GuardPlan
from tcexport.loader.launch_params import LaunchBuffers, bind_params, launch_grid
from tcexport.loader.weights import load_weights

# the multiprocessor count launch grids see here: fewer programs than a persistent GEMM has tiles in the tests,
# so each program walks several
INTERPRET_SM_COUNT = 3
TORCH = {name: getattr(torch, name) for name in DTYPE_INFO}  # the format's dtype names are torch's


class _NumpyLibdevice:
    """The libdevice functions generated kernels call, over the interpreter's numpy-backed tensors."""

    _UNARY = {"tanh": np.tanh, "tan": np.tan, "atan": np.arctan, "log1p": np.log1p, "expm1": np.expm1,
              "trunc": np.trunc, "nearbyint": np.rint}
    _BINARY = {"pow": np.power, "fmod": np.fmod, "atan2": np.arctan2}

    def __getattr__(self, name):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        def wrap(data, like):
            data = np.asarray(data).astype(like.handle.data.dtype)
            ty = like.type if data.shape == like.handle.data.shape else tl.block_type(like.dtype, list(data.shape))
            return tl.core.tensor(TensorHandle(data, like.dtype.scalar), ty)

        def raw(x):
            return x.handle.data if hasattr(x, "handle") else np.asarray(x)

        if name in self._UNARY:
            return lambda x, **_: wrap(self._UNARY[name](raw(x)), x)
        if name in self._BINARY:
            return lambda a, b, **_: wrap(self._BINARY[name](raw(a), raw(b)), a if hasattr(a, "handle") else b)
        raise AttributeError(f"libdevice.{name} has no interpreter version in tcexport")


@contextmanager
def _interpreting():
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    knob = triton.knobs.runtime.interpret if hasattr(triton.knobs, "runtime") else None
    if knob is not None:
        triton.knobs.runtime.interpret = True
    try:
        yield
    finally:
        if knob is not None:
            triton.knobs.runtime.interpret = knob
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _patch_bf16_dot() -> None:
    """The interpreter multiplies bfloat16 dot operands as their raw uint16 bits (Triton 3.9); widen them to
    float32 first, which is what the GPU's bf16 MMA computes with float32 accumulation."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_tcexport", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        import triton.language as tl

        def widen(h):
            if h.dtype == tl.bfloat16:
                return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
            return h

        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._tcexport = True
    builder.create_dot = create_dot


def _patch_scalar_index() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with ``int(data)`` on its one-element array,
    which numpy 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"): every
    ``range(tl.cdiv(K, BK))`` in a generated kernel failed there. Triton 3.9 squeezes first; do the same on
    older versions. Only this interpreter process is touched."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "_tcexport", False):
        return

    def patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(())))

    patch_lang_tensor._tcexport = True
    interpreter._patch_lang_tensor = patch_lang_tensor


def load_module(source: str):
    """Import generated Triton source in interpreter mode, with numpy libdevice."""
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("the Triton interpreter needs TRITON_INTERPRET=1 before triton is imported; "
                           "use run_interpreted(), which starts such a process")
    with _interpreting():
        folder = Path(tempfile.mkdtemp(prefix="tcexport-interpret-"))
        path = folder / "tcexport_interpreted.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"tcexport_interpreted_{id(path)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        _patch_bf16_dot()
        _patch_scalar_index()
    module.libdevice = _NumpyLibdevice()
    return module


class InterpretedPackage:
    """A CUDA package run by the interpreter: ``run(*numpy_arrays)`` returns numpy outputs. ``method``: one method of
    a package with methods (SPEC §2c), its state as plain inputs and outputs."""

    def __init__(self, path, method: str | None = None):
        self.archive = open_archive(path)
        self.manifest = m = self.archive.manifest if method is None else self.archive.manifest.method(method)
        if m.cuda is None:
            raise ValueError(f"{path}: the package has no CUDA kernels (export with --target cuda:sm_XX)")
        source = m.cuda.source or next(f for f in m.sources if f.endswith("_triton.py"))
        self.module = load_module(self.archive.read(source).decode())
        self.guards = GuardPlan(m)
        arrays = load_weights(self.archive, m)
        self.weights = [_tensor(arrays[w.name], w.dtype) for w in m.weights]
        self._modules: dict = {}  # training graph name -> its interpreted module, imported on first use

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        m = self.manifest
        env = self.guards.check(list(inputs))
        ins = [_tensor(np.ascontiguousarray(x), spec.dtype) for x, spec in zip(inputs, m.inputs)]
        outs = self._launch(self.module, m.cuda.launches, m.cuda.workspace_bytes, ins, m.outputs, env)
        return [_numpy(o) for o in outs]

    def train(self, inputs: list[np.ndarray], grad_outputs: list | None = None) -> tuple[list, dict]:
        """The training forward, then the backward (SPEC §6b), as the CUDA loader runs them: returns the
        forward's outputs (the model's, then the saved activations) and the gradients by name.
        ``grad_outputs`` has one array (or None) per model output; None means 1 for each scalar output."""
        m, t = self.manifest, self.manifest.training
        if t is None or t.forward.cuda is None:
            raise ValueError(f"{self.archive.path}: the package has no CUDA training kernels (export with "
                             f"--backward and a cuda target)")
        env = self.guards.check(list(inputs))
        ins = [_tensor(np.ascontiguousarray(x), spec.dtype) for x, spec in zip(inputs, m.inputs)]
        fw = self._launch(self._training_module(t.forward), t.forward.cuda.launches, t.forward.cuda.workspace_bytes,
                          ins, t.forward.outputs, env)
        if grad_outputs is None:
            grad_outputs = [np.ones((), _numpy(o).dtype) if o.dim() == 0 else None for o in fw[:len(m.outputs)]]
        grads = [None if g is None else _tensor(np.ascontiguousarray(g), spec.dtype)
                 for g, spec in zip(grad_outputs, m.outputs)]
        sources = {"input": ins, "forward": fw, "grad": grads}
        bw_ins = [sources[kind][k] for kind, k in t.sources]
        bw = self._launch(self._training_module(t.backward), t.backward.cuda.launches,
                          t.backward.cuda.workspace_bytes, bw_ins, t.backward.outputs, env)
        return [_numpy(o) for o in fw], {s.name: _numpy(o) for s, o in zip(t.backward.outputs, bw)}

    def _training_module(self, graph):
        if graph.name not in self._modules:
            self._modules[graph.name] = load_module(self.archive.read(graph.cuda.source).decode())
        return self._modules[graph.name]

    def _launch(self, module, launches, workspace_bytes, ins: list, out_specs, env: dict) -> list:
        """Run ``launches`` of ``module`` over these inputs; returns fresh outputs shaped by ``out_specs``."""
        outs = [torch.empty([ex.evaluate(d, env) for d in spec.shape], dtype=TORCH[spec.dtype])
                for spec in out_specs]
        for o in outs:  # poison, so an element no kernel writes shows up
            o.fill_(float("nan") if o.dtype.is_floating_point else -7 if o.dtype != torch.bool else True)
        workspace = torch.zeros(max(ex.evaluate(workspace_bytes, env), 64) + 64, dtype=torch.uint8)
        error = torch.zeros(1, dtype=torch.int32)
        with _interpreting():
            buffers = LaunchBuffers(ins, self.weights, outs, error, lambda offset, dtype: _temp(workspace, offset, dtype))
            for launch in launches:
                args = [value for _, value in bind_params(launch.params, env, buffers)]
                grid = launch_grid(launch.name, launch.grid, env, INTERPRET_SM_COUNT)
                if min(grid) == 0:
                    continue
                getattr(module, launch.name)[grid](*args, **launch.block)
        if int(error[0]):
            bad = launches[int(error[0]) - 1].name
            raise RuntimeKernelError(f"kernel {bad}: an index read from a tensor is out of range (negative, or not "
                                     "below the size of the dim it indexes). Check the index inputs, e.g. token "
                                     "ids against the vocabulary size.")
        return outs


def _tensor(a: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).clone()
    return torch.from_numpy(np.array(a, copy=True))


def _numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        from tcexport.loader.dtypes import numpy_dtype
        return t.view(torch.int16).numpy().view(np.uint16).astype(numpy_dtype("bfloat16"))
    return t.numpy()


def _temp(workspace: torch.Tensor, offset: int, dtype: str) -> torch.Tensor:
    """A temp parameter: the arena from ``offset`` on, as ``dtype``."""
    return workspace[offset:].view(TORCH[dtype]) if dtype != "bool" else workspace[offset:].view(torch.bool)


def run_interpreted(path, cases: list[list[np.ndarray]], timeout: float = 900,
                    method: str | None = None) -> list[list[np.ndarray]]:
    """Run ``path`` in the interpreter on each case (a list of input arrays), in a fresh process; returns the
    outputs per case. A kernel's out-of-range index comes back as RuntimeKernelError, a guard failure as
    the loader's typed error (by class name). ``method``: run that method of a package with methods."""
    with tempfile.TemporaryDirectory(prefix="tcexport-interpret-") as tmp:
        folder = Path(tmp)
        for c, inputs in enumerate(cases):
            for k, x in enumerate(inputs):
                np.save(folder / f"case{c}_in{k}.npy", x)
        _run_process(path, folder, len(cases), "run" if method is None else f"run:{method}", timeout)
        m = open_archive(path).manifest
        dtypes = [spec.dtype for spec in (m if method is None else m.method(method)).outputs]
        return [_load_arrays(folder, f"case{c}_out", dtypes) for c in range(len(cases))]


def run_training_interpreted(path, cases: list, timeout: float = 900) -> list[tuple[list, dict]]:
    """``InterpretedPackage.train`` on each case ``(inputs, grad_outputs or None)`` in a fresh process; returns
    per case the training forward's outputs and the gradients by name. Errors come back as in run_interpreted."""
    with tempfile.TemporaryDirectory(prefix="tcexport-interpret-") as tmp:
        folder = Path(tmp)
        for c, (inputs, grads) in enumerate(cases):
            for k, x in enumerate(inputs):
                np.save(folder / f"case{c}_in{k}.npy", x)
            for k, g in enumerate(grads or []):
                if g is not None:
                    np.save(folder / f"case{c}_grad{k}.npy", g)
        _run_process(path, folder, len(cases), "train", timeout)
        t = open_archive(path).manifest.training
        out = []
        for c in range(len(cases)):
            grads = _load_arrays(folder, f"case{c}_bw", [s.dtype for s in t.backward.outputs])
            out.append((_load_arrays(folder, f"case{c}_out", [s.dtype for s in t.forward.outputs]),
                        {s.name: g for s, g in zip(t.backward.outputs, grads)}))
        return out


def _run_process(path, folder: Path, n_cases: int, mode: str, timeout: float) -> None:
    from tcexport.formats import errors as E

    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "tcexport.exporter.check.interpret", str(path), str(folder),
                           str(n_cases), mode], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0:
        err = folder / "error.json"
        if err.is_file():
            info = json.loads(err.read_text())
            raise getattr(E, info["type"], E.TcError)(info["message"])
        raise RuntimeError(f"interpreter process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def _load_arrays(folder: Path, prefix: str, dtypes: list) -> list[np.ndarray]:
    n = len(list(folder.glob(f"{prefix}*.npy")))
    return [_retag(np.load(folder / f"{prefix}{k}.npy"), dtypes[k]) for k in range(n)]


def _retag(a: np.ndarray, dtype: str) -> np.ndarray:
    """.npy files drop the loader's bfloat16 tag on uint16 bits; put it back for a bfloat16 input."""
    from tcexport.loader.dtypes import numpy_dtype

    return a.view(numpy_dtype("bfloat16")) if dtype == "bfloat16" and a.dtype == np.uint16 else a


def _main(argv: list[str]) -> int:
    from tcexport.formats.errors import TcError

    path, folder, n_cases = argv[0], Path(argv[1]), int(argv[2])
    mode = argv[3] if len(argv) > 3 else "run"
    try:
        mode, _, method = mode.partition(":")
        pkg = InterpretedPackage(path, method or None)
        m = pkg.manifest
        for c in range(n_cases):
            inputs = [_retag(np.load(folder / f"case{c}_in{k}.npy"), spec.dtype) for k, spec in enumerate(m.inputs)]
            if mode == "run":
                for k, o in enumerate(pkg.run(*inputs)):
                    np.save(folder / f"case{c}_out{k}.npy", o)
                continue
            files = [folder / f"case{c}_grad{k}.npy" for k in range(len(m.outputs))]
            given = [_retag(np.load(f), spec.dtype) if f.is_file() else None for f, spec in zip(files, m.outputs)]
            outs, grads = pkg.train(inputs, given if any(g is not None for g in given) else None)
            for k, o in enumerate(outs):
                np.save(folder / f"case{c}_out{k}.npy", o)
            for k, g in enumerate(grads.values()):
                np.save(folder / f"case{c}_bw{k}.npy", g)
    except TcError as e:
        (folder / "error.json").write_text(json.dumps({"type": type(e).__name__, "message": str(e)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
