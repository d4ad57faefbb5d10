"""A graph's CUDA part of the manifest (formats/graphs.CudaPart, SPEC §2a): its launch list (each buffer parameter
resolved to an input, weight, output or workspace offset), its cubins as archive members per arch, and the GPU's
own kernel list; and the CUDA bundles, one per arch."""

from __future__ import annotations

from tcexport.formats.graphs import CudaPart
from tcexport.formats.manifest import CUDA_ABI_VERSION, Cubin, KernelBundle, Launch

from tcexport.exporter.cuda.build import triton_version

from . import members as names
from .exprs import to_expr


def cuda_part(g, members: dict, source: str, folder: str, tuning=None) -> CudaPart:
    """Graph ``g``'s CUDA part: its launches (shared by every arch), its cubins per arch (added to ``members``
    under ``kernels/cuda-sm_XX/<folder>``), its Triton source member ``source`` and the GPU's own kernel list
    (``g.cuda.kernels``)."""
    launches, workspace = cuda_launches(g)
    cubins = {f"sm_{arch}": files for arch, files in cubin_members(g, members, folder).items()}
    return CudaPart(source, triton_version(), g.cuda.module.index_bits, workspace, launches, cubins,
                    tuple(k.name for k in g.cuda.kernels), tuning)


def cuda_bundles(part: CudaPart) -> list[KernelBundle]:
    """One CUDA bundle per arch the inference graph has cubins for (its cubins are the graph's)."""
    return [KernelBundle(target=f"cuda:{isa}", isa=isa, requires=(), file=names.TRITON_SOURCE,
                         abi=CUDA_ABI_VERSION, entry="", libraries=("libcuda.so.1",), blas=())
            for isa in part.cubins]


def cuda_launches(g) -> tuple[tuple, object]:
    """A graph's launch list in manifest form: each buffer parameter as the input, weight or output it is, or as
    a temp at its offset in the GPU's own memory plan; and that plan's arena size."""
    prog, cuda = g.program, g.cuda
    where = {name: ("input", k) for k, name in enumerate(prog.inputs)}
    where |= {name: ("weight", k) for k, name in enumerate(prog.weights)}
    where |= {name: ("output", k) for k, name in enumerate(prog.outputs)}
    launches = []
    for launch in cuda.module.launches:
        params = []
        for kind, value in launch.params:
            param = {"kind": kind, "value": value if kind != "error" else 0}
            if kind == "buffer":
                kind, index = where.get(value) or ("temp", to_expr(cuda.memory.offsets[value]))
                param = {"kind": kind, "value": index}
                if kind == "temp":
                    param["dtype"] = prog.buffers[value].dtype
            params.append(param)
        launches.append(Launch(launch.name, tuple(params), tuple(to_expr(g) for g in launch.grid),
                               dict(launch.constexprs), launch.num_warps, launch.num_stages, launch.index_bits))
    return tuple(launches), to_expr(cuda.memory.workspace_bytes)


def cubin_members(g, members: dict, folder: str) -> dict[int, tuple]:
    """Each arch's cubins, in launch order, added to ``members`` as ``kernels/cuda-sm_XX/<folder><kernel>.cubin``."""
    out = {}
    for arch, cubins in g.cuda.cubins.items():
        files = []
        for c in cubins:
            path = names.cubin(arch, folder, c.kernel)
            members[path] = c.data
            files.append(Cubin(c.kernel, path, c.function, c.shared, c.num_warps, c.dependent, c.global_scratch))
        out[arch] = tuple(files)
    return out
