"""Training packages (``--backward``) built once per test session, and the float64 eager reference they are
checked against."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from packages import EXAMPLES, MODELS, WORK, load_module

MODEL_FILES = {"mlp": EXAMPLES / "mlp.py", "cnn": EXAMPLES / "cnn.py", "decoder": EXAMPLES / "decoder.py",
               "classifier": MODELS / "classifier_loss.py", "dyn_derived": MODELS / "dyn_derived.py",
               "dyn_divisible": MODELS / "dyn_divisible.py"}


@functools.lru_cache(maxsize=None)
def training_package(name: str, *grad_inputs: str, targets: str = "cpu", build_cubins: bool = True) -> Path:
    """``MODEL.py --backward [--grad-inputs ...] [--target ...]`` exported into the session's work dir;
    ``build_cubins=False`` keeps only the Triton source of CUDA targets (for the interpreter)."""
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    tag = targets.replace(":", "_").replace(",", "_") + ("" if build_cubins else "-source")
    file_name = f"{name}-backward-{'-'.join(grad_inputs) or 'params'}-{tag}.tcpkg"
    prebuilt = Path(os.environ.get("TCEXPORT_PREBUILT", "/nonexistent")) / file_name
    if prebuilt.is_file():  # built on another machine (see __main__ below)
        return prebuilt
    path = str(MODEL_FILES[name])
    spec = load_model_file(path)
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, targets, name=name, source_path=path,
                 backward=True, grad_inputs=grad_inputs, build_cubins=build_cubins)
    out = WORK / file_name
    pkg.save(out)
    return out


def module(name: str) -> torch.nn.Module:
    """A fresh eager copy of the model file's module (same seeded weights as the package)."""
    return load_module(MODEL_FILES[name]).model().eval()


def reference_gradients(name: str, inputs: list[np.ndarray], grad_outputs: list[np.ndarray] | None,
                        grad_inputs=()) -> tuple[list[np.ndarray], dict]:
    """Outputs and gradients (parameters by name, then the named inputs) of the model in float64."""
    from tcexport.exporter.front.model_file import forward_input_names

    m = copy.deepcopy(module(name)).double()
    tensors = [torch.from_numpy(x).double() if x.dtype.kind == "f" else torch.from_numpy(x) for x in inputs]
    names = forward_input_names(m, len(inputs))
    for n, t in zip(names, tensors):
        if n in grad_inputs:
            t.requires_grad_(True)
    out = m(*tensors)
    outs = out if isinstance(out, tuple) else (out,)
    if grad_outputs is None:
        outs[0].backward()
    else:
        torch.autograd.backward(outs, [torch.from_numpy(g).double() for g in grad_outputs])
    grads = {k: p.grad.numpy() for k, p in m.named_parameters()}
    grads.update({n: t.grad.numpy() for n, t in zip(names, tensors) if n in grad_inputs})
    return [o.detach().numpy() for o in outs], grads


def assert_gradients_close(got: dict, want: dict) -> None:
    """float32 gradients against a float64 reference: relative to each gradient's own scale (a gradient that
    is zero in exact arithmetic comes out as rounding noise)."""
    assert sorted(got) == sorted(want)
    for name, ref in want.items():
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(got[name], ref, rtol=1e-3, atol=2e-6 * scale, err_msg=name)


def random_inputs(name: str, shape: tuple, seed: int) -> list[np.ndarray]:
    """A model file's input at ``shape``: token ids for the decoder, normal floats otherwise."""
    rng = np.random.default_rng(seed)
    if name == "decoder":
        return [rng.integers(0, 256, shape, dtype=np.int64)]
    return [rng.standard_normal(shape, dtype=np.float32)]


# the short training loop (the classifier model file, whose forward returns its loss), on any backend
LR, STEPS = 0.5, 20


def sgd_batches():
    """20 mini-batches of varying size (the batch is dynamic) from one fixed data set."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 16), dtype=np.float32)
    labels = rng.integers(0, 4, 64).astype(np.int64)
    for step in range(STEPS):
        start = (step % 4) * 16
        b = slice(start, start + 16 - step % 3)
        yield x[b], labels[b]


def torch_loss_curve(m: torch.nn.Module) -> list[float]:
    """The losses of PyTorch's SGD over sgd_batches (training ``m`` in place)."""
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    losses = []
    for x, labels in sgd_batches():
        opt.zero_grad()
        loss = m(torch.from_numpy(x), torch.from_numpy(labels))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# what tests/test_cuda_gpu_training.py loads: ``python tests/training_packages.py DIR cuda:sm_90`` builds them on any
# machine (no GPU needed), for a GPU run with TCEXPORT_PREBUILT=DIR
GPU_TRAINING = [("mlp", "x"), ("cnn",), ("decoder",), ("classifier",)]

if __name__ == "__main__":
    folder = Path(sys.argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    for name, *grad_inputs in GPU_TRAINING:
        built = training_package(name, *grad_inputs, targets=sys.argv[2] if len(sys.argv) > 2 else "cuda:sm_90")
        shutil.copy(built, folder / built.name)
        print(folder / built.name, flush=True)
