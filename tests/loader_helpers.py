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

from tcexport.formats import attestation as att
from tcexport.formats.abi import Interface, descriptor
from tcexport.formats.container import write_package
from tcexport.formats.graphs import CpuPart, Graph
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


def descriptor_c(manifest: Manifest | None = None, blas: tuple = (), isa: str = "x86-64") -> str:
    """``tc_abi_descriptor`` in C for ``manifest`` (default: ``make_manifest()``): the interface every format 1.7
    library carries (formats/abi.py), as the exporter compiles it in."""
    text = descriptor(Interface.of_manifest(manifest or make_manifest(), blas), isa).decode()
    literal = text.replace("\\", "\\\\").replace('"', '\\"')
    return (f'const char* tc_abi_descriptor(int64_t* size) {{ static const char t[] = "{literal}"; '
            f'*size = (int64_t)(sizeof(t) - 1); return t; }}\n')


def compile_c(tmp_path: pathlib.Path, source: str, name: str, *flags: str) -> bytes:
    """Build a C source into a shared library with gcc; skip the test where there is no C compiler."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler to build the test kernel")
    src, lib = tmp_path / f"{name}.c", tmp_path / f"{name}.so"
    src.write_text(source)
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", *flags, "-o", str(lib), str(src)], check=True)
    return lib.read_bytes()


def compile_kernel(tmp_path: pathlib.Path, abi: int = 1, manifest: Manifest | None = None,
                   descriptor: bool = True) -> bytes:
    """Build the add kernel (with the interface descriptor of ``manifest``, default ``make_manifest()``)."""
    source = ADD_KERNEL_C + (descriptor_c(manifest) if descriptor else "")
    return compile_c(tmp_path, source, f"add{abi}{'' if descriptor else '-bare'}", f"-DABI={abi}")


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
        plan={"kernels": ["add"]}, sources=("src/add.c",))
    workspace = overrides.pop("workspace_bytes", ["*", 16, "batch"])
    fields.update(overrides)
    if "graphs" not in fields:  # the add kernel's tc_run as the inference graph
        fields["graphs"] = {"inference": Graph("inference", fields["inputs"], fields["outputs"],
                                               CpuPart("tc_run", workspace, ("add",)))}
    fields["plan"] = {**fields["plan"], "workspace_bytes": workspace}
    return Manifest(**fields)


WEIGHTS = {"w": np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)}


def default_members(kernel: bytes = b"\x7fELF not a real library") -> dict[str, bytes]:
    return {"weights.safetensors": st_save(WEIGHTS), KERNEL_FILE: kernel, "src/add.c": ADD_KERNEL_C.encode()}


def build_package(path: pathlib.Path, manifest: Manifest | None = None, members: dict | None = None) -> pathlib.Path:
    return write_archive(path, manifest or make_manifest(), members if members is not None else default_members())


def read_entries(path: pathlib.Path) -> list[tuple[str, bytes]]:
    """(name, bytes) of every member, in file order, read with zipfile (no checks: tests alter them)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def read_comment(path: pathlib.Path) -> bytes:
    """The archive comment: the attestation."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        return z.comment


def rewrite(path: pathlib.Path, out: pathlib.Path, edit=None, rehash: bool = True,
            members: dict | None = None) -> pathlib.Path:
    """The package at ``path`` with its manifest JSON edited by ``edit(dict)`` and/or members replaced
    (``members``: name -> bytes), written canonically to ``out``. ``rehash`` recomputes every member's entry in
    manifest.members and the package digest, as an attacker who edits the manifest would; without it the
    original attestation is kept."""
    import hashlib
    import json

    entries = dict(read_entries(path))
    manifest = json.loads(entries.pop("manifest.json"))
    attestation = read_comment(path) or None
    entries.update(members or {})
    if edit is not None:
        edit(manifest)
    if rehash:
        manifest["members"] = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)}
                               for n, d in sorted(entries.items())}
    manifest_bytes = (json.dumps(manifest, sort_keys=True, indent=1) + "\n").encode()
    if rehash or attestation is None:
        attestation = att.unsigned(manifest_bytes, tuple(manifest["format_version"])).to_bytes()
    return write_package(out, manifest_bytes, attestation, sorted(entries.items()))


def as_1_7(d: dict) -> dict:
    """A 1.8 manifest's JSON as the 1.7 manifest of the same package: the training graphs in a ``training`` section
    (their CUDA parts without what 1.8 added: ``triton``, ``kernels``), no ``graphs``."""
    import copy

    d = copy.deepcopy(d)
    graphs = d.pop("graphs")
    trainable = d["weights"].pop("trainable", [])
    if "forward" not in graphs:
        d["format_version"] = [1, 7]
        return d

    def graph(g: dict, *keys: str) -> dict:
        out = {"entry": g["cpu"]["entry"], "workspace_bytes": g["cpu"]["workspace_bytes"],
               "kernels": g["cpu"]["kernels"]} if "cpu" in g else {}
        out |= {k: g[k] for k in keys}
        if "cuda" in g:
            out["cuda"] = {k: v for k, v in g["cuda"].items() if k not in ("triton", "kernels")}
        return out

    d["training"] = {"trainable": trainable, "forward": graph(graphs["forward"], "outputs"),
                     "backward": graph(graphs["backward"], "inputs", "outputs")}
    d["format_version"] = [1, 7]
    return d

