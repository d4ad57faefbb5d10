"""Hand-built manifests, packages and a tiny real C kernel library for the format and loader tests.

No compiler of ours is involved: the kernel below is a few lines of C implementing C ABI 1
(y = x + w, broadcast over the rows), built with the system's gcc.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import save as st_save

from tcexport.formats.manifest import FORMAT_VERSION, KernelBundle, Manifest, Symbol, TensorSpec
from tcexport.packager.archive import write_archive

KERNEL_FILE = "kernels/cpu-x86-64.so"

ADD_KERNEL_C = r"""
#include <stdint.h>
#include <stdio.h>
typedef struct { int32_t abi_version; int32_t num_threads; void* blas[8]; char* error; int64_t error_size; } tc_context;
int32_t tc_abi_version(void) { return ABI; }
int32_t tc_run(const tc_context* ctx, const int64_t* symbols, void* const* inputs, void* const* weights,
               void* const* outputs, void* workspace) {
  int64_t batch = symbols[0];
  if (ctx->abi_version != 1 || ctx->num_threads < 1) { snprintf(ctx->error, ctx->error_size, "bad context"); return 2; }
  if (batch == 13) { snprintf(ctx->error, ctx->error_size, "unlucky batch %lld", (long long)batch); return 7; }
  if (((uintptr_t)workspace) % 64 != 0) { snprintf(ctx->error, ctx->error_size, "workspace misaligned"); return 3; }
  float* ws = (float*)workspace;
  const float* x = (const float*)inputs[0]; const float* w = (const float*)weights[0]; float* y = (float*)outputs[0];
  for (int64_t i = 0; i < batch; i++)
    for (int64_t j = 0; j < 4; j++) { ws[j] = x[i * 4 + j] + w[j]; y[i * 4 + j] = ws[j]; }
  return 0;
}
"""


def compile_kernel(tmp_path: pathlib.Path, abi: int = 1) -> bytes:
    """Build the add kernel with gcc; skip the test where there is no C compiler."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the test kernel")
    src, lib = tmp_path / "add.c", tmp_path / f"add{abi}.so"
    src.write_text(ADD_KERNEL_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", f"-DABI={abi}", "-o", str(lib), str(src)], check=True)
    return lib.read_bytes()


def spec(name, dtype, shape) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape))


def make_manifest(**overrides) -> Manifest:
    """A valid manifest for the add kernel: x float32[batch, 4] + w float32[4] -> y float32[batch, 4]."""
    fields = dict(
        format_version=FORMAT_VERSION, producer={"tcexport": "0.1.0"}, model="add",
        symbols=(Symbol("batch", 1, 64),),
        inputs=(spec("x", "float32", ["batch", 4]),), outputs=(spec("y", "float32", ["batch", 4]),),
        output_structure="single", guards=(), weights_file="weights.safetensors",
        weights=(spec("w", "float32", [4]),),
        kernels=(KernelBundle("cpu", "x86-64", (), KERNEL_FILE, 1, "tc_run", (), ()),),
        workspace_bytes=["*", 16, "batch"], plan={"kernels": ["add"]}, sources=("src/add.c",))
    fields.update(overrides)
    return Manifest(**fields)


WEIGHTS = {"w": np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)}


def default_members(kernel: bytes = b"\x7fELF not a real library") -> dict[str, bytes]:
    return {"weights.safetensors": st_save(WEIGHTS), KERNEL_FILE: kernel, "src/add.c": ADD_KERNEL_C.encode()}


def build_package(path: pathlib.Path, manifest: Manifest | None = None, members: dict | None = None) -> pathlib.Path:
    return write_archive(path, manifest or make_manifest(), members if members is not None else default_members())
