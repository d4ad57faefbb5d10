"""The CUDA loader's launch list is checked against what the cubins declare, before a cubin reaches the driver:
parameter count and widths, block size, entry function, arch, shared memory. Runs without a GPU (formats/cubin.py
reads the ELF); tests/test_cuda_gpu.py and the GPU trust script run the same on a real device."""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("triton")

from loader_helpers import rewrite  # noqa: E402
from packages import EXAMPLES, WORK  # noqa: E402
from tcexport.formats.cubin import kernel_info  # noqa: E402
from tcexport.formats.errors import FormatError  # noqa: E402
from tcexport.loader.archive import open_archive  # noqa: E402
from tcexport.loader.cuda_model import checked_cubins  # noqa: E402

pytestmark = pytest.mark.slow
H200_SHARED = 227 * 1024


@functools.lru_cache(maxsize=None)
def cuda_package():
    from tcexport.exporter.front.model_file import load_model_file
    from tcexport.exporter.pipeline import export

    spec = load_model_file(str(EXAMPLES / "mlp.py"))
    pkg = export(spec.module, spec.example_inputs, spec.dynamic_shapes, "cuda:sm_80,sm_90", name="mlp",
                 cache_dir=WORK / "cache")
    return pkg.save(WORK / "mlp-cuda-trust.tcpkg")


def _check(path):
    archive = open_archive(path)
    m = archive.manifest
    for bundle in m.kernels:
        checked_cubins(archive, bundle, m.cuda.launches, m.cubins(bundle.isa), H200_SHARED)
    return archive


def test_unaltered_cubins_pass_and_describe_their_kernels():
    archive = _check(cuda_package())
    bundle = archive.manifest.kernels[-1]
    launch, cubin = archive.manifest.cuda.launches[0], archive.manifest.cubins(bundle.isa)[0]
    info = kernel_info(archive.read(cubin.file), cubin.function)
    assert info.block == (cubin.num_warps * 32, 1, 1) and len(info.param_sizes) == len(launch.params) + 2


def _each_view(edit):
    """Apply ``edit(launches, cubins by isa)`` to the inference graph (1.8) and to the copy kept for older readers
    (``cuda``, ``kernels[].cubins``; SPEC §8) alike, so the edit meets the cubin checks, not the copy check."""
    def change(m):
        graph = m["graphs"]["inference"]["cuda"]
        edit(graph["launches"], graph["cubins"])
        edit(m["cuda"]["launches"], {k["isa"]: k["cubins"] for k in m["kernels"] if "cubins" in k})
    return change


EDITS = {
    "a parameter added": (_each_view(lambda l, c: l[0]["params"].append({"kind": "symbol", "value": "batch"})),
                          "passes .* parameters"),
    "a pointer dropped": (_each_view(lambda l, c: l[0]["params"].pop(0)), "passes .* parameters"),
    "64-bit symbols": (_each_view(lambda l, c: l[0].update(index_bits=64)), "passes .* parameters"),
    "another block size": (_each_view(lambda l, c: c["sm_90"][0].update(num_warps=8)), "requires a block of"),
    "cubins swapped": (_each_view(lambda l, c: _swap(c["sm_90"], "file")), "has no kernel function"),
    "another function": (_each_view(lambda l, c: c["sm_90"][0].update(function="abort")), "has no kernel function"),
    "another arch's cubin": (_each_view(lambda l, c: c["sm_90"][0].update(file=c["sm_80"][0]["file"])),
                             "is for sm_80"),
    "too much shared memory": (_each_view(lambda l, c: c["sm_90"][0].update(shared=H200_SHARED + 1024)),
                               "shared memory"),
    "only the copy for older readers": (lambda m: m["cuda"]["launches"][0].update(index_bits=64),
                                        "kept for loaders before 1.8, disagrees with graphs.inference"),
}


def _swap(cubins, key):
    """Swap the first cubin's ``key`` with that of the first cubin of another entry function (a band's tiles of
    one GEMM share its function: their cubins differ in constants no ABI check can see)."""
    j = next(j for j, c in enumerate(cubins) if c["function"] != cubins[0]["function"])
    cubins[0][key], cubins[j][key] = cubins[j][key], cubins[0][key]


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_rehashed_launch_edits_are_refused(tmp_path, edit):
    change, message = EDITS[edit]
    edited = rewrite(cuda_package(), tmp_path / "e.tcpkg", change)
    with pytest.raises(FormatError, match=message):
        _check(edited)
