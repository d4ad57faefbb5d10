"""The trust rules on a real GPU (skipped where there is none, as in CI): a launch list edited against its cubins is
refused before any launch, a model survives its file being truncated or rewritten, a forked child gets a typed
error instead of a dead context, and max_workspace_bytes refuses a call before anything is allocated."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

import tcexport.loader as L  # noqa: E402
from tcexport.formats.errors import FormatError, WorkspaceLimitError  # noqa: E402
from loader_helpers import rewrite  # noqa: E402
from test_cuda_gpu import ARCH, package  # noqa: E402

pytestmark = pytest.mark.gpu


def _each_view(edit):
    """Apply ``edit(launches, this GPU's cubins)`` to the inference graph (1.8) and to the copy kept for older
    readers (``cuda``, the bundle's ``cubins``; SPEC §8) alike, so the edit meets the launch checks."""
    def change(m):
        graph = m["graphs"]["inference"]["cuda"]
        edit(graph["launches"], graph["cubins"][ARCH])
        edit(m["cuda"]["launches"], next(k for k in m["kernels"] if k["target"] == f"cuda:{ARCH}")["cubins"])
    return change


EDITS = {
    "a parameter added": _each_view(lambda l, c: l[0]["params"].append({"kind": "symbol", "value": "batch"})),
    "another block size": _each_view(lambda l, c: c[0].update(num_warps=8)),
    "cubins swapped": _each_view(lambda l, c: c[0].update(file=c[1]["file"])),
    "too much shared memory": _each_view(lambda l, c: c[0].update(shared=400 * 1024)),
}


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_edited_launch_list_is_refused_before_any_launch(tmp_path, edit):
    edited = rewrite(package("mlp"), tmp_path / "e.tcpkg", EDITS[edit])
    with pytest.raises(FormatError):
        L.load(edited, device="cuda")


def test_model_survives_its_file_changing(tmp_path):
    path = tmp_path / "mlp.tcpkg"
    path.write_bytes(package("mlp").read_bytes())
    model = L.load(path, device="cuda")
    x = torch.randn(9, 64, device="cuda")
    before = model(x).clone()
    os.truncate(path, 0)
    path.write_bytes(b"something else")
    torch.testing.assert_close(model(x), before, rtol=0, atol=0)


def test_fork_child_gets_a_typed_error():
    code = f"""
import os, torch, tcexport.loader as L
from tcexport.loader.native_cuda import CudaError
m = L.load({str(package('mlp'))!r}, device="cuda")
m(torch.ones(2, 64, device="cuda"))
pid = os.fork()
if pid == 0:
    try:
        m(torch.ones(2, 64).numpy())
        os._exit(1)
    except CudaError as e:
        os._exit(0 if "fork" in str(e) else 2)
    except BaseException:
        os._exit(3)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", (r.stdout, r.stderr[-2000:])


def test_max_workspace_bytes_on_the_gpu():
    model = L.load(package("decoder"), device="cuda", max_workspace_bytes=1)
    with pytest.raises(WorkspaceLimitError, match="max_workspace_bytes=1"):
        model(torch.zeros(16, 128, dtype=torch.int64, device="cuda"))


def test_numpy_inputs_still_match():
    model = L.load(package("mlp"), device="cuda")
    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    cpu = L.load(package("mlp")) if any(k.target == "cpu" for k in model.manifest.kernels) else None
    y = model(x)
    assert y.shape == (5, 32) and np.all(np.isfinite(y))
    if cpu is not None:
        np.testing.assert_allclose(y, cpu(x), rtol=1e-3, atol=1e-5)
